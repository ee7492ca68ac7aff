"""Whole-forward CUDA graphs for an engine step that runs one prompt, whole.

vLLM captures Clef's backbone as piecewise CUDA graphs: its attention and Gated DeltaNet layers run eagerly
between the graph pieces, because their metadata builders support full graphs for uniform decode batches only
(``GDNAttentionMetadataBuilder`` declares ``AttentionCGSupport.UNIFORM_BATCH``), and a pooling model never
decodes. A lone prompt's step is therefore bound by the host launching those layers' kernels, not by the GPU.

A step that runs exactly one prompt, from its first token to its last, at one of vLLM's CUDA-graph sizes
(``cudagraph_capture_sizes``) can replay a graph of the whole backbone instead: every launch is sized for the
step's padded length N (host-side lengths, grids and chunk lists), while the sequence bounds the kernels read
from device memory (``query_start_loc``, ``seq_lens``, FLA's ``cu_seqlens``) are the step's own, so attention,
the causal convolution and the delta rule stop at the prompt's last token exactly as in vLLM's own step, and the
padding rows (whatever they hold, NaN included) never meet a real token: neither as a key nor inside a chunk.
The padding's keys are not written to the KV cache (slot -1).

Every size's graph is captured at the first such step (the predictor's warm-up sends one before the server
reports ready): each against static copies of that step's attention metadata rebuilt for N tokens, run once
eagerly first on vLLM's null block (so every kernel is compiled and tuned before capture). A replay copies the
step's token ids, positions, sequence bounds, KV-cache slots, block table and state slots into the static copies.

The graphs are on unless ``additional_config={"clef_lone_prompt_graphs": false}`` turns them off. They are measured
with FLA's Triton Gated DeltaNet kernels on an H200 (BENCHMARKS.md, R24: lone prompts' answers as close to the
batched pass's as with vLLM's piecewise graphs); with FlashInfer's Gated DeltaNet prefill, not yet measured under
them, they run only when that key is set to true.

This module is the one place that leans on vLLM's attention metadata (``FlashAttentionMetadata``,
``GDNAttentionMetadata`` and the helpers their builders call); tests pin the fields it reads and writes. Steps
with several prompts, a chunk of a longer prompt, images, or another attention backend run vLLM's piecewise
graphs, as does every step of an engine with tensor parallelism, ``--enforce-eager`` or the in-tree CuTe DSL
Gated DeltaNet prefill.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest.mock import patch

import torch
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.forward_context import ForwardContext, get_forward_context, override_forward_context
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import _resolve_gdn_prefill_backend
from vllm.platforms import current_platform
from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices, prepare_chunk_offsets
from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE
from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata
from vllm.v1.attention.backends.utils import compute_causal_conv1d_metadata

logger = logging.getLogger(__name__)

SWITCH = "clef_lone_prompt_graphs"
"""``additional_config`` key: false turns the graphs off; true also asks for them over FlashInfer's Gated DeltaNet
prefill (see the module docstring)."""
NULL_BLOCK = 0
"""vLLM's null block: never given to a request; the capture runs' Gated DeltaNet state goes there."""
PAD_SLOT = -1
"""A KV-cache slot that vLLM's cache writes skip."""
MEASURED_GDN_BACKENDS = ("triton",)
"""Gated DeltaNet prefill backends whose whole-forward graphs were measured right on a GPU: on by default."""
ASKED_GDN_BACKENDS = ("flashinfer",)
"""Gated DeltaNet prefill backends that read the metadata :class:`DeltaNetCopy` builds (FLA's layout), not yet
measured under the graphs: on only when ``additional_config`` sets :data:`SWITCH` to true."""

Backbone = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""The backbone's forward: (token ids [N], positions [..., N]) → hidden states [N, hidden]."""


def why_not_graphed(vllm_config: VllmConfig) -> str | None:
    """Why an engine with ``vllm_config`` cannot replay whole-forward graphs for lone prompts, or None when it can.

    Raises ValueError when ``additional_config`` sets :data:`SWITCH` to anything but true or false."""
    additional = vllm_config.additional_config if isinstance(vllm_config.additional_config, dict) else {}
    asked = additional.get(SWITCH)
    if SWITCH in additional and not isinstance(asked, bool):
        raise ValueError(f"additional_config {SWITCH} must be true or false, got {asked!r}")
    if asked is False:
        return f"additional_config sets {SWITCH} to false"
    if not current_platform.is_cuda():
        return "the engine does not run on a CUDA GPU"
    if vllm_config.model_config.enforce_eager:
        return "the engine runs eagerly"
    if vllm_config.compilation_config.cudagraph_mode != CUDAGraphMode.PIECEWISE:
        return f"cudagraph_mode is {vllm_config.compilation_config.cudagraph_mode.name}, not PIECEWISE"
    if vllm_config.parallel_config.world_size > 1:
        return "the engine is split over several GPUs"
    return gdn_backend_refusal(_resolve_gdn_prefill_backend(vllm_config)[1], asked=asked is True)


