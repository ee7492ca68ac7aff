"""Whole-forward graphs for steps of a few prompts (clef_plugin.prompt_graphs): which steps take them, and the
static metadata rebuilt from vLLM's own dataclasses and helpers for N tokens (these tests pin the fields it reads
and writes, and walk the chunk and program lists as FLA's and the convolution's kernels do). The capture itself
needs CUDA: the ``test_replay_*`` tests."""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.config import CUDAGraphMode
from vllm.forward_context import ForwardContext, get_forward_context, override_forward_context
from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices, prepare_chunk_offsets
from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE
from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata
from vllm.v1.attention.backends.utils import compute_causal_conv1d_metadata

from clef_plugin import prompt_graphs
from clef_plugin.prompt_graphs import (
    MAX_PROMPTS,
    MAX_PROMPTS_KEY,
    NULL_BLOCK,
    PAD_SLOT,
    RENAMED_SWITCH,
    SWITCH,
    AttentionCopy,
    DeltaNetCopy,
    PromptGraph,
    PromptGraphs,
    PromptStep,
    gdn_backend_refusal,
    laid_out_as,
    max_prompts,
    prompt_step,
    unsupported_backends,
    whole_forward_graphs,
    whole_prompt_limit,
    why_not_graphed,
)

pytestmark = pytest.mark.vllm

BLOCKS = 6


def version_fields(metadata_type: type) -> dict[str, Any]:
    """The required fields other vLLM versions add (cascade attention's: ``use_cascade``, its prefix lengths),
    as vLLM's builder fills them for a step without cascade attention."""
    common = {"num_actual_tokens", "max_query_len", "query_start_loc", "max_seq_len", "seq_lens", "block_table"}
    common |= {"slot_mapping"}
    required = [
        field
        for field in dataclasses.fields(metadata_type)
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    ]
    return {
        field.name: (False if field.type in (bool, "bool") else 0 if field.type in (int, "int") else None)
        for field in required
        if field.name not in common
    }


def attention(lengths: list[int], context: int = 0, padded_to: int | None = None, device: str = "cpu") -> Any:
    """FlashAttention metadata as vLLM's builder makes it for prompts of ``lengths`` after ``context`` tokens."""
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    tokens = sum(lengths)
    slots = torch.arange(100, 100 + (padded_to or tokens), dtype=torch.int64, device=device)
    slots[tokens:] = PAD_SLOT
    return FlashAttentionMetadata(
        **version_fields(FlashAttentionMetadata),
        num_actual_tokens=tokens,
        max_query_len=max(lengths),
        query_start_loc=bounds,
        max_seq_len=max(lengths) + context,
        seq_lens=torch.tensor([length + context for length in lengths], dtype=torch.int32, device=device),
        block_table=torch.arange(7, 7 + len(lengths) * BLOCKS, dtype=torch.int32, device=device).view(-1, BLOCKS),
        slot_mapping=slots,
    )


def delta_net(
    prefills: list[int], decodes: int = 0, slot: int = 5, initial: list[bool] | None = None, device: str = "cpu"
) -> Any:
    """Gated DeltaNet metadata for ``prefills`` prompts (and ``decodes`` decoding requests), with FLA's chunk lists and
    the convolution's programs as vLLM's builder makes them; ``initial``: which prompts continue an earlier step."""
    requests = decodes + len(prefills)
    bounds_cpu = torch.tensor([0, *torch.tensor(prefills).cumsum(0).tolist()], dtype=torch.int32)
    bounds = bounds_cpu.to(device)
    flags = torch.tensor(initial if initial is not None else [False] * len(prefills), device=device)
    programs, batch_ptr, program_offsets = compute_causal_conv1d_metadata(bounds_cpu, device=torch.device(device))
    return GDNAttentionMetadata(
        num_prefills=len(prefills),
        num_prefill_tokens=sum(prefills),
        num_decodes=decodes,
        num_decode_tokens=decodes,
        num_spec_decodes=0,
        num_spec_decode_tokens=0,
        num_actual_tokens=sum(prefills) + decodes,
        has_initial_state=torch.cat([torch.zeros(decodes, dtype=torch.bool, device=device), flags]),
        non_spec_query_start_loc=bounds,
        prefill_query_start_loc=bounds,
        non_spec_state_indices_tensor=torch.arange(slot, slot + requests, dtype=torch.int32, device=device),
        prefill_state_indices=torch.arange(slot, slot + len(prefills), dtype=torch.int32, device=device),
        prefill_has_initial_state=flags,
        chunk_indices=prepare_chunk_indices(bounds_cpu, FLA_CHUNK_SIZE).to(device),
        chunk_offsets=prepare_chunk_offsets(bounds_cpu, FLA_CHUNK_SIZE).to(device),
        nums_dict=programs,
        batch_ptr=batch_ptr,
        token_chunk_offset_ptr=program_offsets,
    )


