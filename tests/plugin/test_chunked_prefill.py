"""Chunked prefill: a token budget far below every prompt's length gives the reference's results."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.plugin.conftest import TOLERANCE, Scored, parity_requests, reference_scores, start_engine, stop_engine
from tests.plugin.parity import assert_parity, encode_with_engine

pytestmark = pytest.mark.vllm

TOKEN_BUDGET = 128  # tokens per engine step; these prompts are ~230 to ~670 tokens (median ~450)
RECORDS = 16  # the first of the parity records (~6,900 tokens, ~55 steps): on the CPU every step has a large fixed cost


@pytest.fixture(scope="module")
def chunked_reference(toy_release: Path) -> Scored:
    """The reference's logits for the records, on the toy-vocabulary release (chunking does not depend on it)."""
    return reference_scores(toy_release, parity_requests(seed=2026, count=RECORDS))


@pytest.fixture(scope="module")
def llm(vllm_cpu_env: None, toy_release: Path) -> Iterator[Any]:
    """One engine for the module whose steps hold at most TOKEN_BUDGET tokens."""
    engine = start_engine(toy_release, max_num_batched_tokens=TOKEN_BUDGET, max_num_seqs=8)
    yield engine
    stop_engine(engine)


def test_parity_with_prompts_split_over_many_steps(llm: Any, chunked_reference: Scored) -> None:
    """Every prompt spans several steps; results match the reference like unchunked ones."""
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    assert scheduler.enable_chunked_prefill
    assert scheduler.max_num_batched_tokens == TOKEN_BUDGET
    encoded, reference = chunked_reference.encoded, chunked_reference.logits
    lengths = sorted(len(item.input_ids) for item in encoded)
    assert lengths[0] > TOKEN_BUDGET and lengths[len(lengths) // 2] > 2 * TOKEN_BUDGET
    logits = encode_with_engine(llm, encoded)
    assert_parity(
        f"vllm cpu, bf16, chunked prefill ({TOKEN_BUDGET}-token steps)", encoded, reference, logits, TOLERANCE
    )
