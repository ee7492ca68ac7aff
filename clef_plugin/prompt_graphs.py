"""Whole-forward CUDA graphs for an engine step that runs a few prompts (one to four by default).

vLLM captures Clef's backbone as piecewise CUDA graphs: its attention and Gated DeltaNet layers run eagerly
between the graph pieces, because their metadata builders support full graphs for uniform decode batches only
(``GDNAttentionMetadataBuilder`` declares ``AttentionCGSupport.UNIFORM_BATCH``), and a pooling model never
decodes. A step of one or a few prompts is therefore bound by the host launching those layers' kernels, not by
the GPU.

A step padded by vLLM to one of its CUDA-graph sizes N (``cudagraph_capture_sizes``) can replay a graph of the
whole backbone instead: every launch is sized for N (host-side lengths, grids, chunk and program lists), while
the sequence bounds the kernels read from device memory (``query_start_loc``, ``seq_lens``, FLA's
``cu_seqlens``, its chunk lists and the causal convolution's program list) are the step's own, so attention, the
causal convolution and the delta rule stop at each prompt's last token exactly as in vLLM's own step, and the
padding rows (whatever they hold, NaN included) never meet a real token: neither as a key nor inside a chunk.
The padding's keys are not written to the KV cache (slot -1). Two families of graphs, one graph per size each:

- **lone**: a step that runs exactly one prompt, from its first token to its last (the one-client case). Its
  graph holds one sequence of N tokens; the step loads its bounds, KV-cache slots, block table and state slot.
- **few**: any other step of at most ``max_prompts`` prompts (``additional_config``
  ``clef_prompt_graphs_max_prompts``, default :data:`MAX_PROMPTS`; 1 captures the lone family only) whose
  sequences, earlier tokens included, fit in N. Its graph holds ``max_prompts + 1`` sequences: the step's
  prompts, then empty ones, the last always empty. Its launches are sized for the most work k ≤ ``max_prompts``
  prompts of N tokens in all can make: FLA's 64-token chunks (``ceil(N / 64) + max_prompts - 1``) and the
  convolution's 8-token programs (``ceil(N / 8) + max_prompts - 1``). A replay loads the step's own chunk and program
  lists and fills the rest with chunks of the last, empty sequence (they read nothing, write nothing, and index
  FLA's chunk states within the graph's) and with padding programs (which return at once). It also loads each
  prompt's initial-state flag, so a prompt continuing an earlier step starts from its stored state.

Every graph is captured at the first step that can take one (the predictor's warm-up sends a lone prompt before
the server reports ready): each against static copies of that step's attention metadata rebuilt for N tokens,
run once eagerly first on vLLM's null block (so every kernel is compiled and tuned before capture); the few
family's empty sequences keep their state in the null block, which vLLM never gives to a request. A replay copies
the step's inputs (token ids, or input embeddings on a vision engine), positions and metadata into the static
copies.

The graphs are on unless ``additional_config={"clef_prompt_graphs": false}`` turns them off. They are measured with
FLA's Triton Gated DeltaNet kernels on an H200 (BENCHMARKS.md: R24 for the lone family, R28 for the few family; R36
on a vision engine, an H100); with FlashInfer's Gated DeltaNet prefill, not yet measured under them, they run only
when that key is set to true.

This module is the one place that leans on vLLM's attention metadata (``FlashAttentionMetadata``,
``GDNAttentionMetadata`` and the helpers their builders call); tests pin the fields it reads and writes. Steps
with more prompts or more tokens than the largest size, decoding requests, or another attention backend run vLLM's
piecewise graphs, as does every step of an engine with tensor parallelism, ``--enforce-eager`` or the in-tree CuTe
DSL Gated DeltaNet prefill. A vision engine's steps, text or image, arrive as input embeddings (vLLM has run the
tower and merged its output before the step): its graphs are captured and replayed over those, with the step's
M-RoPE positions.

One module of ~550 lines on purpose: the capture, the replay and the launch sizing rest on the one padding
invariant described above (padding rows never meet a real token), and every part reads the same copied
metadata; split, each part would have to restate that invariant to be read on its own.
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

SWITCH = "clef_prompt_graphs"
"""``additional_config`` key: false turns the graphs off; true also asks for them over FlashInfer's Gated DeltaNet
prefill (see the module docstring)."""
RENAMED_SWITCH = "clef_lone_prompt_graphs"
"""The switch's name before the few family existed: refused, naming :data:`SWITCH`."""
MAX_PROMPTS_KEY = "clef_prompt_graphs_max_prompts"
"""``additional_config`` key: the most prompts a step may hold to replay a whole-forward graph."""
MAX_PROMPTS = 4
"""Default of :data:`MAX_PROMPTS_KEY`: four prompts of Clef's typical 512 tokens fill vLLM's largest graph size."""
MAX_PROMPTS_LIMIT = 64
NULL_BLOCK = 0
"""vLLM's null block: never given to a request; the capture runs' and the empty sequences' Gated DeltaNet state
goes there."""
PAD_SLOT = -1
"""A KV-cache slot that vLLM's cache writes skip, and the causal convolution's padding program."""
MEASURED_GDN_BACKENDS = ("triton",)
"""Gated DeltaNet prefill backends whose whole-forward graphs were measured right on a GPU: on by default."""
ASKED_GDN_BACKENDS = ("flashinfer",)
"""Gated DeltaNet prefill backends that read the metadata :class:`DeltaNetCopy` builds (FLA's layout), not yet
measured under the graphs: on only when ``additional_config`` sets :data:`SWITCH` to true."""

