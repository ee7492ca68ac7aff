"""The joint schema head: final hidden states + lm_head rows → one logit per option.

Parameter names and shapes follow Clef's released ``joint_head.safetensors`` so a release loads
with ``strict=True``. The forward pass takes many records at once (one step of a serving engine):
span means, projections and scoring run over all options of all records together; only the two
attention stacks see padded [records, items, width] views, built per group of records of similar
prompt length so padding stays small. Every index (spans, padding slots and masks) is built on the host
from the prompt lengths and layouts and copied to the device without waiting, and rows move by integer
index, never by boolean mask, so a forward pass never waits for the device.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from itertools import accumulate
from typing import NamedTuple

import numpy as np
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
class _Spans:
    """The tokens a set of spans covers in the flat token sequence, for span means."""

    tokens: torch.Tensor  # [T] flat index of every covered token, span by span
    span_ids: torch.Tensor  # [T] the span each of them belongs to
    lengths: torch.Tensor  # [S] tokens per span

    def mean(self, rows: torch.Tensor) -> torch.Tensor:
        """Mean per span of ``rows`` [T, D] (one row per covered token), accumulated in float32."""
        sums = torch.zeros(len(self.lengths), rows.shape[-1], dtype=torch.float32, device=rows.device)
        sums.index_add_(0, self.span_ids, rows.float())
        return (sums / self.lengths.unsqueeze(-1)).to(rows.dtype)


@dataclass(frozen=True)
class _Padding:
    """Flat rows laid out as one zero-padded [records, width] block per length group.

    The blocks lie end to end in one buffer of slots: ``slots[i]`` is where flat row i goes and
    ``mask`` marks the padding slots.
    """

    slots: torch.Tensor  # [N]
    mask: torch.Tensor  # [slots], True = padding
    shapes: list[tuple[int, int]]  # (records, width) of each group's block
    dense: bool  # the rows fill every slot in order: padding and unpadding are views

    def blocks(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """A tensor over all slots [slots, ...] as one [records, width, ...] view per group."""
        parts = flat.split([records * width for records, width in self.shapes])
        return [
            part.view(records, width, *flat.shape[1:])
            for part, (records, width) in zip(parts, self.shapes, strict=True)
        ]

    def masks(self) -> list[torch.Tensor]:
        """The padding mask as one [records, width] view per group (True = padding)."""
        return self.blocks(self.mask)

    def pad(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Flat ``rows`` [N, D] as one zero-padded [records, width, D] tensor per group."""
        if not self.dense:
            rows = rows.new_zeros(len(self.mask), rows.shape[-1]).index_copy_(0, self.slots, rows)
        return self.blocks(rows)

    def unpad(self, blocks: list[torch.Tensor]) -> torch.Tensor:
        """The flat rows [N, D] back from one padded [records, width, D] tensor per group."""
        parts = [block.flatten(0, 1) for block in blocks]
        flat = parts[0] if len(parts) == 1 else torch.cat(parts)
        return flat if self.dense else flat.index_select(0, self.slots)


@dataclass(frozen=True)
class _Index:
    """Every index of one batch, tying tokens, options, questions and records together (see :func:`_build_index`)."""

    last_tokens: torch.Tensor  # [R] flat index of each record's last token
    question_spans: _Spans
    option_spans: _Spans
    question_record: torch.Tensor  # [Q]
    question_types: torch.Tensor  # [Q]
    option_question: torch.Tensor  # [O]
    option_record: torch.Tensor  # [O]
    options_per_record: list[int]
    memory_padding: _Padding  # prompt tokens, the attention memory
    option_padding: _Padding
    question_padding: _Padding


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


def _ranges(starts: list[int], lengths: list[int]) -> np.ndarray:
    """``range(start, start + length)`` for each pair, concatenated."""
    shifts, total = [], 0
    for start, length in zip(starts, lengths, strict=True):
        shifts.append(start - total)
        total += length
    return np.arange(total) + np.repeat(shifts, lengths)


def _span_arrays(spans: list[tuple[int, int]]) -> list[np.ndarray]:
    """The fields of a :class:`_Spans` as host arrays, for flat spans [(start, end), ...]."""
    starts = [start for start, _ in spans]
    lengths = [end - start for start, end in spans]
    return [_ranges(starts, lengths), np.repeat(np.arange(len(spans)), lengths), np.array(lengths)]


class _HostPadding(NamedTuple):
    """A :class:`_Padding` on the host, its slots and mask still arrays."""

    slots: np.ndarray
    mask: np.ndarray
    shapes: list[tuple[int, int]]
    dense: bool


def _host_padding(counts: list[int], groups: list[list[int]]) -> _HostPadding:
    """Padding of flat rows, ``counts[r]`` consecutive ones per record, to each group's largest count."""
    shapes = [(len(records), max(counts[record] for record in records)) for records in groups]
    first_slots = [0] * len(counts)
    size = 0
    for records, (count, width) in zip(groups, shapes, strict=True):
        for position, record in enumerate(records):
            first_slots[record] = size + position * width
        size += count * width
    slots = _ranges(first_slots, counts)
    mask = np.ones(size, dtype=bool)
    mask[slots] = False
    # Dense: no padding slot, and each record's block starts where its rows start.
    dense = size == len(slots) and first_slots == list(accumulate(counts[:-1], initial=0))
    return _HostPadding(slots, mask, shapes, dense)


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device`` without the host waiting: host tensors go to CUDA from pinned memory."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def _upload(arrays: list[np.ndarray | list[int]], dtype: type, device: torch.device) -> Iterator[torch.Tensor]:
    """Host arrays on ``device`` as views of one copy, in order."""
    flat = _to_device(torch.from_numpy(np.concatenate(arrays, dtype=dtype)), device)
    return iter(flat.split([len(array) for array in arrays]))


