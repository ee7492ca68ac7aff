"""Admission by expected wait (the measured service rate) and the body limits' counts, without a server."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import pytest

from predictor.core.errors import BadInput, TooLarge, Unavailable
from predictor.http.errors import from_service_error
from predictor.serving.admission import ServiceRate, retry_after_s
from predictor.serving.body_limits import (
    MAX_JSON_CONTAINERS,
    MAX_JSON_VALUES,
    check_item_count,
    check_json_counts,
    check_texts_json_counts,
    json_counts,
)
from tests.predictor.conftest import simple_request
from tests.predictor.test_serving import FakeEngine, serving, tokenizer  # noqa: F401 (the fixture)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_counts_busy_time_only() -> None:
    clock = Clock()
    rate = ServiceRate(window_s=30, min_busy_s=1, clock=clock)
    assert rate.per_second() is None and rate.expected_wait_s(10) is None
    rate.enter(4)
    clock.now = 2.0
    rate.answered(4)  # 4 records in 2 busy seconds
    rate.leave(4)
    clock.now = 100.0  # idle time does not count
    rate.enter(2)
    clock.now = 102.0
    rate.answered(2)
    rate.leave(2)
    assert rate.per_second() == pytest.approx(6 / 4)
    assert rate.expected_wait_s(15) == pytest.approx(10)


def test_the_rate_forgets_busy_time_past_its_window() -> None:
    clock = Clock()
    rate = ServiceRate(window_s=10, min_busy_s=1, clock=clock)
    rate.enter(1)
    for second in range(1, 21):  # 10 records/s for 20 s, then 1 record/s for 20 s
        clock.now = second
        rate.answered(10)
    for second in range(21, 41):
        clock.now = second
        rate.answered(1)
    assert rate.per_second() == pytest.approx(1.0, rel=0.15)


def test_retry_after_is_the_excess_wait_in_whole_seconds() -> None:
    assert retry_after_s(12.2, 10) == 3
    assert retry_after_s(10.01, 10) == 1


def test_admission_sheds_by_expected_wait_with_503_and_retry_after(tokenizer: Any) -> None:  # noqa: F811
    engine = FakeEngine(tokenizer, capacity=64)
    service = serving(engine, max_wait_s=2.0)
    clock = Clock()
    service.rate = ServiceRate(window_s=30, min_busy_s=1, clock=clock)
    service.rate.enter(1)
    clock.now = 4.0
    service.rate.answered(4)  # measured: 1 record per second
    service.rate.leave(1)

    async def scenario() -> list[Any]:
        engine.gate.clear()
        held = [asyncio.create_task(service.answer(simple_request(state=f"held {i}"))) for i in range(3)]
        while engine.calls < 3:
            await asyncio.sleep(0.01)
        refused = await asyncio.gather(service.answer(simple_request(state="late")), return_exceptions=True)
        engine.gate.set()
        return [*refused, *(await asyncio.gather(*held))]

    refused, *answered = asyncio.run(scenario())
    assert service.queued == 0
    assert all(isinstance(item, dict) for item in answered)
    assert isinstance(refused, Unavailable) and refused.reason == "overloaded"
    error = from_service_error(refused)
    assert error.status == 429 and error.headers == {"Retry-After": "1", "retry-after-ms": "1000"}
    assert "--max-queue-wait-s 2" in error.message and "3 records queued" in error.message


def test_an_idle_server_admits_whatever_the_rate(tokenizer: Any) -> None:  # noqa: F811
    service = serving(FakeEngine(tokenizer), max_wait_s=0.001)
    clock = Clock()
    service.rate = ServiceRate(min_busy_s=1, clock=clock)
    service.rate.enter(1)
    clock.now = 100.0
    service.rate.answered(1)
    service.rate.leave(1)
    assert asyncio.run(service.answer(simple_request()))["answers"]


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    "value",
    [[1, 2, [3, {}]], {"a": [1, "x,y"], "b": {"c": None}}, "a,b,c", [], {"k": '\\",[{'}],
)
def test_counts_are_exact_for_json(value: Any) -> None:
    def walk(item: Any) -> tuple[int, int]:
        children = list(item.values()) if isinstance(item, dict) else item if isinstance(item, list) else []
        counts = [walk(child) for child in children]
        own = 1 if isinstance(item, (dict, list)) else 0
        return 1 + sum(v for v, _ in counts), own + sum(c for _, c in counts)

    assert json_counts(_json(value), exact=True) == walk(value)


def test_too_many_values_or_containers_get_413_naming_the_limit() -> None:
    with pytest.raises(TooLarge, match=f"more than the limit of {MAX_JSON_VALUES}"):
        check_json_counts(_json(["ab"] * (MAX_JSON_VALUES + 1)))
    with pytest.raises(TooLarge, match=f"1000001 JSON values, more than the limit of {MAX_JSON_VALUES}"):
        check_json_counts(_json(list(range(1_000_000))))
    with pytest.raises(TooLarge, match=f"JSON arrays and objects, more than the limit of {MAX_JSON_CONTAINERS}"):
        check_json_counts(_json([[]] * (MAX_JSON_CONTAINERS + 1)))
    check_json_counts(_json({"state": "a,b," * 1_000_000}))  # commas in a string are no values
    check_json_counts(_json(list(range(MAX_JSON_VALUES - 1))))
    with pytest.raises(TooLarge) as raised:
        check_texts_json_counts([_json(list(range(MAX_JSON_VALUES // 2)))] * 3, "inputs[0].data")
    assert raised.value.loc == ("inputs", 0, "data") and from_service_error(raised.value).status == 413
    check_texts_json_counts([_json({"state": "," * 200_000})] * 3, "inputs[0].data")


def test_too_many_items_get_422_naming_the_field_and_the_flag() -> None:
    check_item_count(64, 64, "instances")
    with pytest.raises(BadInput) as raised:
        check_item_count(65, 64, "inputs[0].data")
    error = from_service_error(raised.value)
    assert error.status == 422 and error.param == "inputs[0].data" and "--max-batch-items" in error.message


def test_a_million_short_strings_are_refused_without_stripping_them() -> None:
    raw = gzip.decompress(gzip.compress(_json({"state": ["ab"] * 1_000_000})))
    values, _ = json_counts(raw)
    assert values > MAX_JSON_VALUES


def _zstd(raw: bytes) -> bytes:
    try:
        from compression.zstd import compress  # type: ignore[import-not-found]
    except ImportError:
        from backports.zstd import compress
    return compress(raw)


def test_the_body_middleware_refuses_inflated_bodies_naming_the_limit() -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from predictor.http.http_body import RequestBodyMiddleware

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"bytes": len(await request.body())})

    client = TestClient(RequestBodyMiddleware(Starlette(routes=[Route("/v1/systemone", echo, methods=["POST"])])))
    strings = _json(simple_request(state=["ab"] * 1_000_000))
    lists = _json(simple_request(state=[[]] * (MAX_JSON_CONTAINERS + 1)))
    numbers = _json(simple_request(state=[0] * MAX_JSON_VALUES))
    cases = [
        ("gzip", gzip.compress(strings), f"JSON values, more than the limit of {MAX_JSON_VALUES}"),
        ("zstd", _zstd(lists), f"JSON arrays and objects, more than the limit of {MAX_JSON_CONTAINERS}"),
        ("gzip, zstd", _zstd(gzip.compress(numbers)), f"JSON values, more than the limit of {MAX_JSON_VALUES}"),
        ("gzip", gzip.compress(b" " * (9 << 20)), "larger than the limit of 8388608 bytes"),
    ]
    for encoding, content, words in cases:
        assert len(content) <= 64 << 10
        response = client.post("/v1/systemone", content=content, headers={"content-encoding": encoding})
        assert response.status_code == 413, response.text
        assert words in response.json()["error"]["message"] and response.json()["error"]["type"] == "request_too_large"
    under = _json(simple_request(state=[0] * (MAX_JSON_VALUES - 100)))
    response = client.post("/v1/systemone", content=_zstd(under), headers={"content-encoding": "zstd"})
    assert response.status_code == 200 and response.json() == {"bytes": len(under)}
