"""The joint schema head: final hidden states + lm_head rows → one logit per option.

Parameter names and shapes follow Clef's released ``joint_head.safetensors`` so a release loads
with ``strict=True``. The forward pass takes many records at once (one step of a serving engine):
span means, projections and scoring run over all options of all records together; only the two
attention stacks see padded [records, items, width] views, built per group of records of similar
prompt length so padding stays small.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from clef_head.layout import RecordLayout

MAX_LOG_SCALE = math.log(100.0)


@dataclass(frozen=True)
class HeadConfig:
    """Shape of a head, as stored in ``joint_head_config.json``."""

    hidden_size: int
    width: int
    routing_layers: int
    layers: int
    heads: int
    feedforward: int
    dropout: float = 0.0

    def to_json(self) -> dict[str, int | float]:
        """The ``joint_head_config.json`` content."""
        return asdict(self)


class EvidenceRoutingLayer(nn.Module):
    """Options (queries) attend to the prompt's projected hidden states (memory), then a feed-forward."""

    def __init__(self, width: int, heads: int, feedforward: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.query_norm = nn.LayerNorm(width)
        self.memory_norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.attention_dropout = nn.Dropout(dropout)
        self.feedforward_norm = nn.LayerNorm(width)
        self.feedforward = nn.Sequential(
            nn.Linear(width, feedforward),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(feedforward, width),
            nn.Dropout(dropout),
        )

    def forward(
        self, queries: torch.Tensor, memory: torch.Tensor, memory_padding: torch.Tensor | None = None
    ) -> torch.Tensor:
        """queries [B, Q, W], memory [B, L, W], memory_padding [B, L] (True = padding)."""
        keys = self.memory_norm(memory)
        attended, _ = self.attention(
            self.query_norm(queries), keys, keys, key_padding_mask=memory_padding, need_weights=False
        )
        queries = queries + self.attention_dropout(attended)
        return queries + self.feedforward(self.feedforward_norm(queries))


@dataclass(frozen=True)
class _Index:
    """Flat indices that tie options, questions and records together for one batch."""

    record_offsets: torch.Tensor  # [R] first flat token of each record
    record_lengths: list[int]
    question_spans: torch.Tensor  # [Q, 2] flat token coordinates
    question_record: torch.Tensor  # [Q]
    question_types: torch.Tensor  # [Q]
    questions_per_record: list[int]
    option_spans: torch.Tensor  # [O, 2] flat token coordinates
    option_question: torch.Tensor  # [O]
    options_per_record: list[int]


def _build_index(lengths: Sequence[int], layouts: Sequence[RecordLayout], device: torch.device) -> _Index:
    offsets, question_spans, question_record, question_types = [], [], [], []
    option_spans, option_question = [], []
    questions_per_record, options_per_record = [], []
    offset = 0
    for record, (length, layout) in enumerate(zip(lengths, layouts)):
        offsets.append(offset)
        for question in layout.questions:
            question_index = len(question_spans)
            question_spans.append((question.question_span[0] + offset, question.question_span[1] + offset))
            question_record.append(record)
            question_types.append(question.type_id)
            for start, end in question.option_spans:
                option_spans.append((start + offset, end + offset))
                option_question.append(question_index)
        questions_per_record.append(len(layout.questions))
        options_per_record.append(layout.option_count)
        offset += length

    def as_tensor(values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return _Index(
        record_offsets=as_tensor(offsets),
        record_lengths=list(lengths),
        question_spans=as_tensor(question_spans),
        question_record=as_tensor(question_record),
        question_types=as_tensor(question_types),
        questions_per_record=questions_per_record,
        option_spans=as_tensor(option_spans),
        option_question=as_tensor(option_question),
        options_per_record=options_per_record,
    )


def _span_token_index(spans: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For spans [S, 2]: (flat token index of every covered token, its span id, span lengths)."""
    lengths = spans[:, 1] - spans[:, 0]
    span_ids = torch.repeat_interleave(torch.arange(len(spans), device=spans.device), lengths)
    first_of_span = torch.cumsum(lengths, 0) - lengths
    position = torch.arange(int(lengths.sum()), device=spans.device) - first_of_span[span_ids]
    return spans[span_ids, 0] + position, span_ids, lengths


def _segment_mean(rows: torch.Tensor, span_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Mean of ``rows`` per span id, accumulated in float32, returned in ``rows``' dtype."""
    sums = torch.zeros(len(lengths), rows.shape[-1], dtype=torch.float32, device=rows.device)
    sums.index_add_(0, span_ids, rows.float())
    return (sums / lengths.unsqueeze(-1)).to(rows.dtype)


def _group_softmax(scores: torch.Tensor, groups: torch.Tensor, group_count: int) -> torch.Tensor:
    """Softmax of ``scores`` within each group id."""
    maxima = torch.full((group_count,), -torch.inf, dtype=scores.dtype, device=scores.device)
    maxima = maxima.scatter_reduce(0, groups, scores, reduce="amax")
    weights = torch.exp(scores - maxima[groups])
    totals = torch.zeros(group_count, dtype=scores.dtype, device=scores.device).index_add_(0, groups, weights)
    return weights / totals[groups]


def _pad(rows: torch.Tensor, counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Split flat rows into a zero-padded [B, max(counts), D] tensor and its padding mask."""
    width = max(counts)
    padded = rows.new_zeros(len(counts), width, rows.shape[-1])
    padding = torch.ones(len(counts), width, dtype=torch.bool, device=rows.device)
    valid = torch.arange(width, device=rows.device).unsqueeze(0) < torch.tensor(counts, device=rows.device).unsqueeze(1)
    padded[valid] = rows
    padding[valid] = False
    return padded, padding


MAX_PADDING = 0.25
"""Attention runs on records grouped so padding adds at most this share to a group's memory tokens."""


def _length_groups(lengths: list[int], max_padding: float = MAX_PADDING) -> list[list[int]]:
    """Record indices grouped, longest first, so each group pads little when stacked."""
    groups: list[list[int]] = []
    total = 0
    for record in sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True):
        if groups and lengths[groups[-1][0]] * (len(groups[-1]) + 1) <= (1 + max_padding) * (total + lengths[record]):
            groups[-1].append(record)
            total += lengths[record]
        else:
            groups.append([record])
            total = lengths[record]
    return groups


def _rows(counts: list[int], records: list[int], device: torch.device) -> torch.Tensor:
    """Flat row indices of ``records`` when each record owns ``counts[r]`` consecutive rows."""
    starts = [0]
    for count in counts[:-1]:
        starts.append(starts[-1] + count)
    return torch.cat([torch.arange(starts[r], starts[r] + counts[r]) for r in records]).to(device)


class JointSchemaHead(nn.Module):
    """Scores every option of every question of each record jointly."""

    def __init__(
        self,
        hidden_size: int,
        width: int,
        routing_layers: int,
        layers: int,
        heads: int,
        feedforward: int,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.config = HeadConfig(hidden_size, width, routing_layers, layers, heads, feedforward, dropout)
        self.hidden_norm = nn.LayerNorm(hidden_size)
        self.memory_projection = nn.Linear(hidden_size, width, bias=False)
        self.question_projection = nn.Linear(hidden_size, width, bias=False)
        self.option_question_projection = nn.Linear(hidden_size, width, bias=False)
        self.global_projection = nn.Linear(hidden_size, width, bias=False)
        self.option_context_projection = nn.Linear(hidden_size, width, bias=False)
        self.option_lexical_projection = nn.Linear(hidden_size, width, bias=False)
        self.type_embedding = nn.Embedding(3, width)
        self.evidence_layers = nn.ModuleList(
            EvidenceRoutingLayer(width, heads, feedforward, dropout) for _ in range(routing_layers)
        )
        self.option_summary_norm = nn.LayerNorm(width)
        self.layers = nn.ModuleList(
            nn.TransformerDecoderLayer(
                d_model=width,
                nhead=heads,
                dim_feedforward=feedforward,
                dropout=dropout,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(layers)
        )
        self.field_norm = nn.LayerNorm(width)
        self.option_norm = nn.LayerNorm(width)
        self.residual_scorer = nn.Sequential(
            nn.Linear(width * 4, width), nn.GELU(), nn.Dropout(dropout), nn.Linear(width, 1)
        )
        self.prior_logit_scale = nn.Parameter(torch.zeros(()))
        self.joint_logit_scale = nn.Parameter(torch.zeros(()))
        self.residual_gate = nn.Parameter(torch.zeros(()))

    @classmethod
    def from_config(cls, config: HeadConfig) -> JointSchemaHead:
        """A freshly initialised head of the given shape."""
        return cls(**config.to_json())

    def forward(
        self,
        hidden_states: Sequence[torch.Tensor],
        input_ids: Sequence[torch.Tensor],
        layouts: Sequence[RecordLayout],
        lm_head_weight: torch.Tensor,
    ) -> list[torch.Tensor]:
        """Option logits for a batch of records.

        ``hidden_states[i]``: [L_i, hidden] final hidden states of record i's prompt;
        ``input_ids[i]``: its [L_i] token ids; ``layouts[i]``: its questions and options;
        ``lm_head_weight``: [vocab, hidden]. Returns one flat [options_i] logit vector per record,
        options in layout order (question by question).
        """
        device = lm_head_weight.device
        index = _build_index([len(ids) for ids in input_ids], layouts, device)
        tokens = torch.cat(list(hidden_states)).to(self.hidden_norm.weight.dtype)
        token_ids = torch.cat(list(input_ids)).to(device)

        normed = self.hidden_norm(tokens)
        projected_memory = self.memory_projection(normed)
        groups = []  # (records, padded memory, its padding mask): attention sees one group at a time
        for records in _length_groups(index.record_lengths):
            rows = _rows(index.record_lengths, records, device)
            memory, padding = _pad(projected_memory[rows], [index.record_lengths[r] for r in records])
            groups.append((records, memory, padding))
        last_tokens = index.record_offsets + torch.tensor(index.record_lengths, device=device) - 1
        global_vectors = normed[last_tokens]

        token_index, span_ids, lengths = _span_token_index(index.question_spans)
        question_vectors = _segment_mean(normed[token_index], span_ids, lengths)
        token_index, span_ids, lengths = _span_token_index(index.option_spans)
        option_contexts = _segment_mean(normed[token_index], span_ids, lengths)
        lexical = _segment_mean(
            lm_head_weight[token_ids[token_index]].to(normed.dtype), span_ids, lengths
        )

        option_question = index.option_question
        queries = (
            self.option_context_projection(option_contexts)
            + self.option_lexical_projection(lexical)
            + self.option_question_projection(question_vectors)[option_question]
        )
        routed = torch.empty_like(queries)
        for records, memory, memory_padding in groups:
            rows = _rows(index.options_per_record, records, device)
            options, option_padding = _pad(queries[rows], [index.options_per_record[r] for r in records])
            for layer in self.evidence_layers:
                options = layer(options, memory, memory_padding)
            routed[rows] = options[~option_padding]

        base_fields = self.question_projection(question_vectors)
        routing_scores = (routed * base_fields[option_question]).sum(-1) / math.sqrt(routed.shape[-1])
        weights = _group_softmax(routing_scores, option_question, len(base_fields))
        summaries = torch.zeros_like(base_fields).index_add_(0, option_question, weights.unsqueeze(-1) * routed)
        fields = (
            base_fields
            + self.option_summary_norm(summaries)
            + self.global_projection(global_vectors)[index.question_record]
            + self.type_embedding(index.question_types)
        )
        decided = torch.empty_like(fields)
        for records, memory, memory_padding in groups:
            rows = _rows(index.questions_per_record, records, device)
            group_fields, field_padding = _pad(fields[rows], [index.questions_per_record[r] for r in records])
            for layer in self.layers:
                group_fields = layer(
                    group_fields, memory, tgt_key_padding_mask=field_padding, memory_key_padding_mask=memory_padding
                )
            decided[rows] = group_fields[~field_padding]
        fields = self.field_norm(decided)

        option_record = index.question_record[option_question]
        anchor = F.normalize(question_vectors[option_question] + global_vectors[option_record], dim=-1)
        prior_scale = self.prior_logit_scale.clamp(max=MAX_LOG_SCALE).exp()
        prior = prior_scale * (F.normalize(lexical, dim=-1) * anchor).sum(-1)
        options = self.option_norm(routed)
        option_fields = fields[option_question]
        cosine = F.cosine_similarity(option_fields, options, dim=-1)
        features = torch.cat(
            [option_fields, options, option_fields * options, (option_fields - options).abs()], dim=-1
        )
        residual = self.residual_scorer(features).squeeze(-1)
        joint = self.joint_logit_scale.clamp(max=MAX_LOG_SCALE).exp() * cosine + residual
        logits = prior + torch.sigmoid(self.residual_gate) * joint
        return list(torch.split(logits, index.options_per_record))