def step(
    groups: dict[str, list[str]],
    metadata: dict[str, Any],
    mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE,
) -> ForwardContext:
    """A forward context: each group's layers share that group's metadata object, as vLLM's runner builds them."""
    by_layer = {layer: metadata[group] for group, layers in groups.items() for layer in layers}
    slots = {name: group.slot_mapping for name, group in by_layer.items() if isinstance(group, FlashAttentionMetadata)}
    return ForwardContext(no_compile_layers={}, attn_metadata=by_layer, slot_mapping=slots, cudagraph_runtime_mode=mode)


LAYERS = {"linear": ["layers.0.linear_attn", "layers.1.linear_attn"], "full": ["layers.2.self_attn"]}
FEW = MAX_PROMPTS + 1
"""The few family's sequences."""


def prompts(
    lengths: list[int],
    padded_to: int | None = None,
    slot: int = 5,
    context: int = 0,
    initial: list[bool] | None = None,
    device: str = "cpu",
) -> ForwardContext:
    """A step of prompts of ``lengths`` (after ``context`` earlier tokens each), padded to ``padded_to`` tokens."""
    return step(
        LAYERS,
        {
            "linear": delta_net(lengths, slot=slot, initial=initial, device=device),
            "full": attention(lengths, context, padded_to, device),
        },
    )


def lone(length: int, padded_to: int | None = None, slot: int = 5, device: str = "cpu") -> ForwardContext:
    return prompts([length], padded_to, slot, device=device)


def group(context: ForwardContext, name: str) -> Any:
    assert isinstance(context.attn_metadata, dict)
    return context.attn_metadata[LAYERS[name][0]]


def test_a_lone_fresh_prompt_is_recognised() -> None:
    assert prompt_step(lone(300)) == PromptStep(prompts=1, tokens=300, longest=300, fresh=True)


def test_several_prompts_and_a_later_chunk_are_recognised() -> None:
    assert prompt_step(prompts([300, 60])) == PromptStep(prompts=2, tokens=360, longest=300, fresh=True)
    later = prompts([300], context=512, initial=[True])
    assert prompt_step(later) == PromptStep(prompts=1, tokens=300, longest=812, fresh=False)


@pytest.mark.parametrize(
    ("metadata", "mode"),
    [
        ({"linear": delta_net([300], decodes=1), "full": attention([300])}, CUDAGraphMode.PIECEWISE),
        ({"linear": delta_net([300]), "full": attention([300])}, CUDAGraphMode.NONE),
        ({"linear": delta_net([300]), "full": attention([299])}, CUDAGraphMode.PIECEWISE),
        ({"linear": delta_net([300, 60]), "full": attention([360])}, CUDAGraphMode.PIECEWISE),
        ({"linear": delta_net([300]), "full": object()}, CUDAGraphMode.PIECEWISE),
    ],
    ids=["with-a-decode", "not-a-graph-size", "disagreeing-tokens", "disagreeing-prompts", "other-backend"],
)
def test_other_steps_are_left_to_vllm(metadata: dict[str, Any], mode: CUDAGraphMode) -> None:
    assert prompt_step(step(LAYERS, metadata, mode)) is None