def gdn_backend_refusal(backend: str, *, asked: bool) -> str | None:
    """Why the graphs do not run over the Gated DeltaNet prefill ``backend``, or None when they do; ``asked``:
    ``additional_config`` sets :data:`SWITCH` to true."""
    if backend in MEASURED_GDN_BACKENDS or (asked and backend in ASKED_GDN_BACKENDS):
        return None
    if backend in ASKED_GDN_BACKENDS:
        return (
            f"the Gated DeltaNet prefill backend is {backend}, under which they are not yet measured "
            f"(additional_config {SWITCH}: true asks for them)"
        )
    return f"the Gated DeltaNet prefill backend is {backend}"


def whole_prompt_limit(vllm_config: VllmConfig) -> int:
    """A fresh prompt's step shorter than this many tokens holds the whole prompt (vLLM's scheduler chunks
    only prompts longer than its token budget or its long-prefill threshold)."""
    scheduler = vllm_config.scheduler_config
    limit = int(scheduler.max_num_batched_tokens)
    threshold = int(getattr(scheduler, "long_prefill_token_threshold", 0) or 0)
    return min(limit, threshold) if threshold > 0 else limit


def lone_prompt_tokens(context: ForwardContext) -> int | None:
    """The prompt's token count when the step runs one prompt from its first token and vLLM pads it to a
    CUDA-graph size; None for any other step."""
    metadata = context.attn_metadata
    if context.cudagraph_runtime_mode != CUDAGraphMode.PIECEWISE or context.ubatch_slices is not None:
        return None
    if not isinstance(metadata, dict) or not metadata:
        return None
    lengths = set()
    for group in distinct(metadata.values()):
        if isinstance(group, GDNAttentionMetadata):
            if (
                group.num_prefills != 1
                or group.num_decodes
                or group.num_spec_decodes
                or group.spec_sequence_masks is not None
                or getattr(group, "checkpoint", None) is not None
            ):
                return None
            lengths.add(group.num_prefill_tokens)
        elif isinstance(group, FlashAttentionMetadata):
            if (
                group.query_start_loc.numel() != 2
                or group.max_seq_len != group.max_query_len
                or getattr(group, "use_cascade", False)
                or group.causal is not True
            ):
                return None
            lengths.add(group.max_query_len)
        else:
            return None
    return lengths.pop() if len(lengths) == 1 else None


def unsupported_backends(metadata: dict[str, Any]) -> list[str]:
    """Names of the attention metadata types in ``metadata`` that this module cannot rebuild."""
    known = (GDNAttentionMetadata, FlashAttentionMetadata)
    return sorted({type(group).__name__ for group in metadata.values() if not isinstance(group, known)})


def distinct(groups: Iterable[Any]) -> list[Any]:
    """Each metadata object once, in order of first appearance (vLLM shares one among a KV-cache group's layers)."""
    return list({id(group): group for group in groups}.values())


class AttentionCopy:
    """Static full-attention metadata for one prompt in launches for ``tokens`` tokens; :meth:`load` takes a
    step's sequence bounds and slots."""

    def __init__(self, template: FlashAttentionMetadata, tokens: int) -> None:
        """Rebuild ``template`` (a lone prompt's metadata) for ``tokens`` tokens with buffers of its own."""
        device = template.query_start_loc.device
        self.slot_mapping = torch.full((tokens,), PAD_SLOT, dtype=template.slot_mapping.dtype, device=device)
        self.block_table = torch.full(
            (1, template.block_table.shape[1]), NULL_BLOCK, dtype=template.block_table.dtype, device=device
        )
        self.query_start_loc = torch.tensor([0, tokens], dtype=template.query_start_loc.dtype, device=device)
        self.seq_lens = torch.tensor([tokens], dtype=template.seq_lens.dtype, device=device)
        self.metadata = dataclasses.replace(
            template,
            num_actual_tokens=tokens,
            max_query_len=tokens,
            max_seq_len=tokens,
            query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens,
            block_table=self.block_table,
            slot_mapping=self.slot_mapping,
            scheduler_metadata=None,
            max_num_splits=0,
        )

    def load(self, step: FlashAttentionMetadata) -> None:
        """The step's sequence bounds, KV-cache slots (the padding's stay -1) and block table row."""
        self.query_start_loc.copy_(step.query_start_loc[:2])
        self.seq_lens.copy_(step.seq_lens[:1])
        count = step.slot_mapping.shape[0]
        self.slot_mapping[:count].copy_(step.slot_mapping)
        if count < self.slot_mapping.shape[0]:
            self.slot_mapping[count:].fill_(PAD_SLOT)
        self.block_table.copy_(step.block_table[:1])


