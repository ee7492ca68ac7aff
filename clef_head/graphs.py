"""The joint schema head for one record at a time, as CUDA graphs over bucketed shapes.

A lone record's head forward is a few hundred small kernels: on a GPU, launching them costs several
times their run time. :class:`GraphedHead` runs a batch of exactly one record through a static-shape
forward pass (:func:`static_forward`) whose shapes are the record's rounded up to a bucket (prompt
tokens to a multiple of :data:`TOKEN_BUCKET`; questions and options always padded to
:data:`MAX_GRAPH_QUESTIONS` and :data:`MAX_GRAPH_OPTIONS`), captured once per bucket as a CUDA graph and
replayed. Padding questions and options to their maxima only adds rows to small kernels whose time is
mostly their launch, and leaves only :data:`ALL_BUCKETS`, one per token bucket, so
:meth:`GraphedHead.warm_up` can capture every graph a served record can meet before the first request.
Batches of several records, records beyond the largest bucket, and any device other than CUDA take
:class:`~clef_head.head.JointSchemaHead`'s own forward.

The static pass computes the same function as the dynamic one: span means are products with 0/1
membership matrices (accumulated in float32, as the dynamic pass's ``index_add``), the per-question
softmax is a masked softmax over a [questions, options] membership matrix, and padded tokens and
questions are masked out of every attention. Padded rows only ever meet zero weights, so what the
buffers held before does not change the answer. With ``graphs=False`` it runs eagerly (the parity
tests on the CPU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from clef_head.head import MAX_LOG_SCALE, JointSchemaHead
from clef_head.layout import QuestionLayout, RecordLayout

TOKEN_BUCKET = 128
"""Prompt lengths are rounded up to a multiple of this many tokens."""
MAX_GRAPH_TOKENS = 2048
MAX_GRAPH_QUESTIONS = 32
MAX_GRAPH_OPTIONS = 128


@dataclass(frozen=True)
class Bucket:
    """Padded shape of one record: prompt tokens, questions, options."""

    tokens: int
    questions: int = MAX_GRAPH_QUESTIONS
    options: int = MAX_GRAPH_OPTIONS

    @classmethod
    def of(cls, length: int, layout: RecordLayout) -> Bucket | None:
        """The bucket a record of ``length`` tokens and ``layout`` falls into; None past the largest."""
        if length > MAX_GRAPH_TOKENS or len(layout.questions) > MAX_GRAPH_QUESTIONS:
            return None
        if layout.option_count > MAX_GRAPH_OPTIONS:
            return None
        return cls(tokens=TOKEN_BUCKET * math.ceil(length / TOKEN_BUCKET))


ALL_BUCKETS = tuple(Bucket(tokens) for tokens in range(TOKEN_BUCKET, MAX_GRAPH_TOKENS + 1, TOKEN_BUCKET))
"""Every bucket :meth:`Bucket.of` can return: what :meth:`GraphedHead.warm_up` captures."""
WARM_UP_LAYOUT = RecordLayout(questions=(QuestionLayout("warm-up", 0, (0, 1), ((0, 1),), ("warm-up",)),))
"""A one-question, one-option layout that fits every bucket (the warm-up's placeholder record)."""


class StaticInputs(NamedTuple):
    """One record laid out in a bucket's shapes (T tokens, Q questions, O options)."""

    hidden: torch.Tensor  # [T, hidden] final hidden states, padded
    token_ids: torch.Tensor  # [T] prompt token ids, padded
    memory_padding: torch.Tensor  # [1, T] True = padding token
    last_token: torch.Tensor  # [1] index of the prompt's last token
    question_members: torch.Tensor  # [Q, T] float32: 1 where a token is in the question's span
    question_lengths: torch.Tensor  # [Q, 1] float32 tokens per question span (1 for padding)
    option_members: torch.Tensor  # [O, T] float32
    option_lengths: torch.Tensor  # [O, 1] float32
    option_question: torch.Tensor  # [O] the question of each option (0 for padding)
    question_options: torch.Tensor  # [Q, O] True where the option belongs to the question
    question_types: torch.Tensor  # [Q]
    question_padding: torch.Tensor  # [1, Q] True = padding question


def host_inputs(length: int, token_ids: torch.Tensor, layout: RecordLayout, bucket: Bucket) -> dict[str, torch.Tensor]:
    """Every input but the hidden states, built on the host (CPU tensors) in ``bucket``'s shapes."""
    tokens, questions, options = bucket.tokens, bucket.questions, bucket.options
    ids = np.zeros(tokens, dtype=np.int64)
    ids[:length] = token_ids.cpu().numpy()
    question_members = np.zeros((questions, tokens), dtype=np.float32)
    option_members = np.zeros((options, tokens), dtype=np.float32)
    option_question = np.zeros(options, dtype=np.int64)
    question_options = np.zeros((questions, options), dtype=np.bool_)
    question_types = np.zeros(questions, dtype=np.int64)
    option = 0
    for index, question in enumerate(layout.questions):
        start, end = question.question_span
        question_members[index, start:end] = 1.0
        question_types[index] = question.type_id
        for start, end in question.option_spans:
            option_members[option, start:end] = 1.0
            option_question[option] = index
            question_options[index, option] = True
            option += 1
    memory_padding = np.ones((1, tokens), dtype=np.bool_)
    memory_padding[0, :length] = False
    question_padding = np.ones((1, questions), dtype=np.bool_)
    question_padding[0, : len(layout.questions)] = False
    return {
        "token_ids": torch.from_numpy(ids),
        "memory_padding": torch.from_numpy(memory_padding),
        "last_token": torch.tensor([length - 1]),
        "question_members": torch.from_numpy(question_members),
        "question_lengths": torch.from_numpy(np.maximum(question_members.sum(1, keepdims=True), 1)),
        "option_members": torch.from_numpy(option_members),
        "option_lengths": torch.from_numpy(np.maximum(option_members.sum(1, keepdims=True), 1)),
        "option_question": torch.from_numpy(option_question),
        "question_options": torch.from_numpy(question_options),
        "question_types": torch.from_numpy(question_types),
        "question_padding": torch.from_numpy(question_padding),
    }


def _span_means(members: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean of ``rows`` [T, D] over each membership row [S, T], accumulated in float32."""
    return (members @ rows.float() / lengths).to(rows.dtype)


def static_forward(head: JointSchemaHead, inputs: StaticInputs, lm_head_weight: torch.Tensor) -> torch.Tensor:
    """Option logits [O] of one record in static shapes: the function ``JointSchemaHead.forward`` computes."""
    dtype = head.hidden_norm.weight.dtype
    normed = head.hidden_norm(inputs.hidden.to(dtype))
    memory = head.memory_projection(normed).unsqueeze(0)
    memory_padding = inputs.memory_padding
    global_vectors = normed.index_select(0, inputs.last_token)

    question_vectors = _span_means(inputs.question_members, inputs.question_lengths, normed)
    option_contexts = _span_means(inputs.option_members, inputs.option_lengths, normed)
    lexical_rows = lm_head_weight.index_select(0, inputs.token_ids).to(dtype)
    lexical = _span_means(inputs.option_members, inputs.option_lengths, lexical_rows)

    option_question = inputs.option_question
    queries = (
        head.option_context_projection(option_contexts)
        + head.option_lexical_projection(lexical)
        + head.option_question_projection(question_vectors).index_select(0, option_question)
    ).unsqueeze(0)
    for layer in head.evidence_layers:
        queries = layer(queries, memory, memory_padding)
    routed = queries.squeeze(0)

    base_fields = head.question_projection(question_vectors)
    scores = (routed * base_fields.index_select(0, option_question)).sum(-1) / math.sqrt(routed.shape[-1])
    members = inputs.question_options
    grouped = scores.unsqueeze(0).expand(members.shape).masked_fill(~members, -torch.inf)
    maxima = grouped.amax(-1, keepdim=True).clamp(min=torch.finfo(scores.dtype).min)  # padded rows: all -inf
    weights = torch.exp(grouped - maxima)
    weights = weights / weights.sum(-1, keepdim=True).clamp(min=torch.finfo(scores.dtype).tiny)
    summaries = weights.to(routed.dtype) @ routed
    fields = (
        base_fields
        + head.option_summary_norm(summaries)
        + head.global_projection(global_vectors)
        + head.type_embedding(inputs.question_types)
    ).unsqueeze(0)
    for layer in head.layers:
        fields = layer(
            fields, memory, tgt_key_padding_mask=inputs.question_padding, memory_key_padding_mask=memory_padding
        )
    fields = head.field_norm(fields.squeeze(0))

    anchor = F.normalize(question_vectors.index_select(0, option_question) + global_vectors, dim=-1)
    prior_scale = head.prior_logit_scale.clamp(max=MAX_LOG_SCALE).exp()
    prior = prior_scale * (F.normalize(lexical, dim=-1) * anchor).sum(-1)
    options = head.option_norm(routed)
    option_fields = fields.index_select(0, option_question)
    cosine = F.cosine_similarity(option_fields, options, dim=-1)
    features = torch.cat([option_fields, options, option_fields * options, (option_fields - options).abs()], dim=-1)
    residual = head.residual_scorer(features).squeeze(-1)
    joint = head.joint_logit_scale.clamp(max=MAX_LOG_SCALE).exp() * cosine + residual
    return prior + torch.sigmoid(head.residual_gate) * joint


class _Captured(NamedTuple):
    inputs: StaticInputs
    graph: torch.cuda.CUDAGraph | None
    output: torch.Tensor | None
    table: int | None  # address of the lm_head table the graph reads (baked into the graph)


class GraphedHead:
    """A :class:`JointSchemaHead` whose one-record batches replay CUDA graphs (see the module docstring).

    Called like the head. ``graphs=False`` runs the static pass eagerly instead of capturing it (same
    inputs, same kernels). Graphs are captured on first use of a bucket; :attr:`captures` counts them.
    A graph reads the head's parameters and the lm_head table at the addresses they had when it was
    captured: a bucket's graph is captured again when a call passes a table at another address.
    """

    def __init__(self, head: JointSchemaHead, graphs: bool = True) -> None:
        self.head = head
        self.graphs = graphs
        self.config = head.config
        self._captured: dict[Bucket, _Captured] = {}
        self._pool: torch.cuda._POOL_HANDLE | None = None
        self._token_buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.captures = 0

    def __call__(
        self,
        hidden_states: Sequence[torch.Tensor],
        input_ids: Sequence[torch.Tensor],
        layouts: Sequence[RecordLayout],
        lm_head_weight: torch.Tensor,
    ) -> list[torch.Tensor]:
        """Option logits per record, as :meth:`JointSchemaHead.forward` returns them."""
        if len(layouts) == 1:
            bucket = Bucket.of(len(input_ids[0]), layouts[0])
            if bucket is not None and (lm_head_weight.device.type == "cuda" or not self.graphs):
                return [self.one_record(hidden_states[0], input_ids[0], layouts[0], lm_head_weight, bucket)]
        return self.head(hidden_states, input_ids, layouts, lm_head_weight)

    def one_record(
        self,
        hidden: torch.Tensor,
        token_ids: torch.Tensor,
        layout: RecordLayout,
        lm_head_weight: torch.Tensor,
        bucket: Bucket,
    ) -> torch.Tensor:
        """Logits [options] of one record through its bucket's static pass (a graph replay on CUDA)."""
        device = lm_head_weight.device
        captured = self._captured.get(bucket)
        if captured is None:
            captured = self._allocate(bucket, hidden.shape[-1], hidden.dtype, device)
        inputs = captured.inputs
        length = len(token_ids)
        for name, value in host_inputs(length, token_ids, layout, bucket).items():
            target = getattr(inputs, name)
            if device.type == "cuda":
                value = value.pin_memory()
            target.copy_(value, non_blocking=True)
        inputs.hidden[:length].copy_(hidden)
        if not self.graphs:
            return static_forward(self.head, inputs, lm_head_weight)[: layout.option_count].clone()
        graph, output = captured.graph, captured.output
        if graph is None or output is None or captured.table != lm_head_weight.data_ptr():
            graph, output = self._capture(bucket, captured.inputs, lm_head_weight)
        graph.replay()
        return output[: layout.option_count].clone()

    def warm_up(self, hidden_size: int, lm_head_weight: torch.Tensor) -> int:
        """Run every bucket of :data:`ALL_BUCKETS` once with a placeholder record (on CUDA with graphs:
        capture its graph) so that no served record pays for a capture; the number of buckets run.

        Graphs read ``lm_head_weight`` at its current address: warm up with the table the served
        calls will pass. With ``graphs=False`` each bucket's static pass runs once; with graphs off CUDA
        nothing runs (such calls take the dynamic pass)."""
        if self.graphs and lm_head_weight.device.type != "cuda":
            return 0
        dtype = self.head.hidden_norm.weight.dtype
        with torch.no_grad():
            for bucket in ALL_BUCKETS:
                hidden = torch.zeros(bucket.tokens, hidden_size, dtype=dtype, device=lm_head_weight.device)
                token_ids = torch.zeros(bucket.tokens, dtype=torch.long)
                self.one_record(hidden, token_ids, WARM_UP_LAYOUT, lm_head_weight, bucket)
        return len(ALL_BUCKETS)

    def _allocate(self, bucket: Bucket, hidden_size: int, dtype: torch.dtype, device: torch.device) -> _Captured:
        """A bucket's input buffers. The per-token ones (hidden states, token ids, padding) are views of
        one buffer of :data:`MAX_GRAPH_TOKENS` rows shared by every bucket, so memory does not grow with
        the number of buckets by a [tokens, hidden] block each. Every dtype is explicit: vLLM's loader,
        where :meth:`warm_up` runs, sets the default dtype to the model's."""
        tokens, questions, options = bucket.tokens, bucket.questions, bucket.options
        with torch.inference_mode(False), torch.no_grad():
            if self._token_buffers is None or self._token_buffers[0].dtype != dtype:
                self._token_buffers = (
                    torch.zeros(MAX_GRAPH_TOKENS, hidden_size, dtype=dtype, device=device),
                    torch.zeros(MAX_GRAPH_TOKENS, dtype=torch.long, device=device),
                    torch.ones(1, MAX_GRAPH_TOKENS, dtype=torch.bool, device=device),
                )
            hidden, token_ids, memory_padding = self._token_buffers
            inputs = StaticInputs(
                hidden=hidden[:tokens],
                token_ids=token_ids[:tokens],
                memory_padding=memory_padding[:, :tokens],
                last_token=torch.zeros(1, dtype=torch.long, device=device),
                question_members=torch.zeros(questions, tokens, dtype=torch.float32, device=device),
                question_lengths=torch.ones(questions, 1, dtype=torch.float32, device=device),
                option_members=torch.zeros(options, tokens, dtype=torch.float32, device=device),
                option_lengths=torch.ones(options, 1, dtype=torch.float32, device=device),
                option_question=torch.zeros(options, dtype=torch.long, device=device),
                question_options=torch.zeros(questions, options, dtype=torch.bool, device=device),
                question_types=torch.zeros(questions, dtype=torch.long, device=device),
                question_padding=torch.ones(1, questions, dtype=torch.bool, device=device),
            )
        captured = _Captured(inputs, None, None, None)
        self._captured[bucket] = captured
        return captured

    def _capture(
        self, bucket: Bucket, inputs: StaticInputs, lm_head_weight: torch.Tensor
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Warm the bucket's static pass up on a side stream, then capture it (inputs already filled);
        the graph and its output buffer."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            static_forward(self.head, inputs, lm_head_weight)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # thread_local: an engine's other threads may use CUDA while this one captures
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"), torch.no_grad():
            output = static_forward(self.head, inputs, lm_head_weight)
        self._captured[bucket] = _Captured(inputs, graph, output, lm_head_weight.data_ptr())
        self.captures += 1
        return graph, output