Backbone = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""The backbone's forward: (the step's inputs, positions [..., N]) → hidden states [N, hidden]. The inputs are token
ids [N] on a text engine, input embeddings [N, hidden] on a vision engine (vLLM's model runner gives a multimodal
model embeddings for every step, text-only ones too)."""


def additional_config(vllm_config: VllmConfig) -> dict[str, Any]:
    """The engine's ``additional_config`` (empty when unset)."""
    return vllm_config.additional_config if isinstance(vllm_config.additional_config, dict) else {}


def max_prompts(vllm_config: VllmConfig) -> int:
    """:data:`MAX_PROMPTS_KEY`, or :data:`MAX_PROMPTS`; ValueError when it is not a whole number from 1 to
    :data:`MAX_PROMPTS_LIMIT`."""
    value = additional_config(vllm_config).get(MAX_PROMPTS_KEY, MAX_PROMPTS)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PROMPTS_LIMIT:
        raise ValueError(
            f"additional_config {MAX_PROMPTS_KEY} must be a whole number from 1 to {MAX_PROMPTS_LIMIT}, got {value!r}"
        )
    return value


def why_not_graphed(vllm_config: VllmConfig) -> str | None:
    """Why an engine with ``vllm_config`` cannot replay whole-forward graphs, or None when it can.

    Raises ValueError when ``additional_config`` sets :data:`SWITCH` to anything but true or false, or names
    :data:`RENAMED_SWITCH`."""
    additional = additional_config(vllm_config)
    if RENAMED_SWITCH in additional:
        raise ValueError(f"additional_config {RENAMED_SWITCH} is now called {SWITCH} (it covers a few prompts a step)")
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


@dataclasses.dataclass(frozen=True)
class PromptStep:
    """What a prefill-only step holds, as its metadata says on the host."""

    prompts: int
    tokens: int
    longest: int
    """The longest sequence's tokens, earlier steps' included (FlashAttention's ``max_seq_len``)."""
    fresh: bool
    """Each prompt starts in this step (FlashAttention's ``max_seq_len == max_query_len``; exact for one prompt)."""


def prompt_step(context: ForwardContext) -> PromptStep | None:
    """The step's prompts when it runs prompts only (no decoding request, no speculative tokens) with FlashAttention
    and Gated DeltaNet metadata and vLLM pads it to a CUDA-graph size; None for any other step."""
    metadata = context.attn_metadata
    if context.cudagraph_runtime_mode != CUDAGraphMode.PIECEWISE or context.ubatch_slices is not None:
        return None
    if not isinstance(metadata, dict) or not metadata:
        return None
    shapes = set()
    longest, fresh, attention = 0, True, False
    for group in distinct(metadata.values()):
        if isinstance(group, GDNAttentionMetadata):
            if (
                group.num_prefills < 1
                or group.num_decodes
                or group.num_spec_decodes
                or group.spec_sequence_masks is not None
                or getattr(group, "checkpoint", None) is not None
            ):
                return None
            shapes.add((group.num_prefills, group.num_prefill_tokens))
        elif isinstance(group, FlashAttentionMetadata):
            if getattr(group, "use_cascade", False) or group.causal is not True:
                return None
            shapes.add((group.query_start_loc.numel() - 1, group.num_actual_tokens))
            longest = max(longest, group.max_seq_len)
            fresh = fresh and group.max_seq_len == group.max_query_len
            attention = True
        else:
            return None
    if len(shapes) != 1 or not attention:
        return None
    prompts, tokens = shapes.pop()
    return PromptStep(prompts, tokens, longest, fresh)