class DeltaNetCopy:
    """Static Gated DeltaNet metadata for one fresh prompt in launches for ``tokens`` tokens; :meth:`load` takes a
    step's sequence bounds and state slot."""

    def __init__(self, template: GDNAttentionMetadata, tokens: int) -> None:
        """Rebuild ``template`` (a lone prompt's metadata) for ``tokens`` tokens with a state slot of its own."""
        assert template.prefill_state_indices is not None and template.prefill_query_start_loc is not None
        device = template.prefill_state_indices.device
        bounds_cpu = torch.tensor([0, tokens], dtype=template.prefill_query_start_loc.dtype)
        self.bounds = bounds_cpu.to(device)
        self.state_slot = torch.full((1,), NULL_BLOCK, dtype=template.prefill_state_indices.dtype, device=device)
        fresh = torch.zeros(1, dtype=torch.bool, device=device)
        conv_programs, batch_ptr, chunk_offset_ptr = compute_causal_conv1d_metadata(bounds_cpu, device=device)
        self.metadata = dataclasses.replace(
            template,
            num_prefill_tokens=tokens,
            num_actual_tokens=tokens,
            has_initial_state=fresh,
            prefill_has_initial_state=fresh,
            non_spec_query_start_loc=self.bounds,
            prefill_query_start_loc=self.bounds,
            non_spec_state_indices_tensor=self.state_slot,
            prefill_state_indices=self.state_slot,
            chunk_indices=prepare_chunk_indices(bounds_cpu, FLA_CHUNK_SIZE).to(device),
            chunk_offsets=prepare_chunk_offsets(bounds_cpu, FLA_CHUNK_SIZE).to(device),
            nums_dict=conv_programs,
            batch_ptr=batch_ptr,
            token_chunk_offset_ptr=chunk_offset_ptr,
        )

    def load(self, step: GDNAttentionMetadata) -> None:
        """The step's sequence bounds (FLA's ``cu_seqlens``: the chunks past them load zeros and store nothing)
        and state slot."""
        assert step.prefill_state_indices is not None and step.prefill_query_start_loc is not None
        self.bounds.copy_(step.prefill_query_start_loc[:2])
        self.state_slot.copy_(step.prefill_state_indices[:1])


MetadataCopy = AttentionCopy | DeltaNetCopy


def metadata_copy(template: Any, tokens: int) -> MetadataCopy:
    """The static copy of one KV-cache group's metadata for ``tokens`` tokens."""
    if isinstance(template, GDNAttentionMetadata):
        return DeltaNetCopy(template, tokens)
    return AttentionCopy(template, tokens)


@dataclasses.dataclass
class PromptGraph:
    """One size's graph, its static inputs and metadata copies (one per KV-cache group), and its output."""

    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    groups: list[MetadataCopy]
    hidden_states: torch.Tensor

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor, steps: list[Any]) -> torch.Tensor:
        """Run the step (its inputs and each group's metadata, in the order of :attr:`groups`) through the graph."""
        self.input_ids.copy_(input_ids)
        self.positions.copy_(positions)
        for group, step in zip(self.groups, steps, strict=True):
            group.load(step)
        self.graph.replay()
        return self.hidden_states.clone()


def laid_out_as(step_input: torch.Tensor, size: int) -> torch.Tensor:
    """A zero buffer for ``size`` tokens with the strides of ``step_input``: vLLM passes views of its persistent
    input buffers (M-RoPE positions: ``[3, size]`` rows of a ``[3, max_tokens]`` buffer), and the backbone's
    compiled code reads them with those strides, whatever strides a buffer of its own would have."""
    shape = (*step_input.shape[:-1], size)
    buffer = torch.empty_strided(shape, step_input.stride(), dtype=step_input.dtype, device=step_input.device)
    return buffer.zero_()


@contextmanager
def capture_quietly() -> Iterator[None]:
    """No garbage collection and no cache release at each capture's start (``torch.cuda.graph`` runs both, as
    vLLM's own capture also avoids: a collection in a loaded engine process costs a large share of a capture)."""
    with ExitStack() as stack:
        stack.enter_context(patch("gc.collect", lambda *args: 0))
        stack.enter_context(patch("torch.cuda.empty_cache", lambda: None))
        yield


