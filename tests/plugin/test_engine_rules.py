"""Engine rules: the FP8 repository layout, prefix caching forced off, malformed layouts refused per request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import clef_plugin
from clef_head.layout import LayoutError
from tests.plugin.conftest import TOLERANCE, Scored, parity_requests, reference_scores, start_engine, stop_engine
from tests.plugin.parity import assert_parity, encode_with_engine

pytestmark = pytest.mark.vllm

RECORDS = 12


@pytest.fixture(scope="module")
def layout_reference(toy_release_fp8_layout: Path) -> Scored:
    """Reference logits on the release whose head sits in clef_head/."""
    return reference_scores(toy_release_fp8_layout, parity_requests(seed=7, count=RECORDS))


@pytest.fixture(scope="module")
def llm(vllm_cpu_env: None, toy_release_fp8_layout: Path, layout_reference: Scored) -> Iterator[Any]:
    """An engine asked for prefix caching (bypassing engine_kwargs' own refusal)."""
    engine = start_engine(toy_release_fp8_layout, enable_prefix_caching=True, max_num_seqs=16)
    yield engine
    stop_engine(engine)


def test_prefix_caching_is_forced_off(llm: Any) -> None:
    """vLLM builds the engine with prefix caching off even though it was asked for."""
    assert llm.llm_engine.vllm_config.cache_config.enable_prefix_caching is False


def test_head_in_subfolder_matches_reference_and_repeats_exactly(llm: Any, layout_reference: Scored) -> None:
    """The clef_head/ layout loads; the same prompts scored twice give the same logits."""
    first = encode_with_engine(llm, layout_reference.encoded)
    assert_parity(
        "vllm cpu, bf16, head in clef_head/", layout_reference.encoded, layout_reference.logits, first, TOLERANCE
    )
    again = encode_with_engine(llm, layout_reference.encoded)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def _submit(llm: Any, prompts: list[list[int]], extra: list[dict[str, Any] | None]) -> list[Any]:
    from vllm import PoolingParams

    return llm.encode(
        [{"prompt_token_ids": ids} for ids in prompts],
        pooling_params=[PoolingParams(task=clef_plugin.POOLING_TASK, extra_kwargs=item) for item in extra],
        pooling_task=clef_plugin.POOLING_TASK,
        use_tqdm=False,
    )


def test_malformed_layouts_fail_their_request_only(llm: Any, layout_reference: Scored) -> None:
    """Bad layouts sent straight to the engine give clear per-request errors; the engine keeps serving."""
    good = layout_reference.encoded[0]
    length = len(good.input_ids)
    wire = good.layout.to_wire()
    past_end = {"questions": [dict(wire["questions"][0], span=[length - 1, length + 5])]}
    bad_type = {"questions": [dict(wire["questions"][0], type=7)]}
    outputs = _submit(
        llm,
        [good.input_ids] * 4,
        [
            {clef_plugin.LAYOUT_KEY: past_end},
            {clef_plugin.LAYOUT_KEY: wire},
            {clef_plugin.LAYOUT_KEY: bad_type},
            None,
        ],
    )
    with pytest.raises(LayoutError, match=rf"span ends at {length + 5}, past the prompt's {length} tokens"):
        clef_plugin.option_logits(outputs[0])
    assert clef_plugin.option_logits(outputs[1]).shape == (good.layout.option_count,)
    with pytest.raises(LayoutError, match=r"type must be 0, 1 or 2"):
        clef_plugin.option_logits(outputs[2])
    with pytest.raises(LayoutError, match="has no layout"):
        clef_plugin.option_logits(outputs[3])
    after = encode_with_engine(llm, layout_reference.encoded[:2])
    assert [value.shape for value in after] == [(item.layout.option_count,) for item in layout_reference.encoded[:2]]