def test_each_step_goes_to_the_family_that_can_take_it() -> None:
    graphs = PromptGraphs(lambda ids, pos: ids, [256, 384], whole_below=1024, max_prompts=MAX_PROMPTS)
    assert graphs.family(PromptStep(1, 300, 300, fresh=True), 384) == 1
    assert graphs.family(PromptStep(2, 360, 300, fresh=True), 384) == FEW
    assert graphs.family(PromptStep(MAX_PROMPTS, 384, 96, fresh=True), 384) == FEW
    assert graphs.family(PromptStep(MAX_PROMPTS + 1, 380, 76, fresh=True), 384) is None
    assert graphs.family(PromptStep(1, 300, 350, fresh=False), 384) == FEW  # a later chunk: from its stored state
    assert graphs.family(PromptStep(1, 300, 812, fresh=False), 384) is None  # its sequence outgrows the graph
    chunked = PromptGraphs(lambda ids, pos: ids, [2048], whole_below=1024, max_prompts=MAX_PROMPTS)
    assert chunked.family(PromptStep(1, 1024, 1024, fresh=True), 2048) == FEW  # maybe a longer prompt's first chunk
    lone_only = PromptGraphs(lambda ids, pos: ids, [256, 384], whole_below=1024, max_prompts=1)
    assert lone_only.families == [1]
    assert lone_only.family(PromptStep(1, 300, 300, fresh=True), 384) == 1
    assert lone_only.family(PromptStep(2, 360, 300, fresh=True), 384) is None
    assert lone_only.family(PromptStep(1, 300, 350, fresh=False), 384) is None


def test_unsupported_backends_are_named() -> None:
    class TritonAttentionMetadata:
        pass

    context = step(LAYERS, {"linear": delta_net([300]), "full": TritonAttentionMetadata()})
    assert isinstance(context.attn_metadata, dict)
    assert unsupported_backends(context.attn_metadata) == ["TritonAttentionMetadata"]


def test_the_attention_copy_runs_the_padded_prompt_as_one_sequence_and_loads_each_steps_slots() -> None:
    live = group(lone(300, padded_to=384), "full")
    copy = AttentionCopy(live, 384)
    static = copy.metadata
    assert (static.num_actual_tokens, static.max_query_len, static.max_seq_len) == (384, 384, 384)
    assert static.query_start_loc.tolist() == [0, 384] and static.seq_lens.tolist() == [384]
    assert static.scheduler_metadata is None and static.max_num_splits == 0
    assert static.slot_mapping is copy.slot_mapping and static.block_table is copy.block_table
    assert copy.slot_mapping.tolist() == [PAD_SLOT] * 384 and copy.block_table.tolist() == [[NULL_BLOCK] * BLOCKS]
    assert live.num_actual_tokens == 300 and live.query_start_loc.tolist() == [0, 300]  # the template is untouched

    copy.load(live)
    assert static.query_start_loc.tolist() == [0, 300] and static.seq_lens.tolist() == [300]  # the step's bounds
    assert static.max_query_len == 384  # in launches sized for 384 tokens
    assert copy.slot_mapping[:300].tolist() == list(range(100, 400))
    assert copy.slot_mapping[300:].tolist() == [PAD_SLOT] * 84
    assert copy.block_table.tolist() == live.block_table.tolist()

    shorter = attention([200])  # a slot mapping vLLM did not pad: the rest is the padding's, never written
    copy.load(shorter)
    assert copy.slot_mapping[:200].tolist() == list(range(100, 300))
    assert copy.slot_mapping[200:].tolist() == [PAD_SLOT] * 184


def test_the_few_familys_attention_copy_loads_the_steps_prompts_then_empty_sequences() -> None:
    copy = AttentionCopy(group(lone(300, padded_to=384), "full"), 384, FEW)
    static = copy.metadata
    assert static.query_start_loc.tolist() == [0] + [384] * FEW  # captured as one sequence of 384 tokens
    assert static.seq_lens.tolist() == [384] + [0] * MAX_PROMPTS
    assert copy.block_table.shape == (FEW, BLOCKS)

    live = attention([300, 60], context=40, padded_to=384)
    copy.load(live)
    assert static.query_start_loc.tolist() == [0, 300, 360] + [360] * (FEW - 2)
    assert static.seq_lens.tolist() == [340, 100] + [0] * (FEW - 2)  # earlier tokens included: read from the cache
    assert copy.block_table[:2].tolist() == live.block_table.tolist()
    assert copy.block_table[2:].tolist() == [[NULL_BLOCK] * BLOCKS] * (FEW - 2)
    assert copy.slot_mapping[:360].tolist() == list(range(100, 460)) and set(copy.slot_mapping[360:].tolist()) == {-1}
    assert (static.max_query_len, static.max_seq_len) == (384, 384)

    copy.load(attention([200]))  # a step of fewer prompts empties the sequences the last one held
    assert static.query_start_loc.tolist() == [0] + [200] * FEW
    assert static.seq_lens.tolist() == [200] + [0] * MAX_PROMPTS
    assert copy.block_table[1:].tolist() == [[NULL_BLOCK] * BLOCKS] * MAX_PROMPTS


