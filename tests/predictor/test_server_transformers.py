"""One real predictor (transformers engine, tiny random release) shared by every test here."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

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
    tiny_server_args,
)

MAX_BODY_BYTES = 65536
MAX_MODEL_LEN = 512
SLOW_CLIENT_TIMEOUT_S = 5


@pytest.fixture(scope="module")
def server(toy_release: Path, tmp_path_factory: pytest.TempPathFactory, predictor_env: None) -> Iterator[Predictor]:
    """The shared server: small prompts, small batches, JSON request logs."""
    running = start_predictor(
        tmp_path_factory.mktemp("predictor-transformers"),
        *tiny_server_args(toy_release, max_model_len=MAX_MODEL_LEN, max_batch=8),
        "--max-queued-requests",
        "64",  # 64 concurrent requests below; the default (4 x 8) would shed some
        "--max-queue-wait-s",
        "300",  # these tests check answers, not shedding: a busy machine's slow service rate must not shed them
        "--max-body-bytes",
        str(MAX_BODY_BYTES),
        "--header-timeout",
        str(SLOW_CLIENT_TIMEOUT_S),
        "--body-timeout",
        str(SLOW_CLIENT_TIMEOUT_S),
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
    assert "ModelNotReady" not in server.log(), "a probe during warm-up is logged as an error with a traceback"
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
    assert [model["name"] for model in models] == [MODEL_NAME, "jev-latest"]  # the model, then its aliases
    assert models[0]["description"].startswith("RANDOM WEIGHTS") and models[1] == {**models[0], "name": "jev-latest"}
    assert len(models[0]["release_date"]) == 10


def test_model_list_is_one_body_at_every_base(client: httpx.Client) -> None:
    listed = client.get("/v1/models").json()
    assert listed == client.get("/jev/v1/models").json()  # the hosted shape and OpenAI's, in front of KServe's
    assert [model["id"] for model in listed["data"]] == [model["name"] for model in listed["models"]]


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
        assert [model.name for model in models.models] == [MODEL_NAME, "jev-latest"]
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
    from bench.load import http_load

    bodies = distinct_requests(4)
    tokens = sum(client.post("/v1/systemone", json=body).json()["usage"]["input_tokens"] for body in bodies)
    good = asyncio.run(http_load(server.url, clients=3, requests=8, warmup=1, body=lambda i: bodies[i % 4])).summary()
    assert (good["requests"], good["errors"]) == (8, 0)
    assert good["tokens"] == 2 * tokens  # 8 requests over the 4 bodies
    # seconds is rounded to 10 ms, which bounds the relative difference
    assert good["tokens_per_s"] == pytest.approx(good["tokens"] / good["seconds"], rel=0.006 / good["seconds"] + 1e-3)
    assert 0 < good["latency_ms_p50"] <= good["latency_ms_p95"] <= good["latency_ms_p99"]
    bad = asyncio.run(
        http_load(server.url, clients=2, requests=4, warmup=0, body=lambda i: {"model": "nope"})
    ).summary()
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


def _metric(client: httpx.Client, sample: str) -> float:
    line = next((line for line in client.get("/metrics").text.splitlines() if line.startswith(sample + " ")), None)
    return float(line.split()[-1]) if line else 0.0


def test_a_repeated_body_is_answered_from_the_cache_without_being_encoded_again(client: httpx.Client) -> None:
    raw = json.dumps(simple_request(state="a ticket sent twice, the second time compressed")).encode()
    encoded, hits = 'clef_stage_seconds_count{stage="encode"}', 'clef_answer_cache_total{outcome="hit"}'
    first = client.post("/v1/systemone", content=raw, headers={"content-type": "application/json"})
    before = _metric(client, encoded), _metric(client, hits)
    again = client.post(
        "/v1/systemone",
        content=gzip.compress(raw),
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert (_metric(client, encoded), _metric(client, hits)) == (before[0], before[1] + 1)
    assert again.headers["x-request-id"] != first.headers["x-request-id"]


def _long_schema() -> dict:
    questions = {
        f"question_{i}": {"type": "noul", "instructions": "Decide whether this holds. " * 4} for i in range(12)
    }
    return {"model": MODEL_NAME, "state": 1, "questions": questions}


def _valid(**changes: object) -> dict:
    return {**simple_request(), **changes}


BAD_SYSTEM_ONE = [
    ("malformed json", b'{"model": ', 400, None),
    ("empty body", b"", 400, None),
    ("not an object", b"[1, 2]", 422, None),
    ("missing questions", {"model": MODEL_NAME, "state": 1}, 422, "questions"),
    ("no questions", _valid(questions={}), 422, "questions"),
    ("bad question type", _valid(questions={"q": {"type": "rank"}}), 422, "questions.q.type"),
    (
        "one choice label",
        _valid(questions={"q": {"type": "choice", "criteria": {"a": None}}}),
        422,
        "questions.q.criteria",
    ),
    (
        "score levels not a list",
        _valid(questions={"q": {"type": "score", "criteria": "1-5"}}),
        422,
        "questions.q.criteria",
    ),
    ("model not a string", _valid(model=7), 422, "model"),
    ("state nested too deep", _valid(state=json.loads("[" * 200 + "]" * 200)), 422, "state[0][0][0]"),
    ("images", _valid(images=[{"url": "https://example.com/a.png"}]), 422, "images"),
    ("videos", _valid(videos=["https://example.com/a.mp4"]), 422, "videos"),
    ("unknown model", _valid(model="gpt-9"), 404, "model"),
    ("schema too long", _long_schema(), 422, "questions"),
    ("body too large", {"model": MODEL_NAME, "state": "x" * MAX_BODY_BYTES, "questions": {}}, 413, None),
]


@pytest.mark.parametrize("case, body, status, param", BAD_SYSTEM_ONE, ids=[case[0] for case in BAD_SYSTEM_ONE])
@pytest.mark.parametrize("base", ["", "/jev"])
def test_bad_system_one_bodies(
    client: httpx.Client, base: str, case: str, body: object, status: int, param: str | None
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post(f"{base}/v1/systemone", content=content, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]
    assert error["message"].startswith(f"{param}: ") if param else error["message"]
    detail = response.json()["detail"]
    assert detail[0]["msg"] == error["message"] and detail[0]["loc"][0] == "body"
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
        source = "header" if param == "Content-Encoding" else "body"
        assert response.json()["detail"][0]["loc"] == [source, *([param] if param else [])], response.text


@pytest.mark.parametrize(
    "method, path, status, param, loc",
    [
        ("GET", "/nowhere", 404, None, None),
        ("GET", "/jev/v1/nowhere", 404, None, None),
        ("POST", "/jev/health", 405, None, None),
        ("DELETE", "/v1/systemone", 405, None, None),
        ("GET", "/v2/repository/index", 404, None, None),
        ("GET", "/v2/models/other/ready", 404, "model_name", ["path", "model_name"]),
    ],
)
def test_every_route_answers_errors_in_one_shape(
    client: httpx.Client, method: str, path: str, status: int, param: str | None, loc: list[str] | None
) -> None:
    """Undefined routes, wrong methods and closed routes too: our ``error`` object and FastAPI's ``detail``, a
    list naming the part of the request at fault, or the message when no part of it is."""
    response = client.request(method, path)
    assert response.status_code == status, response.text
    body = response.json()
    assert body.keys() == {"error", "detail"} and body["error"]["param"] == param and body["error"]["message"]
    assert body["detail"] == (
        [{"loc": loc, "msg": body["error"]["message"], "type": body["error"]["type"]}]
        if loc
        else body["error"]["message"]
    )
    assert response.headers["x-typesafe-request-id"]


BAD_V1 = [
    ({"instances": "not a list"}, 400, "instances"),
    ({"instances": []}, 400, "instances"),
    ({"inputs": [simple_request()]}, 400, "instances"),
    ({"instances": [simple_request(), {"model": MODEL_NAME, "state": 1}]}, 422, "instances[1].questions"),
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
    (_v2([json.dumps(simple_request()), json.dumps({"model": MODEL_NAME})]), 422, "inputs[0].data[1].state"),
    (_v2([json.dumps(simple_request(model="other"))]), 404, "inputs[0].data[0].model"),
    ({"inputs": [{"name": "request", "datatype": "BYTES", "data": ["{}"]}]}, 422, "inputs[0].shape"),
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
        assert "'nope'" in response.json()["error"]["message"]


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
        count = next(
            line for line in metrics.splitlines() if line.startswith(f'clef_stage_seconds_count{{stage="{stage}"}}')
        )
        assert float(count.split()[-1]) >= 1, count
    lines = [json.loads(line) for line in server.stdout().splitlines() if line.startswith("{")]
    mine = [line for line in lines if line["id"] == "trace-me"]
    assert len(mine) == 1
    assert mine[0]["status"] == 200 and mine[0]["latency_ms"] > 0
    assert mine[0]["input_tokens"] == response.json()["usage"]["input_tokens"]
    assert {line["status"] for line in lines} >= {200, 400, 404, 413}


def test_health_and_liveness(client: httpx.Client) -> None:
    from clef_contract.predictor import LIVENESS_PATH
    from predictor.http.health import LIVENESS_PATH as PREDICTOR_LIVENESS_PATH

    assert PREDICTOR_LIVENESS_PATH == LIVENESS_PATH
    live = client.get(LIVENESS_PATH)
    assert live.status_code == 200 and live.json() == {"status": "alive"}
    health = client.get("/health")
    assert health.status_code == 200 and health.json() == {"status": "ok"}


def test_closed_and_unsupported_routes_answer_404(client: httpx.Client) -> None:
    for method, path in (
        ("POST", f"/v2/repository/models/{MODEL_NAME}/unload"),
        ("POST", f"/v2/repository/models/{MODEL_NAME}/load"),
        ("POST", "/v2/repository/index"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
        ("GET", "/redoc"),
        ("POST", f"/v2/models/{MODEL_NAME}/versions/1/infer"),
        ("GET", f"/v2/models/{MODEL_NAME}/versions/1/ready"),
        ("POST", f"/v1/models/{MODEL_NAME}:explain"),
    ):
        response = client.request(method, path, json={})
        assert response.status_code == 404, (path, response.text)
        assert response.json()["error"]["type"] == "not_found_error"
    assert client.get("/health").status_code == 200, "the model is still served"
    assert client.post("/v1/systemone", json=simple_request()).status_code == 200


def test_not_found_does_not_echo_a_huge_name(client: httpx.Client) -> None:
    name = "n" * 10000
    for response in (
        client.get(f"/v2/models/{name}/ready"),
        client.post(f"/v1/models/{name}:predict", json={"instances": [simple_request()]}),
        client.post("/v1/systemone", json=simple_request(model=name)),
    ):
        assert response.status_code == 404, response.text
        assert len(response.text) < 1000 and "(10000 characters)" in response.json()["error"]["message"]


def _binary_v2(header: dict, payload: bytes, header_length: str | None = None) -> tuple[bytes, dict[str, str]]:
    raw = json.dumps(header).encode()
    return raw + payload, {
        "inference-header-content-length": header_length if header_length is not None else str(len(raw)),
        "content-type": "application/octet-stream",
    }


def _bytes_element(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(4, "little") + data


_ONE = _bytes_element(json.dumps(simple_request()))
_INPUT = {"name": "request", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(_ONE)}}
BAD_KSERVE_BODIES = [
    (
        "v2 header length not a number",
        "/v2/models/clef-flash/infer",
        *_binary_v2({"inputs": [_INPUT]}, _ONE, "abc"),
        "inference-header-content-length",
    ),
    (
        "v2 header length past the body",
        "/v2/models/clef-flash/infer",
        *_binary_v2({"inputs": [_INPUT]}, _ONE, "99999"),
        "inference-header-content-length",
    ),
    (
        "v2 input without shape",
        "/v2/models/clef-flash/infer",
        *_binary_v2({"inputs": [{k: v for k, v in _INPUT.items() if k != "shape"}]}, _ONE),
        "inputs[0].shape",
    ),
    (
        "v2 binary_data_size 0",
        "/v2/models/clef-flash/infer",
        *_binary_v2({"inputs": [{**_INPUT, "parameters": {"binary_data_size": 0}}]}, _ONE),
        "inputs[0].parameters.binary_data_size",
    ),
    (
        "v2 element count off",
        "/v2/models/clef-flash/infer",
        *_binary_v2({"inputs": [{**_INPUT, "shape": [2]}]}, _ONE),
        "inputs[0].parameters.binary_data_size",
    ),
    (
        "v2 header a list",
        "/v2/models/clef-flash/infer",
        b"[]",
        {"inference-header-content-length": "2", "content-type": "application/octet-stream"},
        None,
    ),
    (
        "v1 binary cloudevent {",
        "/v1/models/clef-flash:predict",
        b"{",
        {
            "ce-specversion": "1.0",
            "ce-source": "s",
            "ce-type": "t",
            "ce-id": "1",
            "content-type": "application/cloudevents+json",
        },
        None,
    ),
]


@pytest.mark.parametrize(
    "case, path, content, headers, param", BAD_KSERVE_BODIES, ids=[case[0] for case in BAD_KSERVE_BODIES]
)
def test_kserve_routes_answer_bad_input_with_4xx(
    client: httpx.Client, case: str, path: str, content: bytes, headers: dict, param: str | None
) -> None:
    response = client.post(path, content=content, headers=headers)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"]


def test_v2_binary_body_still_works(client: httpx.Client, single_answer: dict) -> None:
    content, headers = _binary_v2({"inputs": [_INPUT]}, _ONE)
    response = client.post(f"/v2/models/{MODEL_NAME}/infer", content=content, headers=headers)
    assert response.status_code == 200, response.text
    assert_same_answer(json.loads(response.json()["outputs"][0]["data"][0]), single_answer)


def test_request_ids_on_every_response(client: httpx.Client) -> None:
    for method, path in (("GET", "/health"), ("GET", "/metrics"), ("POST", "/v1/systemone"), ("GET", "/nowhere")):
        response = client.request(method, path, json=simple_request() if method == "POST" else None)
        assert len(response.headers["x-typesafe-request-id"]) == 32, path
        assert response.headers["x-request-id"] == response.headers["x-typesafe-request-id"], path
    echoed = client.post("/v1/systemone", json={}, headers={"x-request-id": "client-7"})
    assert echoed.headers["x-typesafe-request-id"] == echoed.headers["x-request-id"] == "client-7"
    refused = client.get("/health", headers={"x-request-id": "x" * 500})
    assert len(refused.headers["x-request-id"]) == 32, "an over-long client id is replaced"


def test_what_the_original_answers_is_answered(client: httpx.Client) -> None:
    body = simple_request()
    body["id"] = "record-1"
    body["temperature"] = 0.1
    body["questions"]["urgent"]["instructions"] = 5
    body["questions"]["urgent"]["weight"] = 2
    body["questions"][""] = {"type": "noul", "instructions": "Is anything else asked?"}
    response = client.post("/v1/systemone", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["answers"].keys() == {"urgent", "topic", "tone", ""}


def test_over_long_state_is_truncated_and_reported(client: httpx.Client) -> None:
    fits = client.post("/v1/systemone", json=simple_request()).json()
    assert fits["usage"]["state_truncated"] is False
    long = client.post("/v1/systemone", json=simple_request(state="9" * 40000)).json()
    assert long["usage"]["state_truncated"] is True and long["usage"]["input_tokens"] == MAX_MODEL_LEN


def test_batch_answers_each_item_or_its_error(client: httpx.Client, single_answer: dict) -> None:
    other = simple_request(state={"customer": "the app crashes on start"})
    bodies = [simple_request(), {"model": MODEL_NAME, "state": 1}, other, simple_request(model="gpt-9")]
    for base in ("", "/jev"):
        response = client.post(f"{base}/v1/systemone/batch", json=bodies)
        assert response.status_code == 200, response.text
        items = response.json()
        assert len(items) == 4
        assert_same_answer(items[0], single_answer)
        assert items[1]["status"] == 422 and items[1]["error"]["param"] == "[1].questions"
        assert_same_answer(items[2], client.post("/v1/systemone", json=other).json())
        assert items[3]["status"] == 404 and items[3]["error"]["param"] == "[3].model"
    for bad in ({"requests": bodies}, [], [simple_request()] * 65):
        response = client.post("/v1/systemone/batch", json=bad)
        assert response.status_code == 422, response.text
        assert "--max-batch-items" in response.json()["error"]["message"]


def test_a_null_score_level_is_answered_as_the_original_answers_it(client: httpx.Client) -> None:
    """A level without a description: an option of its own, echoed as null in the legend (the original's way)."""
    body = simple_request()
    body["questions"]["tone"]["criteria"] = ["calm", None, "angry"]
    response = client.post("/v1/systemone", json=body)
    assert response.status_code == 200, response.text
    tone = response.json()["answers"]["tone"]
    assert tone["legend"] == {"0": "calm", "1": None, "2": "angry"} and set(tone["probabilities"]) == {"0", "1", "2"}


def test_typesafe_sdk_sees_typed_errors_with_field_paths_and_request_ids(server: Predictor) -> None:
    import typesafe_sdk
    from typesafe_sdk._core.errors import TypeSafeNotFoundError, TypeSafeUnprocessableEntityError

    with typesafe_sdk.TypeSafeClient(
        base_url=f"{server.url}/jev", api_key="unused", model=MODEL_NAME, timeout=300
    ) as client:
        answer = client.system_one("hello", {"q": typesafe_sdk.Noul(instructions="Is it?")})
        assert len(answer.request_id) == 32
        with pytest.raises(TypeSafeUnprocessableEntityError) as caught:
            client.system_one("hello", {"q": typesafe_sdk.Choice(criteria={"only": None})})
        assert "questions.q.criteria" in str(caught.value) and caught.value.request_id
        assert caught.value.body["detail"][0]["loc"] == ["body", "questions", "q", "criteria"]
    with typesafe_sdk.TypeSafeClient(base_url=f"{server.url}/jev", api_key="unused", timeout=300) as client:
        assert client.system_one("hello", {"q": typesafe_sdk.Noul(instructions="Is it?")}).model == MODEL_NAME
        assert [model.name for model in client.models.list().models] == [MODEL_NAME, "jev-latest"]
    other = typesafe_sdk.TypeSafeClient(base_url=f"{server.url}/jev", api_key="unused", model="other", timeout=300)
    with other as client:
        with pytest.raises(TypeSafeNotFoundError) as missing:
            client.system_one("hello", {"q": typesafe_sdk.Noul(instructions="Is it?")})
        message = str(missing.value)
        assert "model: model 'other' is not served here; this server serves 'clef-flash', 'jev-latest'" in message
        assert "--model-alias" in message


def _raw_exchange(server: Predictor, data: bytes, wait_s: float) -> tuple[bytes, float]:
    """Send ``data`` on a fresh connection; return what came back before it closed, and how long that took."""
    import socket
    import time

    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait_s) as sock:
        received = b""
        # the server may stop reading (an oversized request): what it answered is still read below
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return received, time.monotonic() - started