def _build_index(lengths: list[int], layouts: Sequence[RecordLayout], device: torch.device) -> _Index:
    """The batch's indices, computed on the host from prompt lengths and layouts, copied to ``device``."""
    record_starts = list(accumulate(lengths[:-1], initial=0))
    question_spans: list[tuple[int, int]]
    question_spans, question_record, question_types = [], [], []
    option_spans, option_question, option_record = [], [], []
    for record, (offset, layout) in enumerate(zip(record_starts, layouts, strict=True)):
        for question in layout.questions:
            option_spans += [(start + offset, end + offset) for start, end in question.option_spans]
            option_question += [len(question_spans)] * len(question.option_spans)
            option_record += [record] * len(question.option_spans)
            question_spans.append((question.question_span[0] + offset, question.question_span[1] + offset))
            question_record.append(record)
            question_types.append(question.type_id)
    groups = _length_groups(lengths)
    option_counts = [layout.option_count for layout in layouts]
    question_counts = [len(layout.questions) for layout in layouts]
    paddings = [_host_padding(counts, groups) for counts in (lengths, option_counts, question_counts)]
    integers = _upload(
        [
            *(padding.slots for padding in paddings),
            [start + length - 1 for start, length in zip(record_starts, lengths, strict=True)],
            *_span_arrays(question_spans),
            *_span_arrays(option_spans),
            question_record,
            question_types,
            option_question,
            option_record,
        ],
        np.int64,
        device,
    )
    masks = _upload([padding.mask for padding in paddings], np.bool_, device)
    # The copies are taken in the order the arrays are listed above.
    memory_padding, option_padding, question_padding = (
        _Padding(next(integers), next(masks), padding.shapes, padding.dense) for padding in paddings
    )
    return _Index(
        last_tokens=next(integers),
        question_spans=_Spans(next(integers), next(integers), next(integers)),
        option_spans=_Spans(next(integers), next(integers), next(integers)),
        question_record=next(integers),
        question_types=next(integers),
        option_question=next(integers),
        option_record=next(integers),
        options_per_record=option_counts,
        memory_padding=memory_padding,
        option_padding=option_padding,
        question_padding=question_padding,
    )


def _group_softmax(scores: torch.Tensor, groups: torch.Tensor, group_count: int) -> torch.Tensor:
    """Softmax of ``scores`` within each group id."""
    maxima = torch.full((group_count,), -torch.inf, dtype=scores.dtype, device=scores.device)
    maxima = maxima.scatter_reduce(0, groups, scores, reduce="amax")
    weights = torch.exp(scores - maxima[groups])
    totals = torch.zeros(group_count, dtype=scores.dtype, device=scores.device).index_add_(0, groups, weights)
    return weights / totals[groups]


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
        return cls(**asdict(config))

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
        token_ids = _to_device(torch.cat(list(input_ids)), device)

        normed = self.hidden_norm(tokens)
        memories = index.memory_padding.pad(self.memory_projection(normed))
        memory_masks = index.memory_padding.masks()
        global_vectors = normed[index.last_tokens]

        question_vectors = index.question_spans.mean(normed[index.question_spans.tokens])
        option_tokens = index.option_spans.tokens
        option_contexts = index.option_spans.mean(normed[option_tokens])
        lexical = index.option_spans.mean(lm_head_weight[token_ids[option_tokens]].to(normed.dtype))

        option_question = index.option_question
        queries = (
            self.option_context_projection(option_contexts)
            + self.option_lexical_projection(lexical)
            + self.option_question_projection(question_vectors)[option_question]
        )
        routed_groups = []  # attention sees one length group at a time
        for options, memory, memory_mask in zip(index.option_padding.pad(queries), memories, memory_masks, strict=True):
            for layer in self.evidence_layers:
                options = layer(options, memory, memory_mask)
            routed_groups.append(options)
        routed = index.option_padding.unpad(routed_groups)

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
        question_padding = index.question_padding
        decided = []
        for group_fields, field_mask, memory, memory_mask in zip(
            question_padding.pad(fields), question_padding.masks(), memories, memory_masks, strict=True
        ):
            for layer in self.layers:
                group_fields = layer(
                    group_fields, memory, tgt_key_padding_mask=field_mask, memory_key_padding_mask=memory_mask
                )
            decided.append(group_fields)
        fields = self.field_norm(question_padding.unpad(decided))

        anchor = F.normalize(question_vectors[option_question] + global_vectors[index.option_record], dim=-1)
        prior_scale = self.prior_logit_scale.clamp(max=MAX_LOG_SCALE).exp()
        prior = prior_scale * (F.normalize(lexical, dim=-1) * anchor).sum(-1)
        options = self.option_norm(routed)
        option_fields = fields[option_question]
        cosine = F.cosine_similarity(option_fields, options, dim=-1)
        features = torch.cat([option_fields, options, option_fields * options, (option_fields - options).abs()], dim=-1)
        residual = self.residual_scorer(features).squeeze(-1)
        joint = self.joint_logit_scale.clamp(max=MAX_LOG_SCALE).exp() * cosine + residual
        logits = prior + torch.sigmoid(self.residual_gate) * joint
        return list(torch.split(logits, index.options_per_record))