def test_the_delta_net_copy_is_one_fresh_sequence_of_n_tokens_in_fla_chunks() -> None:
    live = delta_net([300], slot=9)
    copy = DeltaNetCopy(live, 384)
    static = copy.metadata
    assert (static.num_prefills, static.num_prefill_tokens, static.num_actual_tokens) == (1, 384, 384)
    assert static.prefill_query_start_loc.tolist() == [0, 384]
    assert static.non_spec_query_start_loc is static.prefill_query_start_loc
    assert static.has_initial_state.tolist() == [False] and static.prefill_has_initial_state.tolist() == [False]
    assert static.chunk_indices.tolist() == [[0, chunk] for chunk in range(6)]  # FLA's 64-token chunks
    assert static.chunk_offsets.tolist() == [0, 6]
    assert static.nums_dict is not None and static.nums_dict[8]["tot"] == 48  # the convolution's 8-token programs
    assert static.nums_dict[8]["batch_ptr"] is static.batch_ptr
    assert static.prefill_state_indices is copy.state_slots and static.non_spec_state_indices_tensor is copy.state_slots
    assert copy.state_slots.tolist() == [NULL_BLOCK]

    copy.load(live)
    assert copy.state_slots.tolist() == [9]
    assert static.prefill_query_start_loc.tolist() == [0, 300]  # the step's bounds: FLA stops at its last token
    assert static.chunk_indices.shape == (6, 2)  # in launches sized for 384 tokens


def test_the_few_familys_delta_net_copy_has_room_for_any_few_prompts() -> None:
    copy = DeltaNetCopy(delta_net([300]), 384, FEW)
    static = copy.metadata
    assert static.num_prefills == FEW and static.prefill_query_start_loc.tolist() == [0] + [384] * FEW
    empty = [[FEW - 1, chunk] for chunk in range(MAX_PROMPTS - 1)]
    assert static.chunk_indices.tolist() == [[0, chunk] for chunk in range(6)] + empty
    assert static.chunk_offsets.tolist() == [0] + [6] * FEW
    assert static.nums_dict is not None and static.nums_dict[8]["tot"] == 48 + MAX_PROMPTS - 1
    assert static.nums_dict[8]["batch_ptr"] is static.batch_ptr

    live = delta_net([300, 60], slot=9, initial=[False, True])
    assert copy.fits(live)
    copy.load(live)
    assert static.prefill_query_start_loc.tolist() == [0, 300] + [360] * (FEW - 1)
    assert copy.state_slots.tolist() == [9, 10] + [NULL_BLOCK] * (FEW - 2)
    assert static.prefill_has_initial_state.tolist() == [False, True] + [False] * (FEW - 2)
    assert static.has_initial_state is static.prefill_has_initial_state
    chunks = [[0, chunk] for chunk in range(5)] + [[1, 0]]
    assert static.chunk_indices.tolist() == chunks + [[FEW - 1, chunk] for chunk in range(9 - len(chunks))]
    assert static.chunk_offsets.tolist() == [0, 5] + [6] * (FEW - 1)
    programs = 38 + 8  # ceil(300 / 8) + ceil(60 / 8)
    assert static.batch_ptr[:programs].tolist() == [0] * 38 + [1] * 8
    assert static.batch_ptr[programs : 47 + MAX_PROMPTS].tolist() == [PAD_SLOT] * (47 + MAX_PROMPTS - programs)
    assert static.token_chunk_offset_ptr[:programs].tolist() == list(range(38)) + list(range(8))


