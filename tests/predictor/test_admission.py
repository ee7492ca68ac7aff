"""Admission by expected wait (the measured service rate) and the body limits' counts, without a server."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import pytest
import torch

from clef_head.encoder import EncodedRequest
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
from predictor.serving.encode_pool import InProcessPreparer
from tests.predictor.conftest import MODEL_NAME, simple_request
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
    for _ in range(4):
        rate.answered(100)  # 400 tokens in 2 busy seconds
    rate.leave(4)
    clock.now = 100.0  # idle time does not count
    rate.enter(2)
    clock.now = 102.0
    rate.answered(1000)
    rate.answered(800)
    rate.leave(2)
    assert rate.per_second() == pytest.approx(2200 / 4)
    assert rate.expected_wait_s(5500) == pytest.approx(10)


def test_the_start_rate_holds_until_a_busy_second_is_measured() -> None:
    clock = Clock()
    rate = ServiceRate(window_s=30, min_busy_s=1, clock=clock, start_per_second=5000.0)
    assert rate.expected_wait_s(10_000) == pytest.approx(2)
    rate.enter(1)
    clock.now = 0.5
    rate.answered(100)
    assert rate.per_second() == 5000.0  # half a busy second: not measured yet
    clock.now = 2.0
    rate.answered(300)
    rate.leave(1)
    assert rate.per_second() == pytest.approx(200)


def test_the_rate_forgets_busy_time_past_its_window() -> None:
    clock = Clock()
    rate = ServiceRate(window_s=10, min_busy_s=1, clock=clock)
    rate.enter(1)
    for second in range(1, 21):  # 1,000 tokens/s for 20 s, then 100 tokens/s for 20 s
        clock.now = second
        rate.answered(1000)
    for second in range(21, 41):
        clock.now = second
        rate.answered(100)
    assert rate.per_second() == pytest.approx(100, rel=0.15)


def test_retry_after_is_the_excess_wait_in_whole_seconds() -> None:
    assert retry_after_s(12.2, 10) == 3
    assert retry_after_s(10.01, 10) == 1


def test_admission_sheds_by_expected_wait_with_429_and_retry_after(tokenizer: Any) -> None:  # noqa: F811
    engine = FakeEngine(tokenizer, capacity=64)
    service = serving(engine, max_wait_s=2.0)
    clock = Clock()
    service.rate = ServiceRate(window_s=30, min_busy_s=1, clock=clock)
    service.rate.enter(1)
    clock.now = 4.0
    service.rate.answered(1200)  # measured: 300 tokens per second, about one simple request a second
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
    assert "--max-queue-wait-s 2" in error.message and "prompt tokens queued" in error.message


def test_an_idle_server_admits_whatever_the_rate(tokenizer: Any) -> None:  # noqa: F811
    service = serving(FakeEngine(tokenizer), max_wait_s=0.001)
    clock = Clock()
    service.rate = ServiceRate(min_busy_s=1, clock=clock)
    service.rate.enter(1)
    clock.now = 100.0
    service.rate.answered(1)
    service.rate.leave(1)
    assert asyncio.run(service.answer(simple_request()))["answers"]


TOKENS_PER_S = 1000.0
LONGEST = 4096
SHORT_STATE = "a short ticket"  # 295 tokens with simple_request's questions (toy vocabulary)
LONG_STATE = "word " * 5000  # cut to LONGEST tokens


class TokenClockEngine(FakeEngine):
    """A FIFO engine that takes ``len(prompt) / TOKENS_PER_S`` seconds of a virtual clock per prompt, and records
    when each prompt started (``gate`` holds every call, as FakeEngine's)."""

    def __init__(self, release_tokenizer: Any, clock: Clock) -> None:
        super().__init__(release_tokenizer, capacity=64, max_length=LONGEST)
        self.clock = clock
        self.started: list[tuple[int, float]] = []

    async def score(self, encoded: EncodedRequest) -> torch.Tensor:
        self.calls += 1
        await self.gate.wait()
        self.started.append((len(encoded.input_ids), self.clock.now))
        self.clock.now += len(encoded.input_ids) / TOKENS_PER_S
        return torch.zeros(encoded.layout.option_count)


def mixed_body(index: int, long: bool) -> dict[str, Any]:
    return simple_request(state=f"{index} " + (LONG_STATE if long else SHORT_STATE))


def measured_service(release_tokenizer: Any, max_wait_s: float) -> tuple[Any, TokenClockEngine, Clock]:
    """A service whose rate was measured online over alternating short and long prompts."""
    clock = Clock()
    engine = TokenClockEngine(release_tokenizer, clock)
    service = serving(engine, max_wait_s=max_wait_s)
    service.rate = ServiceRate(window_s=30, min_busy_s=1, clock=clock)

    async def measure() -> None:
        for index in range(16):
            await service.answer(mixed_body(-index - 1, long=index % 2 == 1))

    asyncio.run(measure())
    lengths = {length for length, _ in engine.started}
    assert max(lengths) == LONGEST and min(lengths) < LONGEST / 10, lengths
    engine.started.clear()
    return service, engine, clock


async def arrive_while_held(service: Any, engine: TokenClockEngine, bodies: list[dict[str, Any]]) -> list[Any]:
    """Send ``bodies`` one after another while the engine holds every call (each reaches the engine or is
    refused before the next is sent), then let the engine run; the outcomes in arrival order."""
    engine.gate.clear()
    tasks = []
    for body in bodies:
        calls = engine.calls
        task = asyncio.create_task(service.answer(body))
        while engine.calls == calls and not task.done():
            await asyncio.sleep(0.001)
        tasks.append(task)
    engine.gate.set()
    return await asyncio.gather(*tasks, return_exceptions=True)


def test_admitted_requests_of_mixed_lengths_wait_no_longer_than_the_bound(tokenizer: Any) -> None:  # noqa: F811
    """Admission counts prompt tokens, not requests: whatever the mix of 295- and 4,096-token prompts, no admitted
    request waits longer than --max-queue-wait-s for the engine (a request count would let four long prompts, 16 s
    of work, in ahead of a fifth)."""
    max_wait_s = 10.0
    service, engine, clock = measured_service(tokenizer, max_wait_s)
    bodies = [mixed_body(index, long=index % 3 != 2) for index in range(30)]  # long, long, short, long, ...
    arrived = clock.now
    outcomes = asyncio.run(arrive_while_held(service, engine, bodies))
    refused = [item for item in outcomes if isinstance(item, Unavailable)]
    assert refused and all(item.reason == "overloaded" for item in refused)
    assert len(engine.started) == len(outcomes) - len(refused) >= 3
    assert {length for length, _ in engine.started} == {max(engine.started)[0], min(engine.started)[0]}
    waits = [started - arrived for _, started in engine.started]
    assert max(waits) <= max_wait_s, waits
    assert service.queued == service.queued_tokens == 0


def test_many_short_prompts_are_admitted_where_few_long_ones_are_refused(tokenizer: Any) -> None:  # noqa: F811
    service, engine, _ = measured_service(tokenizer, max_wait_s=10.0)

    async def scenario() -> tuple[list[Any], list[Any]]:
        short = await arrive_while_held(service, engine, [mixed_body(index, long=False) for index in range(30)])
        long = await arrive_while_held(service, engine, [mixed_body(100 + index, long=True) for index in range(4)])
        return short, long

    short, long = asyncio.run(scenario())
    assert all(isinstance(item, dict) for item in short)  # 29 x 295 tokens ahead: under 9 s at 1,000 tokens/s
    assert [isinstance(item, Unavailable) for item in long] == [False, False, False, True]  # 12,288 tokens ahead


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


class SlowPreparer(InProcessPreparer):
    """Prepares in the serving thread, taking ``seconds`` of the virtual clock for each body."""

    def __init__(self, release_tokenizer: Any, clock: Clock, seconds: float) -> None:
        super().__init__(release_tokenizer)
        self.clock = clock
        self.seconds = seconds

    async def run(self, job: Any, *args: Any, inline: bool = False) -> Any:
        self.clock.now += self.seconds
        return job(self.tokenizer, *args)


def test_refused_bodies_do_not_slow_the_measured_rate(tokenizer: Any) -> None:  # noqa: F811
    """A fuzzing client's bodies, refused before they reach the engine, hold no engine time: after a minute of them
    the rate is still the engine's, and a load that follows is admitted as on a fresh server."""
    service, engine, clock = measured_service(tokenizer, max_wait_s=10.0)
    measured = service.rate.per_second()
    assert measured == pytest.approx(TOKENS_PER_S)
    service.preparer = SlowPreparer(tokenizer, clock, seconds=1.0)

    async def fuzz_then_load() -> tuple[float | None, list[Any]]:
        for index in range(60):  # a minute of bodies that fail validation
            refused = await asyncio.gather(
                service.answer({"model": MODEL_NAME, "state": index}), return_exceptions=True
            )
            assert isinstance(refused[0], BadInput), refused
        await service.answer(mixed_body(-100, long=False))  # alone: admitted whatever the rate, and measured
        after_fuzz = service.rate.per_second()
        service.preparer = InProcessPreparer(tokenizer)
        return after_fuzz, await arrive_while_held(service, engine, [mixed_body(i, long=False) for i in range(20)])

    after_fuzz, load = asyncio.run(fuzz_then_load())
    assert after_fuzz == pytest.approx(measured)
    assert all(isinstance(item, dict) for item in load)  # 19 x 295 tokens ahead: under 6 s at 1,000 tokens/s
