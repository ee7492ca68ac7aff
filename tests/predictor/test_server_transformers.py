"""One real predictor (transformers engine, tiny random release) shared by every test here."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.predictor.conftest import (
    MODEL_NAME,
    PROBES,
    Predictor,
    assert_concurrent_answers_match_single,
    assert_same_answer,
    distinct_requests,
    simple_request,
    start_predictor,
    stop,
)

MAX_BODY_BYTES = 65536
MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def server(tiny_release: Path, tmp_path_factory: pytest.TempPathFactory, predictor_env: None) -> Iterator[Predictor]:
    """The shared server: small prompts, small batches, JSON request logs."""
    running = start_predictor(
        tmp_path_factory.mktemp("predictor-transformers"),
        "--model-dir", str(tiny_release),
        "--engine", "transformers",
        "--max-model-len", str(MAX_MODEL_LEN),
        "--max-batch", "8",
        "--max-queued-requests", "64",  # 64 concurrent requests below; the default (4 x 8) would shed some
        "--max-body-bytes", str(MAX_BODY_BYTES),
        "--json-logs",
    )
    yield running
    assert stop(running) == 0, running.log()[-3000:]


@pytest.fixture(scope="module")
def single_answer(client: httpx.Client) -> dict:
    """The answer to :func:`simple_request`, asked alone."""
    response = client.post("/v1/systemone", json=simple_request())
    assert response.status_code == 200, response.text
    return response.json()


def test_not_ready_until_warm_up_ends(server: Predictor, client: httpx.Client) -> None:
    warming = server.rounds[0]
    assert warming == dict.fromkeys((*PROBES, "POST /v1/systemone"), 503), server.rounds
    for path in PROBES:  # once ready, a probe stays ready
        statuses = [round_[path] for round_ in server.rounds]
        assert statuses == sorted(statuses, reverse=True) and set(statuses) == {503, 200}, (path, statuses)
    assert "warm-up finished" not in server.log().split("Uvicorn running")[0], "listening only after warm-up"
    assert "warm-up finished" in server.log_at_first_ready, "a probe said 200 before warm-up ended"
    for path in PROBES:
        assert client.get(path).status_code == 200, path
    assert client.get(f"/v1/models/{MODEL_NAME}").json() == {"name": MODEL_NAME, "ready": True}
    metrics = client.get("/metrics").text
    assert "clef_ready 1.0" in metrics
    warmup = next(line for line in metrics.splitlines() if line.startswith("clef_warmup_seconds "))
    assert float(warmup.split()[1]) > 0


def test_system_one_answers_every_question(single_answer: dict) -> None:
    assert single_answer["model"] == MODEL_NAME
    assert single_answer["usage"]["input_tokens"] > 0 and single_answer["usage"]["output_tokens"] == 0
    answers = single_answer["answers"]
    assert answers.keys() == {"urgent", "topic", "tone"}
    assert answers["urgent"]["type"] == "noul" and 0 <= answers["urgent"]["noul"] <= 1
    assert answers["topic"]["choice"] in {"billing", "bug", "other"}
    assert abs(sum(answers["topic"]["probabilities"].values()) - 1) < 1e-3
    assert answers["tone"]["type"] == "score" and 0 <= answers["tone"]["score"] <= 2
    assert answers["tone"]["legend"] == {"0": "calm", "1": "annoyed", "2": "angry"}


def test_jev_base_path_serves_the_same_api(client: httpx.Client, single_answer: dict) -> None:
    response = client.post("/jev/v1/systemone", json=simple_request())
    assert response.status_code == 200
    assert_same_answer(response.json(), single_answer)
    models = client.get("/jev/v1/models").json()["models"]
    assert [model["name"] for model in models] == [MODEL_NAME]
    assert models[0]["description"].startswith("RANDOM WEIGHTS")
    assert len(models[0]["release_date"]) == 10


def test_kserve_model_list_keeps_its_shape(client: httpx.Client) -> None:
    assert client.get("/v1/models").json() == {"models": [MODEL_NAME]}


def test_kserve_v1_predict(client: httpx.Client, single_answer: dict) -> None:
    other = simple_request(state={"customer": "the app crashes on start"})
    response = client.post(f"/v1/models/{MODEL_NAME}:predict", json={"instances": [simple_request(), other]})
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert len(predictions) == 2
    assert_same_answer(predictions[0], single_answer)
    alone = client.post("/v1/systemone", json=other).json()
    assert_same_answer(predictions[1], alone)


def test_kserve_v2_infer_with_kserve_client(server: Predictor, single_answer: dict) -> None:
    from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

    async def call() -> list[dict]:
        client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=300))
        try:
            assert await client.is_model_ready(server.url, MODEL_NAME)
            request = InferRequest(
                model_name=MODEL_NAME,
                infer_inputs=[InferInput("request", [2], "BYTES", data=[json.dumps(simple_request())] * 2)],
            )
            response = await client.infer(server.url, request, model_name=MODEL_NAME)
            return [json.loads(item) for item in response.outputs[0].data]
        finally:
            await client._client.aclose()

    for answer in asyncio.run(call()):
        assert_same_answer(answer, single_answer)


def test_kserve_v1_with_kserve_client(server: Predictor, single_answer: dict) -> None:
    from kserve import InferenceRESTClient, RESTConfig

    async def call() -> dict:
        client = InferenceRESTClient(RESTConfig(protocol="v1", timeout=300))
        try:
            return await client.infer(server.url, {"instances": [simple_request()]}, model_name=MODEL_NAME)
        finally:
            await client._client.aclose()

    assert_same_answer(asyncio.run(call())["predictions"][0], single_answer)


@pytest.mark.parametrize("compression", ["zstd", False])
def test_typesafe_sdk(server: Predictor, compression: str | bool) -> None:
    import typesafe_sdk

    long_state = {"ticket": "I was charged twice for my subscription. " * 40}  # > 1 KiB: the SDK compresses it
    with typesafe_sdk.TypeSafeClient(
        base_url=f"{server.url}/jev", api_key="unused", model=MODEL_NAME, compression=compression, timeout=300
    ) as client:
        models = client.models.list()
        assert [model.name for model in models.models] == [MODEL_NAME]
        response = client.system_one(
            long_state,
            {
                "urgent": typesafe_sdk.Noul(instructions="Is this urgent?"),
                "topic": typesafe_sdk.Choice(criteria={"billing": "money", "bug": None, "other": None}),
                "tone": typesafe_sdk.Score(criteria=["calm", "annoyed", "angry"]),
            },
        )
    assert response.model == MODEL_NAME
    assert response.nouls["urgent"].noul is not None
    assert response.choices["topic"].choice in {"billing", "bug", "other"}
    assert set(response.scores["tone"].probabilities) == {0, 1, 2}
    assert response.usage.input_tokens and response.usage.input_tokens > 0


def test_sixty_four_concurrent_requests_match_single_answers(client: httpx.Client) -> None:
    assert_concurrent_answers_match_single(client)
    batches = [line for line in client.get("/metrics").text.splitlines() if line.startswith("clef_batch_size_sum")]
    counts = [line for line in client.get("/metrics").text.splitlines() if line.startswith("clef_batch_size_count")]
    assert float(batches[0].split()[-1]) / float(counts[0].split()[-1]) > 1, "requests were never batched"


def test_load_tool_counts_requests_tokens_and_errors(server: Predictor, client: httpx.Client) -> None:
    from predictor.bench import http_load

    bodies = distinct_requests(4)
    tokens = sum(client.post("/v1/systemone", json=body).json()["usage"]["input_tokens"] for body in bodies)
    good = asyncio.run(http_load(server.url, clients=3, requests=8, warmup=1, body=lambda i: bodies[i % 4])).summary()
    assert (good["requests"], good["errors"]) == (8, 0)
    assert good["tokens"] == 2 * tokens  # 8 requests over the 4 bodies
    # seconds is rounded to 10 ms, which bounds the relative difference
    assert good["tokens_per_s"] == pytest.approx(good["tokens"] / good["seconds"], rel=0.006 / good["seconds"] + 1e-3)
    assert 0 < good["latency_ms_p50"] <= good["latency_ms_p95"] <= good["latency_ms_p99"]
    bad = asyncio.run(http_load(server.url, clients=2, requests=4, warmup=0, body=lambda i: {"model": "nope"})).summary()
    assert (bad["requests"], bad["errors"], bad["error_kinds"]) == (0, 4, {"RuntimeError": 4})


def test_compressed_bodies(client: httpx.Client, single_answer: dict) -> None:
    from backports.zstd import compress

    raw = json.dumps(simple_request()).encode()
    for encoding, body in (("gzip", gzip.compress(raw)), ("zstd", compress(raw)), ("identity", raw)):
        response = client.post(
            "/v1/systemone", content=body, headers={"content-type": "application/json", "content-encoding": encoding}
        )
        assert response.status_code == 200, (encoding, response.text)
        assert_same_answer(response.json(), single_answer)
    predicted = client.post(
        f"/v1/models/{MODEL_NAME}:predict",
        content=gzip.compress(json.dumps({"instances": [simple_request()]}).encode()),
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert predicted.status_code == 200
    assert_same_answer(predicted.json()["predictions"][0], single_answer)


def _long_schema() -> dict:
    questions = {f"question_{i}": {"type": "noul", "instructions": "Decide whether this holds. " * 4} for i in range(12)}
    return {"model": MODEL_NAME, "state": 1, "questions": questions}


def _valid(**changes: object) -> dict:
    return {**simple_request(), **changes}


BAD_SYSTEM_ONE = [
    ("malformed json", b'{"model": ', 400, None),
    ("empty body", b"", 400, None),
    ("not an object", b"[1, 2]", 400, None),
    ("missing questions", {"model": MODEL_NAME, "state": 1}, 400, "questions"),
    ("no questions", _valid(questions={}), 400, "questions"),
    ("unknown field", _valid(temperature=0.2), 400, "temperature"),
    ("bad question type", _valid(questions={"q": {"type": "rank"}}), 400, "questions.q"),
    ("one choice label", _valid(questions={"q": {"type": "choice", "criteria": {"a": None}}}), 400, "questions.q.criteria"),
    ("score levels not a list", _valid(questions={"q": {"type": "score", "criteria": "1-5"}}), 400, "questions.q.criteria"),
    ("model not a string", _valid(model=7), 400, "model"),
    ("images", _valid(images=[{"url": "https://example.com/a.png"}]), 400, "images"),
    ("videos", _valid(videos=["https://example.com/a.mp4"]), 400, "videos"),
    ("unknown model", _valid(model="gpt-9"), 404, "model"),
    ("schema too long", _long_schema(), 400, "questions"),
    ("body too large", {"model": MODEL_NAME, "state": "x" * MAX_BODY_BYTES, "questions": {}}, 413, None),
]


@pytest.mark.parametrize("case, body, status, param", BAD_SYSTEM_ONE, ids=[case[0] for case in BAD_SYSTEM_ONE])
@pytest.mark.parametrize("base", ["", "/jev"])
def test_bad_system_one_bodies(client: httpx.Client, base: str, case: str, body: object, status: int, param: str | None) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post(f"{base}/v1/systemone", content=content, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]
    if case == "schema too long":
        assert f"maximum prompt length of {MAX_MODEL_LEN} tokens" in error["message"]
        assert any(word.isdigit() and int(word) > MAX_MODEL_LEN for word in error["message"].split())


def test_bad_transport_details(client: httpx.Client) -> None:
    raw = json.dumps(simple_request()).encode()
    cases = [
        ({"content-encoding": "br"}, raw, 415, "Content-Encoding"),
        ({"content-encoding": "gzip"}, raw, 400, None),  # not gzip data
        ({"content-encoding": "gzip"}, gzip.compress(raw)[:20], 400, None),  # truncated
        ({"content-encoding": "gzip"}, gzip.compress(b" " * (MAX_BODY_BYTES + 10)), 413, None),  # expands too far
        ({"content-type": "multipart/form-data; boundary=x"}, b"--x--", 400, "assets"),
    ]
    for headers, content, status, param in cases:
        response = client.post("/v1/systemone", content=content, headers=headers)
        assert response.status_code == status, (headers, response.text)
        assert response.json()["error"]["param"] == param, (headers, response.text)


BAD_V1 = [
    ({"instances": "not a list"}, 400, "instances"),
    ({"instances": []}, 400, "instances"),
    ({"inputs": [simple_request()]}, 400, "instances"),
    ({"instances": [simple_request(), {"model": MODEL_NAME, "state": 1}]}, 400, "instances[1].questions"),
    ({"instances": [simple_request(model="other")]}, 404, "instances[0].model"),
]


@pytest.mark.parametrize("body, status, param", BAD_V1)
def test_bad_v1_bodies(client: httpx.Client, body: dict, status: int, param: str) -> None:
    response = client.post(f"/v1/models/{MODEL_NAME}:predict", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def _v2(data: list[object], datatype: str = "BYTES") -> dict:
    return {"inputs": [{"name": "request", "datatype": datatype, "shape": [len(data)], "data": data}]}


BAD_V2 = [
    (_v2([1.5], datatype="FP32"), 400, "inputs"),
    (_v2(["{not json"]), 400, "inputs[0].data[0]"),
    (_v2([json.dumps(simple_request()), json.dumps({"model": MODEL_NAME})]), 400, "inputs[0].data[1].state"),
    (_v2([json.dumps(simple_request(model="other"))]), 404, "inputs[0].data[0].model"),
    ({"inputs": [{"name": "request", "datatype": "BYTES", "data": ["{}"]}]}, 400, "inputs[0].shape"),
]


@pytest.mark.parametrize("body, status, param", BAD_V2)
def test_bad_v2_bodies(client: httpx.Client, body: dict, status: int, param: str) -> None:
    response = client.post(f"/v2/models/{MODEL_NAME}/infer", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_kserve_errors_for_unknown_models(client: httpx.Client) -> None:
    for method, path in (
        ("POST", "/v1/models/nope:predict"),
        ("POST", "/v2/models/nope/infer"),
        ("GET", "/v1/models/nope"),
    ):
        response = client.request(method, path, json=_v2([json.dumps(simple_request())]))
        assert response.status_code == 404, (path, response.text)
        assert "nope" in response.json()["error"]


def test_metrics_and_json_request_logs(server: Predictor, client: httpx.Client) -> None:
    response = client.post("/v1/systemone", json=simple_request(), headers={"x-request-id": "trace-me"})
    assert response.headers["x-request-id"] == "trace-me"
    metrics = client.get("/metrics").text
    for name in (
        'clef_requests_total{route="systemone",status="200"}',
        'clef_requests_total{route="systemone",status="400"}',
        'clef_requests_total{route="v1_predict",status="200"}',
        'clef_requests_total{route="v2_infer",status="200"}',
        'clef_request_latency_seconds_count{route="systemone"}',
        "clef_input_tokens_total",
        "clef_batch_size_count",
        "clef_warmup_seconds",
    ):
        assert name in metrics, name
    for stage in ("encode", "engine", "answer"):
        count = next(line for line in metrics.splitlines() if line.startswith(f'clef_stage_seconds_count{{stage="{stage}"}}'))
        assert float(count.split()[-1]) >= 1, count
    lines = [json.loads(line) for line in server.stdout().splitlines() if line.startswith("{")]
    mine = [line for line in lines if line["id"] == "trace-me"]
    assert len(mine) == 1
    assert mine[0]["status"] == 200 and mine[0]["latency_ms"] > 0
    assert mine[0]["input_tokens"] == response.json()["usage"]["input_tokens"]
    assert {line["status"] for line in lines} >= {200, 400, 404, 413}


def test_health_and_liveness(client: httpx.Client) -> None:
    from clef_contract.predictor import LIVENESS_PATH

    from predictor.health import LIVENESS_PATH as PREDICTOR_LIVENESS_PATH

    assert PREDICTOR_LIVENESS_PATH == LIVENESS_PATH
    live = client.get(LIVENESS_PATH)
    assert live.status_code == 200 and live.json() == {"status": "alive"}
    health = client.get("/health")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