def unsupported_backends(metadata: dict[str, Any]) -> list[str]:
    """Names of the attention metadata types in ``metadata`` that this module cannot rebuild."""
    known = (GDNAttentionMetadata, FlashAttentionMetadata)
    return sorted({type(group).__name__ for group in metadata.values() if not isinstance(group, known)})


def distinct(groups: Iterable[Any]) -> list[Any]:
    """Each metadata object once, in order of first appearance (vLLM shares one among a KV-cache group's layers)."""
    return list({id(group): group for group in groups}.values())


def load_rows(static: torch.Tensor, live: torch.Tensor, rest: torch.Tensor | float) -> None:
    """``live`` into the first rows of ``static``; the rows after it get ``rest`` (a value, or a one-row tensor
    repeated: read on the device, never on the host)."""
    count = live.shape[0]
    static[:count].copy_(live)
    if count == static.shape[0]:
        return
    if isinstance(rest, torch.Tensor):
        static[count:].copy_(rest.expand(static.shape[0] - count, *rest.shape[1:]))
    else:
        static[count:].fill_(rest)


def sequence_bounds(tokens: int, sequences: int) -> torch.Tensor:
    """Bounds of ``sequences`` sequences on the host: the first holds all ``tokens``, the others none."""
    return torch.tensor([0] + [tokens] * sequences, dtype=torch.int32)


class AttentionCopy:
    """Static full-attention metadata for ``sequences`` sequences in launches for ``tokens`` tokens; :meth:`load`
    takes a step's sequence bounds, lengths, slots and block table rows (the sequences after its own: empty)."""

    def __init__(self, template: FlashAttentionMetadata, tokens: int, sequences: int = 1) -> None:
        """Rebuild ``template`` (a step's metadata) for ``tokens`` tokens with buffers of its own."""
        device = template.query_start_loc.device
        self.slot_mapping = torch.full((tokens,), PAD_SLOT, dtype=template.slot_mapping.dtype, device=device)
        self.block_table = torch.full(
            (sequences, template.block_table.shape[1]), NULL_BLOCK, dtype=template.block_table.dtype, device=device
        )
        bounds = sequence_bounds(tokens, sequences)
        self.query_start_loc = bounds.to(dtype=template.query_start_loc.dtype, device=device)
        self.seq_lens = bounds.diff().to(dtype=template.seq_lens.dtype, device=device)
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
        """The step's sequence bounds, lengths, KV-cache slots (the padding's stay -1) and block table rows."""
        prompts = step.query_start_loc.numel() - 1
        load_rows(self.query_start_loc, step.query_start_loc, step.query_start_loc[-1:])
        load_rows(self.seq_lens, step.seq_lens[:prompts], 0)
        load_rows(self.slot_mapping, step.slot_mapping, PAD_SLOT)
        load_rows(self.block_table, step.block_table[:prompts], NULL_BLOCK)