def fla_rows(metadata: Any, chunk_states: int) -> list[int]:
    """Walk the chunk list as FLA's chunked kernels do: each entry (sequence, chunk) covers the rows of that chunk
    that lie inside the sequence's bounds, and reads FLA's chunk state at the sequence's chunk offset plus the chunk
    (which must lie inside the ``chunk_states`` the launch allocates)."""
    bounds = metadata.prefill_query_start_loc.tolist()
    offsets = metadata.chunk_offsets.tolist()
    rows = []
    for sequence, chunk in metadata.chunk_indices.tolist():
        assert 0 <= offsets[sequence] + chunk < chunk_states
        start = bounds[sequence] + chunk * FLA_CHUNK_SIZE
        rows += range(start, min(start + FLA_CHUNK_SIZE, bounds[sequence + 1]))
    return rows


def conv_rows(metadata: Any) -> list[int]:
    """Walk the convolution's programs as its kernel does: a padding program returns, any other covers its
    sequence's block of 8 tokens."""
    bounds = metadata.non_spec_query_start_loc.tolist()
    total = metadata.nums_dict[8]["tot"]
    rows = []
    for sequence, block in zip(
        metadata.batch_ptr[:total].tolist(), metadata.token_chunk_offset_ptr[:total].tolist(), strict=True
    ):
        if sequence == PAD_SLOT:
            continue
        start = bounds[sequence] + 8 * block
        rows += range(start, min(start + 8, bounds[sequence + 1]))
    return rows


@pytest.mark.parametrize("size", [16, 64, 384, 520, 2048])
def test_any_few_prompts_that_fit_a_size_run_every_real_row_once_and_nothing_else(size: int) -> None:
    copy = DeltaNetCopy(delta_net([size]), size, FEW)
    generator = torch.Generator().manual_seed(size)
    # the most chunks and programs: one-token prompts, then one of the rest (ceil(N / 64) + k - 1 chunks)
    worst = [[1] * (count - 1) + [size - count + 1] for count in range(1, MAX_PROMPTS + 1)]
    for trial in range(200):
        count = 1 + trial % MAX_PROMPTS
        tokens = int(torch.randint(count, size + 1, (1,), generator=generator))
        cuts = sorted(torch.randperm(tokens - 1, generator=generator)[: count - 1].add(1).tolist())
        worst.append([end - start for start, end in zip([0, *cuts], [*cuts, tokens], strict=True)])
    for lengths in worst:
        tokens = sum(lengths)
        live = delta_net(lengths)
        assert copy.fits(live), lengths
        copy.load(live)
        assert sorted(fla_rows(copy.metadata, copy.chunk_indices.shape[0])) == list(range(tokens)), lengths
        assert sorted(conv_rows(copy.metadata)) == list(range(tokens)), lengths


def test_a_step_of_more_prompts_than_the_family_holds_does_not_fit() -> None:
    copy = DeltaNetCopy(delta_net([384]), 384, FEW)
    assert not copy.fits(delta_net([64] * FEW))
    assert DeltaNetCopy(delta_net([384]), 384).fits(delta_net([64] * FEW))  # a lone graph never meets such a step


def config(**overrides: Any) -> Any:
    settings: dict[str, Any] = {
        "additional_config": {},
        "enforce_eager": False,
        "cudagraph_mode": CUDAGraphMode.PIECEWISE,
        "world_size": 1,
        "max_num_batched_tokens": 16384,
        "long_prefill_token_threshold": 0,
        "vision": None,
    }
    settings.update(overrides)
    vision = settings["vision"]
    multimodal = None if vision is None else SimpleNamespace(language_model_only=not vision)
    return SimpleNamespace(
        additional_config=settings["additional_config"],
        model_config=SimpleNamespace(
            enforce_eager=settings["enforce_eager"], hf_text_config=SimpleNamespace(), multimodal_config=multimodal
        ),
        compilation_config=SimpleNamespace(cudagraph_mode=settings["cudagraph_mode"]),
        parallel_config=SimpleNamespace(world_size=settings["world_size"]),
        scheduler_config=SimpleNamespace(
            max_num_batched_tokens=settings["max_num_batched_tokens"],
            long_prefill_token_threshold=settings["long_prefill_token_threshold"],
        ),
    )


