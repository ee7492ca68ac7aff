"""Whole-forward graphs for lone prompts (clef_plugin.prompt_graphs): which steps take them, and the static
metadata rebuilt from vLLM's own dataclasses and helpers for N tokens (these tests pin the fields it reads and
writes). The capture itself needs CUDA: ``test_replay_sees_each_steps_inputs_and_metadata``."""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.config import CUDAGraphMode
from vllm.forward_context import ForwardContext, get_forward_context, override_forward_context
from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata

from clef_plugin.prompt_graphs import (
    NULL_BLOCK,
    PAD_SLOT,
    SWITCH,
    AttentionCopy,
    DeltaNetCopy,
    LonePromptGraphs,
    gdn_backend_refusal,
    lone_prompt_tokens,
    unsupported_backends,
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


def delta_net(prefills: list[int], decodes: int = 0, slot: int = 5, device: str = "cpu") -> Any:
    """Gated DeltaNet metadata for ``prefills`` fresh prompts (and ``decodes`` decoding requests)."""
    requests = decodes + len(prefills)
    bounds = torch.tensor([0, *torch.tensor(prefills).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return GDNAttentionMetadata(
        num_prefills=len(prefills),
        num_prefill_tokens=sum(prefills),
        num_decodes=decodes,
        num_decode_tokens=decodes,
        num_spec_decodes=0,
        num_spec_decode_tokens=0,
        num_actual_tokens=sum(prefills) + decodes,
        has_initial_state=torch.zeros(requests, dtype=torch.bool, device=device),
        non_spec_query_start_loc=bounds,
        prefill_query_start_loc=bounds,
        non_spec_state_indices_tensor=torch.arange(slot, slot + requests, dtype=torch.int32, device=device),
        prefill_state_indices=torch.arange(slot, slot + len(prefills), dtype=torch.int32, device=device),
        prefill_has_initial_state=torch.zeros(len(prefills), dtype=torch.bool, device=device),
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


def lone(length: int, padded_to: int | None = None, slot: int = 5, device: str = "cpu") -> ForwardContext:
    return step(
        LAYERS,
        {"linear": delta_net([length], slot=slot, device=device), "full": attention([length], 0, padded_to, device)},
    )


def test_a_lone_fresh_prompt_is_recognised() -> None:
    assert lone_prompt_tokens(lone(300)) == 300


@pytest.mark.parametrize(
    ("metadata", "mode"),
    [
        ({"linear": delta_net([300, 200]), "full": attention([300, 200])}, CUDAGraphMode.PIECEWISE),
        ({"linear": delta_net([300], decodes=1), "full": attention([300])}, CUDAGraphMode.PIECEWISE),
        ({"linear": delta_net([300]), "full": attention([300], context=512)}, CUDAGraphMode.PIECEWISE),
        ({"linear": delta_net([300]), "full": attention([300])}, CUDAGraphMode.NONE),
        ({"linear": delta_net([300]), "full": attention([299])}, CUDAGraphMode.PIECEWISE),
        ({"linear": delta_net([300]), "full": object()}, CUDAGraphMode.PIECEWISE),
    ],
    ids=["two-prompts", "with-a-decode", "a-later-chunk", "not-a-graph-size", "disagreeing-groups", "other-backend"],
)
def test_other_steps_are_left_to_vllm(metadata: dict[str, Any], mode: CUDAGraphMode) -> None:
    assert lone_prompt_tokens(step(LAYERS, metadata, mode)) is None


def test_unsupported_backends_are_named() -> None:
    class TritonAttentionMetadata:
        pass

    context = step(LAYERS, {"linear": delta_net([300]), "full": TritonAttentionMetadata()})
    assert isinstance(context.attn_metadata, dict)
    assert unsupported_backends(context.attn_metadata) == ["TritonAttentionMetadata"]


def test_the_attention_copy_runs_the_padded_prompt_as_one_sequence_and_loads_each_steps_slots() -> None:
    template = lone(300, padded_to=384).attn_metadata
    assert isinstance(template, dict)
    live = template["layers.2.self_attn"]
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
    assert static.prefill_state_indices is copy.state_slot and static.non_spec_state_indices_tensor is copy.state_slot
    assert copy.state_slot.tolist() == [NULL_BLOCK]

    copy.load(live)
    assert copy.state_slot.tolist() == [9]
    assert static.prefill_query_start_loc.tolist() == [0, 300]  # the step's bounds: FLA stops at its last token
    assert static.chunk_indices.shape == (6, 2)  # in launches sized for 384 tokens


def config(**overrides: Any) -> Any:
    settings: dict[str, Any] = {
        "additional_config": {},
        "enforce_eager": False,
        "cudagraph_mode": CUDAGraphMode.PIECEWISE,
        "world_size": 1,
        "max_num_batched_tokens": 16384,
        "long_prefill_token_threshold": 0,
    }
    settings.update(overrides)
    return SimpleNamespace(
        additional_config=settings["additional_config"],
        model_config=SimpleNamespace(enforce_eager=settings["enforce_eager"], hf_text_config=SimpleNamespace()),
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


def test_steps_that_are_not_a_lone_prompt_never_reach_a_capture() -> None:
    def backbone(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the backbone ran")

    graphs = LonePromptGraphs(backbone, [256, 384], whole_below=16384)
    two = step(LAYERS, {"linear": delta_net([300, 60]), "full": attention([300, 60])})
    with override_forward_context(two):
        assert graphs.forward(torch.zeros(384, dtype=torch.int32), torch.zeros(384, dtype=torch.int64)) is None
    limited = LonePromptGraphs(backbone, [256, 384], whole_below=300)  # 300 tokens may be a chunk of a longer prompt
    with override_forward_context(lone(300)):
        assert limited.forward(torch.zeros(384, dtype=torch.int32), torch.zeros(384, dtype=torch.int64)) is None
    assert not graphs.graphs and not limited.graphs and graphs.enabled


def test_another_attention_backend_turns_the_graphs_off_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    class TritonAttentionMetadata:
        pass

    graphs = LonePromptGraphs(lambda ids, pos: ids, [384], whole_below=16384)
    with (
        caplog.at_level(logging.WARNING),
        override_forward_context(step(LAYERS, {"linear": delta_net([300]), "full": TritonAttentionMetadata()})),
    ):
        assert graphs.forward(torch.zeros(384, dtype=torch.int32), torch.zeros(384, dtype=torch.int64)) is None
    assert not graphs.enabled
    assert "TritonAttentionMetadata" in caplog.text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: CUDA graph capture")
def test_replay_sees_each_steps_inputs_and_metadata() -> None:
    """A stand-in backbone that reads what a real one reads (token ids, positions, every layer's metadata from the
    forward context) captures at the first lone prompt, then each replay answers for its own step."""

    def backbone(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        metadata = get_forward_context().attn_metadata
        assert isinstance(metadata, dict)
        full = metadata["layers.2.self_attn"]
        linear = metadata["layers.0.linear_attn"]
        assert metadata["layers.1.linear_attn"] is linear
        tokens = input_ids.shape[0]
        rows = [
            input_ids.float(),
            positions[1].float(),
            full.slot_mapping.float(),
            full.block_table[0, :1].float().expand(tokens),
            linear.prefill_state_indices.float().expand(tokens),
            full.query_start_loc[1:].float().expand(tokens),
            full.seq_lens.float().expand(tokens),
            linear.prefill_query_start_loc[1:].float().expand(tokens),
        ]
        return torch.stack(rows, dim=1)

    graphs = LonePromptGraphs(backbone, [256, 384], whole_below=16384)
    for length, slot in ((300, 5), (290, 11)):
        ids = torch.arange(384, dtype=torch.int32, device="cuda") + length
        rows = torch.arange(3 * 1024, dtype=torch.int64, device="cuda").view(3, 1024)
        positions = rows[:, :384]  # M-RoPE positions: a view of vLLM's [3, max_tokens] buffer
        with override_forward_context(lone(length, padded_to=384, slot=slot, device="cuda")):
            hidden = graphs.forward(ids, positions)
        assert hidden is not None and sorted(graphs.graphs) == [256, 384]
        expected = backbone_expectation(ids, positions, length, slot)
        torch.testing.assert_close(hidden, expected)


def backbone_expectation(ids: torch.Tensor, positions: torch.Tensor, length: int, slot: int) -> torch.Tensor:
    tokens = ids.shape[0]
    slots = torch.full((tokens,), float(PAD_SLOT), device=ids.device)
    slots[:length] = torch.arange(100, 100 + length, device=ids.device).float()
    return torch.stack(
        [ids.float(), positions[1].float(), slots, torch.full_like(slots, 7.0), torch.full_like(slots, float(slot))]
        + [torch.full_like(slots, float(length))] * 3,
        dim=1,
    )
