"""One real predictor on the CPU build of vLLM (tiny random release) shared by every test here and the card's."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.predictor.conftest import (
    MODEL_NAME,
    PROBES,
    Predictor,
    assert_concurrent_answers_match_single,
    assert_same_answer,
    simple_request,
)

pytestmark = pytest.mark.vllm

# BF16 on the CPU: a record's logits depend slightly on what it is batched with in the engine.
BF16_ATOL = 2e-2


@pytest.fixture(scope="module")
def server(vllm_server: Predictor) -> Predictor:
    """The shared vLLM server (tests/predictor/conftest.py: the model card's command, shared with its tests)."""
    return vllm_server


def test_ready_only_after_warm_up(server: Predictor, client: httpx.Client) -> None:
    assert "engine: vllm" in server.log()
    assert server.rounds[0] == dict.fromkeys((*PROBES, "POST /v1/systemone"), 503), server.rounds
    assert "warm-up finished" in server.log_at_first_ready
    assert all(client.get(path).status_code == 200 for path in PROBES)


def test_every_route_gives_the_same_answer(server: Predictor, client: httpx.Client) -> None:
    import typesafe_sdk

    alone = client.post("/v1/systemone", json=simple_request()).json()
    assert alone["model"] == MODEL_NAME and alone["answers"].keys() == {"urgent", "topic", "tone"}
    assert_same_answer(client.post("/jev/v1/systemone", json=simple_request()).json(), alone, BF16_ATOL)
    predicted = client.post(f"/v1/models/{MODEL_NAME}:predict", json={"instances": [simple_request()]}).json()
    assert_same_answer(predicted["predictions"][0], alone, BF16_ATOL)
    v2 = {"inputs": [{"name": "request", "datatype": "BYTES", "shape": [1], "data": [json.dumps(simple_request())]}]}
    inferred = client.post(f"/v2/models/{MODEL_NAME}/infer", json=v2).json()
    assert_same_answer(json.loads(inferred["outputs"][0]["data"][0]), alone, BF16_ATOL)
    with typesafe_sdk.TypeSafeClient(
        base_url=f"{server.url}/jev", api_key="unused", model=MODEL_NAME, timeout=300
    ) as sdk:
        response = sdk.system_one(
            {"ticket": "charged twice " * 100}, {"urgent": typesafe_sdk.Noul(instructions="Urgent?")}
        )
    assert response.model == MODEL_NAME and response.nouls["urgent"].noul is not None


def test_sixty_four_concurrent_requests_match_single_answers(client: httpx.Client) -> None:
    assert_concurrent_answers_match_single(client, BF16_ATOL)


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({**simple_request(), "images": [{"url": "https://example.com/a.png"}]}, 422, "images"),
        ({**simple_request(), "model": "other"}, 404, "model"),
        (
            {
                "model": MODEL_NAME,
                "state": 1,
                "questions": {f"q{i}": {"type": "noul", "instructions": "Holds? " * 8} for i in range(12)},
            },
            422,
            "questions",
        ),
    ],
)
def test_bad_input(client: httpx.Client, body: dict, status: int, param: str) -> None:
    response = client.post("/v1/systemone", json=body)
    assert response.status_code == status and response.json()["error"]["param"] == param