class LonePromptGraphs:
    """The whole-forward graphs of one engine, captured at its first lone prompt (see the module docstring)."""

    def __init__(self, backbone: Backbone, sizes: Sequence[int], whole_below: int) -> None:
        """``backbone`` runs the model; ``sizes``: vLLM's CUDA-graph sizes; ``whole_below``:
        :func:`whole_prompt_limit`."""
        self.backbone = backbone
        self.sizes = sorted(set(sizes), reverse=True)
        self.whole_below = whole_below
        self.graphs: dict[int, PromptGraph] = {}
        self.layers: list[str] = []  # each group's first layer: where a step's metadata for that group is found
        self.enabled = True
        self.backends_checked = False

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | None:
        """The step's hidden states from a graph when the step runs one prompt, whole; None otherwise."""
        if not self.enabled:
            return None
        context = get_forward_context()
        tokens = lone_prompt_tokens(context)
        if tokens is None:
            if not self.backends_checked and isinstance(context.attn_metadata, dict) and context.attn_metadata:
                self._refuse_unsupported(context.attn_metadata)
            return None
        if tokens >= self.whole_below or input_ids.shape[0] not in self.sizes:
            return None
        if not self.graphs and not self._capture_all(context, input_ids, positions):
            return None
        graph = self.graphs[input_ids.shape[0]]
        if positions.stride() != graph.positions.stride() or input_ids.stride() != graph.input_ids.stride():
            return None  # the backbone's compiled code was captured for the strides of vLLM's input buffers
        assert isinstance(context.attn_metadata, dict)
        steps = [context.attn_metadata[layer] for layer in self.layers]
        return graph.replay(input_ids, positions, steps)

    def _refuse_unsupported(self, metadata: dict[str, Any]) -> None:
        self.backends_checked = True
        unsupported = unsupported_backends(metadata)
        if unsupported:
            logger.warning(
                "lone prompts run vLLM's piecewise CUDA graphs: whole-forward graphs need FlashAttention and "
                "Gated DeltaNet metadata, this engine has %s",
                ", ".join(unsupported),
            )
            self.enabled = False

    def _capture_all(self, template: ForwardContext, input_ids: torch.Tensor, positions: torch.Tensor) -> bool:
        """Capture every size's graph; False (the reason logged, every later step left to vLLM) on failure."""
        assert isinstance(template.attn_metadata, dict)
        first_layer = {id(group): layer for layer, group in reversed(list(template.attn_metadata.items()))}
        self.layers = [first_layer[id(group)] for group in distinct(template.attn_metadata.values())]
        started = time.perf_counter()
        try:
            with capture_quietly():
                for size in self.sizes:
                    self.graphs[size] = self._capture(template, size, input_ids, positions)
        except Exception:
            logger.exception("capturing whole-forward CUDA graphs failed: lone prompts run vLLM's piecewise graphs")
            self.graphs.clear()
            self.enabled = False
            return False
        logger.info(
            "captured whole-forward CUDA graphs for lone prompts at %d sizes (%d to %d tokens) in %.2f s",
            len(self.sizes),
            self.sizes[-1],
            self.sizes[0],
            time.perf_counter() - started,
        )
        return True

    def _capture(
        self, template: ForwardContext, size: int, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> PromptGraph:
        assert isinstance(template.attn_metadata, dict)
        metadata = template.attn_metadata
        groups = [metadata_copy(metadata[layer], size) for layer in self.layers]
        by_group = {id(metadata[layer]): group for layer, group in zip(self.layers, groups, strict=True)}
        layer_metadata = {layer: by_group[id(group)].metadata for layer, group in metadata.items()}
        slots = {
            layer: copy.slot_mapping
            for layer, group in metadata.items()
            if isinstance(copy := by_group[id(group)], AttentionCopy)
        }
        context = dataclasses.replace(
            template,
            attn_metadata=layer_metadata,
            slot_mapping=slots,
            cudagraph_runtime_mode=CUDAGraphMode.NONE,
            batch_descriptor=None,
        )
        ids = laid_out_as(input_ids, size)
        pos = laid_out_as(positions, size)
        pool = next(iter(self.graphs.values())).graph.pool() if self.graphs else None
        graph = torch.cuda.CUDAGraph()
        with override_forward_context(context):
            self.backbone(ids, pos)  # kernels compiled and tuned for this size before capture
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                hidden_states = self.backbone(ids, pos)
        return PromptGraph(graph, ids, pos, groups, hidden_states)


def lone_prompt_graphs(vllm_config: VllmConfig, backbone: Backbone) -> LonePromptGraphs | None:
    """The engine's whole-forward graphs for lone prompts, or None (with the reason logged) when it cannot have them."""
    reason = why_not_graphed(vllm_config)
    if reason is not None:
        logger.info("lone prompts run vLLM's piecewise CUDA graphs: %s", reason)
        return None
    sizes = list(vllm_config.compilation_config.cudagraph_capture_sizes or [])
    if not sizes:
        logger.info("lone prompts run without CUDA graphs: the engine captures none")
        return None
    return LonePromptGraphs(backbone, sizes, whole_prompt_limit(vllm_config))