def test_the_graphs_are_on_unless_turned_off_and_need_a_cuda_engine() -> None:
    assert why_not_graphed(config(additional_config={SWITCH: False})) == f"additional_config sets {SWITCH} to false"
    for settings in ({}, {SWITCH: True}):
        if not torch.cuda.is_available():
            assert why_not_graphed(config(additional_config=settings)) == "the engine does not run on a CUDA GPU"
        else:
            assert why_not_graphed(config(additional_config=settings, enforce_eager=True)) == "the engine runs eagerly"
            split = config(additional_config=settings, world_size=2)
            assert why_not_graphed(split) == "the engine is split over several GPUs"


@pytest.mark.parametrize("value", ["true", 1, None])
def test_a_switch_that_is_not_a_boolean_is_refused_by_name(value: object) -> None:
    with pytest.raises(ValueError, match=f"additional_config {SWITCH} must be true or false"):
        why_not_graphed(config(additional_config={SWITCH: value}))


def test_the_switchs_earlier_name_is_refused_naming_the_new_one() -> None:
    with pytest.raises(ValueError, match=f"{RENAMED_SWITCH} is now called {SWITCH}"):
        why_not_graphed(config(additional_config={RENAMED_SWITCH: False}))


def test_the_most_prompts_a_graph_takes_is_a_whole_number_from_one() -> None:
    assert max_prompts(config()) == MAX_PROMPTS
    assert max_prompts(config(additional_config={MAX_PROMPTS_KEY: 1})) == 1
    for value in (0, 65, True, 2.0, "4"):
        with pytest.raises(ValueError, match=f"additional_config {MAX_PROMPTS_KEY} must be a whole number"):
            max_prompts(config(additional_config={MAX_PROMPTS_KEY: value}))
    with pytest.raises(ValueError, match=MAX_PROMPTS_KEY):  # refused on any engine, one without graphs too
        whole_forward_graphs(config(additional_config={SWITCH: False, MAX_PROMPTS_KEY: 0}), lambda ids, pos: ids)


def test_a_vision_engine_takes_the_graphs_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the tower loaded (``language_model_only`` off) the graphs run over input embeddings, as a text engine's
    run over token ids: on by default, off with ``additional_config`` false."""
    monkeypatch.setattr(prompt_graphs.current_platform, "is_cuda", lambda: True)
    monkeypatch.setattr(prompt_graphs, "_resolve_gdn_prefill_backend", lambda vllm_config: (None, "triton"))
    assert why_not_graphed(config(vision=True)) is None
    assert why_not_graphed(config(vision=True, additional_config={SWITCH: True})) is None
    assert why_not_graphed(config(vision=True, additional_config={SWITCH: False})) == (
        f"additional_config sets {SWITCH} to false"
    )
    assert why_not_graphed(config(vision=False)) is None
    assert why_not_graphed(config()) is None


def test_flashinfers_delta_net_prefill_takes_the_graphs_only_when_asked() -> None:
    assert gdn_backend_refusal("triton", asked=False) is None
    assert gdn_backend_refusal("triton", asked=True) is None
    assert gdn_backend_refusal("flashinfer", asked=True) is None
    refusal = gdn_backend_refusal("flashinfer", asked=False)
    assert refusal is not None and "not yet measured" in refusal and f"{SWITCH}: true" in refusal
    assert gdn_backend_refusal("cutedsl", asked=True) == "the Gated DeltaNet prefill backend is cutedsl"


def test_a_prompt_is_whole_below_the_token_budget_and_the_long_prefill_threshold() -> None:
    assert whole_prompt_limit(config()) == 16384
    assert whole_prompt_limit(config(long_prefill_token_threshold=1024)) == 1024


def test_steps_no_graph_takes_never_reach_a_capture() -> None:
    def backbone(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the backbone ran")

    graphs = PromptGraphs(backbone, [256, 384], whole_below=16384, max_prompts=MAX_PROMPTS)
    ids, positions = torch.zeros(384, dtype=torch.int32), torch.zeros(384, dtype=torch.int64)
    too_many = prompts([64] * (MAX_PROMPTS + 1))
    outgrown = prompts([300], context=512, initial=[True])  # its sequence holds more tokens than the graph
    for context in (too_many, outgrown):
        with override_forward_context(context):
            assert graphs.forward(ids, positions) is None
    with override_forward_context(lone(300)):
        assert graphs.forward(ids[:300], positions[:300]) is None  # 300 tokens: not a graph size
    lone_only = PromptGraphs(backbone, [256, 384], whole_below=300, max_prompts=1)  # 300 tokens: maybe a chunk
    with override_forward_context(lone(300)):
        assert lone_only.forward(ids, positions) is None
    assert not graphs.graphs and not lone_only.graphs and graphs.enabled


def test_another_attention_backend_turns_the_graphs_off_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    class TritonAttentionMetadata:
        pass

    graphs = PromptGraphs(lambda ids, pos: ids, [384], whole_below=16384, max_prompts=MAX_PROMPTS)
    with (
        caplog.at_level(logging.WARNING),
        override_forward_context(step(LAYERS, {"linear": delta_net([300]), "full": TritonAttentionMetadata()})),
    ):
        assert graphs.forward(torch.zeros(384, dtype=torch.int32), torch.zeros(384, dtype=torch.int64)) is None
    assert not graphs.enabled
    assert "TritonAttentionMetadata" in caplog.text


def test_a_graphs_buffers_keep_the_strides_of_vllms_input_buffers() -> None:
    """Token ids [N], M-RoPE positions [3, N] (a view of a [3, max_tokens] buffer) and input embeddings [N, hidden]
    (the first rows of a [max_tokens, hidden] buffer): the graph's buffer has N tokens along the token axis and the
    step's strides."""
    ids = torch.arange(1024)[:300]
    positions = torch.arange(3 * 1024).view(3, 1024)[:, :300]
    embeddings = torch.ones(1024, 8, dtype=torch.bfloat16)[:300]
    for step_input, axis, shape in ((ids, 0, (384,)), (positions, -1, (3, 384)), (embeddings, 0, (384, 8))):
        buffer = laid_out_as(step_input, 384, token_axis=axis)
        assert buffer.shape == shape and buffer.stride() == step_input.stride() and buffer.dtype == step_input.dtype
        assert not buffer.any()


