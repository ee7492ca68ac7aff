"""Chunked prefill: a token budget far below every prompt's length gives the reference's results."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.plugin.conftest import TOLERANCE, Scored, start_engine, stop_engine
from tests.plugin.parity import assert_parity, encode_with_engine

pytestmark = pytest.mark.vllm

TOKEN_BUDGET = 128  # tokens per engine step; parity prompts are ~170 to ~700 tokens (median ~390)
RECORDS = 30  # a subset of the parity records: on the CPU every engine step has a large fixed cost


@pytest.fixture(scope="module")
def llm(vllm_cpu_env: None, tiny_release: Path) -> Iterator[Any]:
    """One engine for the module whose steps hold at most TOKEN_BUDGET tokens."""
    engine = start_engine(tiny_release, max_num_batched_tokens=TOKEN_BUDGET, max_num_seqs=8)
    yield engine
    stop_engine(engine)


def test_parity_with_prompts_split_over_many_steps(llm: Any, parity_reference: Scored) -> None:
    """Every prompt spans several steps; results match the reference like unchunked ones."""
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    assert scheduler.enable_chunked_prefill
    assert scheduler.max_num_batched_tokens == TOKEN_BUDGET
    encoded, reference = parity_reference.encoded[:RECORDS], parity_reference.logits[:RECORDS]
    lengths = sorted(len(item.input_ids) for item in encoded)
    assert lengths[0] > TOKEN_BUDGET and lengths[len(lengths) // 2] > 2 * TOKEN_BUDGET
    logits = encode_with_engine(llm, encoded)
    assert_parity(
        f"vllm cpu, bf16, chunked prefill ({TOKEN_BUDGET}-token steps)", encoded, reference, logits, TOLERANCE
    )