def test_slow_and_oversized_clients_are_cut_off(server: Predictor, client: httpx.Client) -> None:
    unfinished_headers, seconds = _raw_exchange(server, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ", 120)
    assert unfinished_headers == b"" and SLOW_CLIENT_TIMEOUT_S - 1 <= seconds < 60, seconds
    body = json.dumps(simple_request()).encode()
    head = (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % len(body)
    )
    unfinished_body, seconds = _raw_exchange(server, head + body[:10], 120)
    assert unfinished_body.startswith(b"HTTP/1.1 408") and b"request_timeout" in unfinished_body, unfinished_body[:300]
    assert seconds < 60
    huge = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"
    answer, _ = _raw_exchange(server, huge, 120)
    assert answer == b"" or answer.split(b" ")[1] in (b"400", b"431"), answer[:200]
    assert client.get("/health").status_code == 200


# Short samples of the reliability scripts (the full runs and their figures: BENCHMARKS.md, "Reliability").


def test_fuzz_sample_gets_no_5xx_and_no_hang(server: Predictor) -> None:
    from reliability.fuzz import fuzz

    result = asyncio.run(
        fuzz(server.url, requests=300, seconds=600, concurrency=8, request_timeout=120, seed=1, model=MODEL_NAME)
    )
    assert result["ok"], result
    assert result["requests"] == 300
    assert {"200", "400", "404", "413", "422"} <= result["outcomes"].keys(), result["outcomes"]


def test_soak_sample_samples_memory_and_gets_no_error(server: Predictor) -> None:
    from reliability.soak import soak

    result = asyncio.run(
        soak(server.url, clients=4, seconds=6, pid=server.process.pid, sample_seconds=1, settle_seconds=2)
    )
    assert result["errors"] == {} and result["requests"] > 0, result
    assert len(result["rss_mib"]) >= 3 and all(rss > 100 for _, rss in result["rss_mib"]), result


def test_overload_sample_answers_every_request(server: Predictor) -> None:
    from reliability.overload import overload

    result = asyncio.run(overload(server.url, clients=32, seconds=5))
    assert result["ok"], result


def _zstd(raw: bytes) -> bytes:
    try:
        from compression.zstd import compress  # type: ignore[import-not-found]
    except ImportError:
        from backports.zstd import compress
    return compress(raw)


def test_bodies_that_inflate_past_the_body_limit_are_refused_on_every_route(client: httpx.Client) -> None:
    strings = json.dumps(simple_request(state=["ab"] * 1_000_000)).encode()
    cases = [
        ("/v1/systemone", "gzip", gzip.compress(strings)),
        ("/v1/systemone/batch", "zstd", _zstd(b"[" + strings + b"]")),
        (f"/v1/models/{MODEL_NAME}:predict", "zstd", _zstd(b'{"instances":[' + strings + b"]}")),
        (f"/v2/models/{MODEL_NAME}/infer", "gzip", gzip.compress(json.dumps(_v2([strings.decode()])).encode())),
    ]
    for path, encoding, content in cases:
        assert len(content) <= 64 << 10
        response = client.post(path, content=content, headers={"content-encoding": encoding})
        assert response.status_code == 413, (path, response.text)
        assert f"larger than the limit of {MAX_BODY_BYTES} bytes" in response.json()["error"]["message"], response.text


def test_kserve_bodies_hold_at_most_max_batch_items_requests(client: httpx.Client) -> None:
    too_many = [simple_request()] * 65
    response = client.post(f"/v1/models/{MODEL_NAME}:predict", json={"instances": too_many})
    assert response.status_code == 422 and response.json()["error"]["param"] == "instances", response.text
    assert "65 System One requests" in response.text and "--max-batch-items" in response.text
    response = client.post(f"/v2/models/{MODEL_NAME}/infer", json=_v2([json.dumps(r) for r in too_many]))
    assert response.status_code == 422 and response.json()["error"]["param"] == "inputs[0].data", response.text
    assert "--max-batch-items" in response.text
    assert (
        client.post(f"/v1/models/{MODEL_NAME}:predict", json={"instances": [simple_request()] * 64}).status_code == 200
    )