class DeltaNetCopy:
    """Static Gated DeltaNet metadata for ``sequences`` sequences in launches for ``tokens`` tokens; :meth:`load`
    takes a step's sequence bounds and state slots, and with several sequences its initial-state flags and its
    chunk and program lists."""

    def __init__(self, template: GDNAttentionMetadata, tokens: int, sequences: int = 1) -> None:
        """Rebuild ``template`` (a step's metadata) for ``tokens`` tokens with buffers of its own."""
        assert template.prefill_state_indices is not None and template.prefill_query_start_loc is not None
        device = template.prefill_state_indices.device
        self.sequences = sequences
        bounds_cpu = sequence_bounds(tokens, sequences).to(template.prefill_query_start_loc.dtype)
        self.bounds = bounds_cpu.to(device)
        self.state_slots = torch.full(
            (sequences,), NULL_BLOCK, dtype=template.prefill_state_indices.dtype, device=device
        )
        self.initial = torch.zeros(sequences, dtype=torch.bool, device=device)
        conv_plan, self.batch_ptr, self.program_offsets = compute_causal_conv1d_metadata(bounds_cpu, device=device)
        ((self.block_m, plan),) = conv_plan.items()  # vLLM 0.26 runs one program height (8 tokens)
        chunks = prepare_chunk_indices(bounds_cpu, FLA_CHUNK_SIZE)
        # Room for the most programs and chunks k <= `sequences - 1` prompts of `tokens` tokens in all make:
        # ceil(tokens / height) + k - 1 of each (a chunk or program less than that for each prompt but the last)
        extra = max(sequences - 2, 0)
        self.programs = int(plan["tot"]) if sequences == 1 else -(-tokens // self.block_m) + extra
        room = chunks.shape[0] if sequences == 1 else -(-tokens // FLA_CHUNK_SIZE) + extra
        # the chunk list's rest: chunks of the last sequence, always empty, from its own chunk offset on
        self.empty_chunks = torch.stack([torch.full((room,), sequences - 1), torch.arange(room)], 1).to(chunks)
        self.chunk_indices = torch.cat([chunks, self.empty_chunks[: room - chunks.shape[0]]]).to(device)
        self.empty_chunks = self.empty_chunks.to(device)
        self.chunk_offsets = prepare_chunk_offsets(bounds_cpu, FLA_CHUNK_SIZE).to(device)
        self.metadata = dataclasses.replace(
            template,
            num_prefills=sequences,
            num_prefill_tokens=tokens,
            num_actual_tokens=tokens,
            has_initial_state=self.initial,
            prefill_has_initial_state=self.initial,
            non_spec_query_start_loc=self.bounds,
            prefill_query_start_loc=self.bounds,
            non_spec_state_indices_tensor=self.state_slots,
            prefill_state_indices=self.state_slots,
            chunk_indices=self.chunk_indices,
            chunk_offsets=self.chunk_offsets,
            nums_dict={self.block_m: {**plan, "tot": self.programs}},
            batch_ptr=self.batch_ptr,
            token_chunk_offset_ptr=self.program_offsets,
        )

    def fits(self, step: GDNAttentionMetadata) -> bool:
        """Whether the step's chunk and program lists fit in the launches (always, for a step this copy's size
        takes)."""
        if self.sequences == 1:
            return True
        assert step.chunk_indices is not None and step.nums_dict is not None
        return (
            step.num_prefills < self.sequences
            and step.chunk_indices.shape[0] <= self.chunk_indices.shape[0]
            and int(step.nums_dict[self.block_m]["tot"]) <= self.programs
        )

    def load(self, step: GDNAttentionMetadata) -> None:
        """The step's sequence bounds (FLA's ``cu_seqlens``: the chunks past them load zeros and store nothing) and
        state slots; with several sequences also its initial-state flags, chunk list and chunk offsets, and the
        convolution's programs."""
        assert step.prefill_state_indices is not None and step.prefill_query_start_loc is not None
        prompts = step.num_prefills
        load_rows(self.bounds, step.prefill_query_start_loc[: prompts + 1], step.prefill_query_start_loc[prompts:])
        load_rows(self.state_slots, step.prefill_state_indices[:prompts], NULL_BLOCK)
        if self.sequences == 1:
            return  # a lone prompt's graph takes fresh prompts only, in chunks and programs of one sequence
        assert step.prefill_has_initial_state is not None and step.chunk_indices is not None
        assert step.chunk_offsets is not None and step.batch_ptr is not None and step.nums_dict is not None
        assert step.token_chunk_offset_ptr is not None
        load_rows(self.initial, step.prefill_has_initial_state[:prompts], False)
        chunks = step.chunk_indices.shape[0]
        self.chunk_indices[:chunks].copy_(step.chunk_indices)
        self.chunk_indices[chunks:].copy_(self.empty_chunks[: self.chunk_indices.shape[0] - chunks])
        load_rows(self.chunk_offsets, step.chunk_offsets[: prompts + 1], step.chunk_offsets[prompts:])
        programs = int(step.nums_dict[self.block_m]["tot"])
        for static, live in ((self.batch_ptr, step.batch_ptr), (self.program_offsets, step.token_chunk_offset_ptr)):
            load_rows(static[: self.programs], live[:programs], PAD_SLOT)


MetadataCopy = AttentionCopy | DeltaNetCopy


def metadata_copy(template: Any, tokens: int, sequences: int) -> MetadataCopy:
    """The static copy of one KV-cache group's metadata for ``tokens`` tokens in ``sequences`` sequences."""
    if isinstance(template, GDNAttentionMetadata):
        return DeltaNetCopy(template, tokens, sequences)
    return AttentionCopy(template, tokens, sequences)


@dataclasses.dataclass
class PromptGraph:
    """One size's graph, its static inputs and metadata copies (one per KV-cache group), and its output."""

    graph: torch.cuda.CUDAGraph
    inputs: torch.Tensor
    """Token ids [N] or input embeddings [N, hidden], as the step that captured the graph had them."""
    positions: torch.Tensor
    groups: list[MetadataCopy]
    hidden_states: torch.Tensor

    def fits(self, steps: list[Any]) -> bool:
        """Whether the step (each group's metadata, in the order of :attr:`groups`) fits in this graph's launches."""
        return all(
            group.fits(step) for group, step in zip(self.groups, steps, strict=True) if isinstance(group, DeltaNetCopy)
        )

    def takes(self, inputs: torch.Tensor, positions: torch.Tensor) -> bool:
        """Whether the step's inputs are laid out as the captured ones: the backbone's compiled code was captured for
        the kind (token ids or embeddings) and the strides of vLLM's input buffers."""
        return (
            inputs.dtype == self.inputs.dtype
            and inputs.shape[1:] == self.inputs.shape[1:]
            and inputs.stride() == self.inputs.stride()
            and positions.stride() == self.positions.stride()
        )

    def replay(self, inputs: torch.Tensor, positions: torch.Tensor, steps: list[Any]) -> torch.Tensor:
        """Run the step (its inputs and each group's metadata, in the order of :attr:`groups`) through the graph."""
        self.inputs.copy_(inputs)
        self.positions.copy_(positions)
        for group, step in zip(self.groups, steps, strict=True):
            group.load(step)
        self.graph.replay()
        return self.hidden_states.clone()


def laid_out_as(step_input: torch.Tensor, size: int, token_axis: int) -> torch.Tensor:
    """A zero buffer for ``size`` tokens (along ``token_axis``) with the strides of ``step_input``: vLLM passes views
    of its persistent input buffers (M-RoPE positions: ``[3, size]`` rows of a ``[3, max_tokens]`` buffer;
    embeddings: the first ``size`` rows of a ``[max_tokens, hidden]`` one), and the backbone's compiled code reads
    them with those strides, whatever strides a buffer of its own would have."""
    shape = list(step_input.shape)
    shape[token_axis] = size
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


LONE = 1
"""The lone family's sequences."""


class PromptGraphs:
    """The whole-forward graphs of one engine, captured at its first step that can take one (see the module
    docstring)."""

    def __init__(self, backbone: Backbone, sizes: Sequence[int], whole_below: int, max_prompts: int) -> None:
        """``backbone`` runs the model; ``sizes``: vLLM's CUDA-graph sizes; ``whole_below``:
        :func:`whole_prompt_limit`; ``max_prompts``: the few family's most prompts (1: none of that family)."""
        self.backbone = backbone
        self.sizes = sorted(set(sizes), reverse=True)
        self.whole_below = whole_below
        self.max_prompts = max_prompts
        self.few = max_prompts + 1 if max_prompts > 1 else None  # the few family's sequences, when it has graphs
        self.families = [LONE] if self.few is None else [LONE, self.few]
        self.graphs: dict[tuple[int, int], PromptGraph] = {}  # (family's sequences, size) → graph
        self.layers: list[str] = []  # each group's first layer: where a step's metadata for that group is found
        self.enabled = True
        self.backends_checked = False

    def family(self, step: PromptStep, size: int) -> int | None:
        """The family whose graph of ``size`` tokens takes ``step`` (its sequences), or None."""
        if step.prompts == 1 and step.fresh and step.tokens < self.whole_below:
            return LONE
        if self.few is not None and step.prompts <= self.max_prompts and step.longest <= size:
            return self.few
        return None

    def forward(self, inputs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | None:
        """The step's hidden states from a graph when one takes the step (its token ids [N] or input embeddings
        [N, hidden], and positions); None otherwise."""
        if not self.enabled:
            return None
        context = get_forward_context()
        step = prompt_step(context)
        if step is None:
            if not self.backends_checked and isinstance(context.attn_metadata, dict) and context.attn_metadata:
                self._refuse_unsupported(context.attn_metadata)
            return None
        size = inputs.shape[0]
        family = self.family(step, size) if size in self.sizes else None
        if family is None:
            return None
        if not self.graphs and not self._capture_all(context, inputs, positions):
            return None
        graph = self.graphs[(family, size)]
        if not graph.takes(inputs, positions):
            return None
        assert isinstance(context.attn_metadata, dict)
        steps = [context.attn_metadata[layer] for layer in self.layers]
        if not graph.fits(steps):
            return None
        return graph.replay(inputs, positions, steps)

    def _refuse_unsupported(self, metadata: dict[str, Any]) -> None:
        self.backends_checked = True
        unsupported = unsupported_backends(metadata)
        if unsupported:
            logger.warning(
                "steps run vLLM's piecewise CUDA graphs: whole-forward graphs need FlashAttention and "
                "Gated DeltaNet metadata, this engine has %s",
                ", ".join(unsupported),
            )
            self.enabled = False

    def _capture_all(self, template: ForwardContext, inputs: torch.Tensor, positions: torch.Tensor) -> bool:
        """Capture every family's graph of every size; False (the reason logged, every later step left to vLLM) on
        failure."""
        assert isinstance(template.attn_metadata, dict)
        first_layer = {id(group): layer for layer, group in reversed(list(template.attn_metadata.items()))}
        self.layers = [first_layer[id(group)] for group in distinct(template.attn_metadata.values())]
        started = time.perf_counter()
        try:
            with capture_quietly():
                for sequences in self.families:
                    for size in self.sizes:
                        self.graphs[(sequences, size)] = self._capture(template, size, sequences, inputs, positions)
        except Exception:
            logger.exception("capturing whole-forward CUDA graphs failed: every step runs vLLM's piecewise graphs")
            self.graphs.clear()
            self.enabled = False
            return False
        logger.info(
            "captured whole-forward CUDA graphs for steps of 1 to %d prompt(s) at %d sizes (%d to %d tokens) in %.2f s",
            self.max_prompts,
            len(self.sizes),
            self.sizes[-1],
            self.sizes[0],
            time.perf_counter() - started,
        )
        return True

    def _capture(
        self, template: ForwardContext, size: int, sequences: int, inputs: torch.Tensor, positions: torch.Tensor
    ) -> PromptGraph:
        assert isinstance(template.attn_metadata, dict)
        metadata = template.attn_metadata
        groups = [metadata_copy(metadata[layer], size, sequences) for layer in self.layers]
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
        step_inputs = laid_out_as(inputs, size, token_axis=0)
        pos = laid_out_as(positions, size, token_axis=-1)
        pool = next(iter(self.graphs.values())).graph.pool() if self.graphs else None
        graph = torch.cuda.CUDAGraph()
        with override_forward_context(context):
            self.backbone(step_inputs, pos)  # kernels compiled and tuned for this size before capture
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                hidden_states = self.backbone(step_inputs, pos)
        return PromptGraph(graph, step_inputs, pos, groups, hidden_states)


def whole_forward_graphs(vllm_config: VllmConfig, backbone: Backbone) -> PromptGraphs | None:
    """The engine's whole-forward graphs, or None (with the reason logged) when it cannot have them; ValueError for
    a bad ``additional_config`` key of theirs, whatever the engine."""
    most = max_prompts(vllm_config)
    reason = why_not_graphed(vllm_config)
    if reason is not None:
        logger.info("steps run vLLM's piecewise CUDA graphs: %s", reason)
        return None
    sizes = list(vllm_config.compilation_config.cudagraph_capture_sizes or [])
    if not sizes:
        logger.info("steps run without CUDA graphs: the engine captures none")
        return None
    return PromptGraphs(backbone, sizes, whole_prompt_limit(vllm_config), most)