def test_a_graph_takes_only_inputs_of_the_kind_and_layout_it_was_captured_for() -> None:
    """A graph captured over embeddings never replays token ids, nor embeddings of another width or layout."""
    positions = torch.zeros(3, 1024, dtype=torch.int64)[:, :384]
    embeddings = torch.zeros(1024, 8, dtype=torch.bfloat16)[:384]
    graph = PromptGraph(None, embeddings, positions, [], torch.zeros(384, 8))  # type: ignore[arg-type]
    assert graph.takes(torch.ones(2048, 8, dtype=torch.bfloat16)[:384], positions)
    assert not graph.takes(torch.zeros(384, dtype=torch.int32), positions)
    assert not graph.takes(torch.zeros(384, 16, dtype=torch.bfloat16), positions)
    assert not graph.takes(torch.zeros(8, 384, dtype=torch.bfloat16).t(), positions)
    assert not graph.takes(embeddings, torch.zeros(3, 384, dtype=torch.int64).t().contiguous().t())


def test_a_vision_engines_embeddings_reach_the_graphs_and_its_backbone() -> None:
    """vLLM's model runner gives a multimodal model input embeddings and no token ids for every step: the model hands
    them to its graphs, and its backbone (what the graphs capture) runs vLLM's forward on them."""
    from clef_plugin.model import ClefQwen3_5ForJointSchema

    embeddings = torch.ones(384, 8)
    positions = torch.zeros(3, 384, dtype=torch.int64)
    seen: list[torch.Tensor] = []
    hidden = torch.full((384, 8), 2.0)

    def graphs_forward(inputs: torch.Tensor, step_positions: torch.Tensor) -> torch.Tensor:
        seen.append(inputs)
        return hidden

    model = SimpleNamespace(prompt_graphs=SimpleNamespace(forward=graphs_forward))
    answer = ClefQwen3_5ForJointSchema.forward(model, None, positions, None, embeddings)  # type: ignore[arg-type]
    assert answer is hidden and seen == [embeddings]

    forwarded: list[tuple[Any, ...]] = []
    parent = ClefQwen3_5ForJointSchema.__mro__[1]
    with pytest.MonkeyPatch.context() as patcher:
        patcher.setattr(parent, "forward", lambda self, *args, **kwargs: forwarded.append((args, kwargs)) or hidden)
        backbone = ClefQwen3_5ForJointSchema.__new__(ClefQwen3_5ForJointSchema)
        assert backbone.backbone(embeddings, positions) is hidden
        assert backbone.backbone(torch.zeros(384, dtype=torch.int32), positions) is hidden
    (args, kwargs), (id_args, id_kwargs) = forwarded
    assert args[0] is None and kwargs["inputs_embeds"] is embeddings
    assert id_args[0].dtype == torch.int32 and "inputs_embeds" not in id_kwargs


