"""vLLM (CPU) against the transformers reference: 100 records in one encode call, System One answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import clef_plugin
from clef_head.answers import build_response
from tests.plugin.conftest import TOLERANCE, Scored, start_engine, stop_engine
from tests.plugin.parity import assert_parity, encode_with_engine

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def llm(vllm_cpu_env: None, tiny_release: Path) -> Iterator[Any]:
    """One engine for the module, with vLLM's default token budget."""
    engine = start_engine(tiny_release, max_num_seqs=32)
    yield engine
    stop_engine(engine)


def test_head_sees_many_records_per_forward(llm: Any, parity_reference: Scored) -> None:
    """Requests finishing in the same step go through the head in one batched forward."""
    batch_sizes: list[int] = []

    def spy(model: Any) -> None:
        head = model.pooler.head
        forward = head.forward

        def counting(hidden_states, *args, **kwargs):
            batch_sizes.append(len(hidden_states))
            return forward(hidden_states, *args, **kwargs)

        head.forward = counting

    def unspy(model: Any) -> None:
        del model.pooler.head.forward

    llm.apply_model(spy)
    try:
        logits = encode_with_engine(llm, parity_reference.encoded[:8])
    finally:
        llm.apply_model(unspy)
    assert len(logits) == 8
    assert sum(batch_sizes) == 8
    assert max(batch_sizes) > 1, batch_sizes


def test_parity_with_reference_in_one_encode_call(llm: Any, parity_reference: Scored) -> None:
    """100 records: same top-1 option on every question, max |Δ probability| <= 0.02."""
    logits = encode_with_engine(llm, parity_reference.encoded)
    assert all(
        value.shape == (item.layout.option_count,) for value, item in zip(logits, parity_reference.encoded, strict=True)
    )
    assert_parity("vllm cpu, bf16", parity_reference.encoded, parity_reference.logits, logits, TOLERANCE)


def test_score_requests_returns_system_one_responses(llm: Any, parity_reference: Scored) -> None:
    """score_requests answers like the reference (same choices, probabilities within tolerance)."""
    count = 12
    responses = clef_plugin.score_requests(llm, parity_reference.requests[:count])
    assert len(responses) == count
    for request, encoded, logits, response in zip(
        parity_reference.requests[:count],
        parity_reference.encoded[:count],
        parity_reference.logits[:count],
        responses,
        strict=True,
    ):
        expected = build_response(request, encoded.layout, logits, len(encoded.input_ids))
        assert response["usage"] == expected["usage"]
        assert response["model"] == request.model
        assert response["answers"].keys() == expected["answers"].keys()
        for question_id, answer in response["answers"].items():
            wanted = expected["answers"][question_id]
            assert answer["type"] == wanted["type"]
            if answer["type"] == "choice":
                assert answer["choice"] == wanted["choice"]
            if answer["type"] == "noul":
                assert answer["noul"] == pytest.approx(wanted["noul"], abs=TOLERANCE)
            else:
                for option, probability in answer["probabilities"].items():
                    assert probability == pytest.approx(wanted["probabilities"][option], abs=TOLERANCE)


def test_score_requests_validates_bodies(llm: Any) -> None:
    """A bad body is refused before anything reaches the engine, naming the field."""
    from clef_head.request import InvalidRequest

    with pytest.raises(InvalidRequest, match="questions"):
        clef_plugin.score_requests(llm, [{"model": "clef-flash", "state": "x", "questions": {}}])