def stand_in_backbone(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Reads what a real backbone reads (token ids, positions, every layer's metadata from the forward context) and
    returns it per token: ids, positions, KV-cache slots, then each sequence's bounds, lengths, first block, state
    slot and initial-state flag, the chunk list and chunk offsets."""
    metadata = get_forward_context().attn_metadata
    assert isinstance(metadata, dict)
    full = metadata["layers.2.self_attn"]
    linear = metadata["layers.0.linear_attn"]
    assert metadata["layers.1.linear_attn"] is linear
    tokens = input_ids.shape[0]
    ids = input_ids.float().reshape(tokens, -1)[:, :1]  # token ids, or a vision engine's embeddings carrying them
    columns = [ids, positions[1].float()[:, None], full.slot_mapping.float()[:, None]]
    for vector in (
        full.query_start_loc,
        full.seq_lens,
        full.block_table[:, 0],
        linear.prefill_query_start_loc,
        linear.prefill_state_indices,
        linear.prefill_has_initial_state,
        linear.chunk_indices.flatten(),
        linear.chunk_offsets,
        linear.batch_ptr[: linear.nums_dict[8]["tot"]],
    ):
        columns.append(vector.float().expand(tokens, -1))
    return torch.cat(columns, dim=1)


def graph_inputs(length: int, size: int, embeddings: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A step's inputs (token ids, or rows of a [max_tokens, hidden] embeddings buffer whose first column holds
    them) and M-RoPE positions (a view of vLLM's [3, max_tokens] buffer)."""
    ids = torch.arange(size, dtype=torch.int32, device="cuda") + length
    rows = torch.arange(3 * 1024, dtype=torch.int64, device="cuda").view(3, 1024)
    if embeddings:
        buffer = torch.zeros(1024, 8, dtype=torch.float32, device="cuda")
        buffer[:size, 0] = ids
        return buffer[:size], rows[:, :size]
    return ids, rows[:, :size]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: CUDA graph capture")
@pytest.mark.parametrize("embeddings", [False, True], ids=["token-ids", "embeddings"])
def test_replay_sees_each_steps_inputs_and_metadata(embeddings: bool) -> None:
    """Every graph is captured at the first lone prompt, then each replay, lone or of a few prompts, answers for its
    own step: what the stand-in backbone reads equals what the static copies loaded from that step; on token ids
    (a text engine) as on input embeddings (a vision engine)."""
    graphs = PromptGraphs(stand_in_backbone, [256, 384], whole_below=16384, max_prompts=MAX_PROMPTS)
    cases = [
        ([300], 5, None, 1),
        ([290], 11, None, 1),
        ([300, 60], 7, [False, True], FEW),
        ([100, 100, 100, 80], 3, [True, False, False, True], FEW),
    ]
    for lengths, slot, initial, family in cases:
        ids, positions = graph_inputs(sum(lengths), 384, embeddings)
        context = prompts(lengths, padded_to=384, slot=slot, initial=initial, device="cuda")
        with override_forward_context(context):
            hidden = graphs.forward(ids, positions)
        assert hidden is not None and sorted(graphs.graphs) == [(1, 256), (1, 384), (FEW, 256), (FEW, 384)]
        copies = graphs.graphs[(family, 384)].groups
        expected_context = step(LAYERS, {"linear": copies[0].metadata, "full": copies[1].metadata})
        with override_forward_context(expected_context):
            expected = stand_in_backbone(ids, positions)
        torch.testing.assert_close(hidden, expected)
        bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
        assert hidden[0, 3 : 3 + len(bounds)].tolist() == bounds  # the step's own bounds, as the kernels read them
        assert hidden[:, 2].tolist()[: sum(lengths)] == list(range(100, 100 + sum(lengths)))
