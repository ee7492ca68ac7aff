"""The service's admission queue, answer cache and merging, the lifecycle, engine death and SIGTERM,
with a fake engine (no model, no server)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import REGISTRY

from clef_head.encoder import EncodedRequest
from clef_head.request import DEFAULT_LIMITS
from predictor.core.errors import EngineFailed, ServiceError, Unavailable
from predictor.engines.base import Engine, EngineDead
from predictor.http.errors import from_service_error
from predictor.http.shutdown import GracefulShutdown
from predictor.model import ClefModel
from predictor.serving.encode_pool import InProcessPreparer
from predictor.serving.lifecycle import ENGINE_DEAD_EXIT_CODE, Lifecycle, Phase
from predictor.serving.options import ServingOptions
from predictor.serving.prepare import PrepareSettings, VisionSettings, prepare
from predictor.serving.request_policy import RequestPolicy
from predictor.serving.service import ModelCard, SystemOneService
from predictor.serving.warmup import (
    WARMUP_SCHEMAS,
    WarmupDoesNotFit,
    WarmupSchema,
    image_warmup_body,
    schema_tokens,
    warmup_schema,
)
from tests.polling import eventually
from tests.predictor.conftest import MODEL_NAME, encode_workers, simple_request

CARD = ModelCard(MODEL_NAME, "test", "1970-01-01")


class FakeEngine(Engine):
    """Logits derived from the prompt (so different prompts differ); ``gate`` holds every call."""

    kind = "fake"

    def __init__(self, tokenizer: Any, capacity: int = 2, max_length: int = 512) -> None:
        self._tokenizer = tokenizer
        self._capacity = capacity
        self._max_length = max_length
        self.lengths: list[int] = []
        self.images: list[int] = []
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.image_gate = asyncio.Event()  # holds only prompts with images
        self.image_gate.set()
        self.dead: str | None = None
        self.nan = False
        self.closed = False

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def capacity(self) -> int:
        return self._capacity

    async def score(self, encoded: EncodedRequest) -> torch.Tensor:
        self.calls += 1
        self.lengths.append(len(encoded.input_ids))
        self.images.append(0 if encoded.media is None else encoded.media.image_count)
        await self.gate.wait()
        if encoded.media is not None:
            await self.image_gate.wait()
        if self.dead:
            raise EngineDead(self.dead)
        seed = sum(encoded.input_ids) % 1000
        logits = torch.arange(encoded.layout.option_count, dtype=torch.float32) * (seed + 1) * 0.001
        return logits.fill_(float("nan")) if self.nan else logits

    async def check_health(self) -> None:
        if self.dead:
            raise EngineDead(self.dead)

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def tokenizer(toy_release: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(toy_release))


def serving(engine: FakeEngine, **options: Any) -> SystemOneService:
    lifecycle = Lifecycle(MODEL_NAME)
    lifecycle.enter(Phase.OK)
    return SystemOneService(engine, CARD, lifecycle, **options)


def test_a_full_queue_answers_429_with_retry_after_at_once(tokenizer: Any) -> None:
    engine = FakeEngine(tokenizer, capacity=1)
    service = serving(engine)
    assert service.max_queued == 4  # 4 x what the engine runs at once

    async def scenario() -> tuple[list[Any], float]:
        engine.gate.clear()
        held = [asyncio.create_task(service.answer(simple_request(state=f"held {i}"))) for i in range(4)]
        while engine.calls < 4:
            await asyncio.sleep(0.01)
        started = time.perf_counter()
        refused = await asyncio.gather(
            *(service.answer(simple_request(state=f"extra {i}")) for i in range(3)), return_exceptions=True
        )
        elapsed = time.perf_counter() - started
        engine.gate.set()
        answered = await asyncio.gather(*held)
        return [*refused, *answered], elapsed

    results, elapsed = asyncio.run(scenario())
    refused, answered = results[:3], results[3:]
    assert all(isinstance(item, Unavailable) and item.reason == "overloaded" for item in refused), refused
    assert elapsed < 5, "refusals must not wait for the engine"
    assert all(isinstance(item, dict) and item["answers"] for item in answered)
    error = from_service_error(refused[0])
    assert error.status == 429 and error.headers == {"Retry-After": "1", "retry-after-ms": "1000"}
    assert "--max-queued-requests" in error.message and error.body()["error"]["type"] == "too_many_requests"
    assert service.queued == 0


def test_a_full_queue_answers_bad_bodies_with_their_4xx(tokenizer: Any) -> None:
    """Only valid work is shed: a malformed body gets its error naming the field however busy the server is."""
    engine = FakeEngine(tokenizer, capacity=1)
    service = serving(engine)
    bad_field = simple_request()
    bad_field["questions"]["topic"]["criteria"] = {"only": None}
    bad_item = json.dumps([bad_field, "not a request"]).encode()

    async def scenario() -> list[Any]:
        engine.gate.clear()
        held = [asyncio.create_task(service.answer(simple_request(state=f"held {i}"))) for i in range(4)]
        while engine.calls < 4:
            await asyncio.sleep(0.01)
        outcomes = await asyncio.gather(
            service.answer_json(b"{not json", "application/json"),
            service.answer_json(json.dumps(bad_field).encode(), "application/json"),
            service.answer(bad_field),
            service.answer_batch_json(bad_item, "application/json", 8),
            service.answer(simple_request(state="valid but late")),
            return_exceptions=True,
        )
        engine.gate.set()
        await asyncio.gather(*held)
        return outcomes

    unreadable, bad_json, bad_parsed, batch, valid = asyncio.run(scenario())
    assert from_service_error(unreadable).status == 400, unreadable
    for error in (bad_json, bad_parsed):
        assert from_service_error(error).status == 422 and error.loc == ("questions", "topic", "criteria"), error
    assert [(from_service_error(item).status, item.loc[0]) for item in batch] == [(422, 0), (422, 1)], batch
    assert isinstance(valid, Unavailable) and valid.reason == "overloaded"
    assert service.queued == 0


def test_cached_and_merged_answers_equal_computed_ones_and_different_requests_never_share(tokenizer: Any) -> None:
    engine = FakeEngine(tokenizer)
    service = serving(engine, answer_cache_bytes=1 << 20)
    first, second = simple_request(state="first ticket"), simple_request(state="second ticket")

    async def scenario() -> list[dict[str, Any]]:
        computed = await service.answer(first)
        cached = await service.answer(first)
        other = await service.answer(second)
        engine.gate.clear()
        merged = [asyncio.create_task(service.answer(simple_request(state="third ticket"))) for _ in range(5)]
        while engine.calls < 3:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        engine.gate.set()
        return [computed, cached, other, *await asyncio.gather(*merged)]

    computed, cached, other, *merged = asyncio.run(scenario())
    assert cached == computed
    assert other != computed and other["answers"] != computed["answers"]
    assert all(answer == merged[0] for answer in merged)
    assert engine.calls == 3  # first, second, one call for the five merged
    alone = asyncio.run(serving(FakeEngine(tokenizer)).answer(simple_request(state="third ticket")))
    assert merged[0] == alone


def test_different_question_ids_never_share_logits(tokenizer: Any) -> None:
    engine = FakeEngine(tokenizer)
    service = serving(engine, answer_cache_bytes=1 << 20)
    body = simple_request()
    renamed = {**body, "questions": {f"{key}_2": value for key, value in body["questions"].items()}}

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        return await service.answer(body), await service.answer(renamed)

    one, two = asyncio.run(scenario())
    assert engine.calls == 2 and set(two["answers"]) == {"urgent_2", "topic_2", "tone_2"}


class CountingPreparer(InProcessPreparer):
    """Prepares in a thread, counting the bodies it is given."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.jobs = 0

    async def run(self, job: Any, *args: Any, inline: bool = False) -> Any:
        self.jobs += 1
        return await super().run(job, *args, inline=inline)


def _hits() -> float:
    return REGISTRY.get_sample_value("clef_answer_cache_total", {"outcome": "hit"}) or 0.0


def test_a_body_answered_before_is_answered_again_without_being_read_and_equal(tokenizer: Any) -> None:
    engine = FakeEngine(tokenizer)
    preparer = CountingPreparer(tokenizer)
    service = serving(engine, answer_cache_bytes=1 << 20, preparer=preparer)
    raw = json.dumps(simple_request()).encode()
    reordered = json.dumps(dict(reversed(list(simple_request().items())))).encode()

    async def scenario() -> list[dict[str, Any]]:
        first = await service.answer_json(raw, "application/json")
        first["usage"]["input_tokens"] = -1  # a caller changing its response changes no later answer
        return [
            await service.answer_json(raw, "application/json"),
            await service.answer_json(raw, "application/json"),
            await service.answer_json(raw, "application/json; charset=utf-8"),
            await service.answer_json(reordered, "application/json"),
        ]

    hits = _hits()
    again, third, other_type, reordered_answer = asyncio.run(scenario())
    alone = asyncio.run(serving(FakeEngine(tokenizer)).answer_json(raw, "application/json"))
    assert again == third == other_type == reordered_answer == alone
    # the repeats were neither read nor scored; another content type or byte order is read again, not scored
    assert preparer.jobs == 3 and engine.calls == 1
    assert _hits() - hits == 4
    assert again is not third  # each hit is its own copy


def test_a_body_is_answered_from_the_cache_only_while_serving_and_never_when_it_failed(tokenizer: Any) -> None:
    engine = FakeEngine(tokenizer)
    preparer = CountingPreparer(tokenizer)
    service = serving(engine, answer_cache_bytes=1 << 20, preparer=preparer)
    raw = json.dumps(simple_request()).encode()
    wrong = json.dumps(simple_request(model="another-model")).encode()
    asyncio.run(service.answer_json(raw, "application/json"))
    for _ in range(2):
        with pytest.raises(ServiceError):
            asyncio.run(service.answer_json(wrong, "application/json"))
    assert preparer.jobs == 3  # a refused body is read again each time
    service.lifecycle.phase = Phase.WARMING_UP
    with pytest.raises(Unavailable):
        asyncio.run(service.answer_json(raw, "application/json"))
    off = serving(FakeEngine(tokenizer), answer_cache_bytes=0, preparer=CountingPreparer(tokenizer))
    for _ in range(2):
        asyncio.run(off.answer_json(raw, "application/json"))
    assert off.preparer.jobs == 2 and off.engine.calls == 2 and len(off.cache) == 0


def test_responses_and_logits_share_the_bytes_of_one_cache() -> None:
    from predictor.serving.answer_cache import ENTRY_OVERHEAD_BYTES, AnswerCache, body_key

    response = {"answers": {"q": "yes"}, "usage": {"input_tokens": 7}}
    text = json.dumps(response, separators=(",", ":")).encode()
    keys = [body_key(("settings",), "application/json", bytes([i]) * 32) for i in range(3)]
    entry = len("application/json") + 32 + len(text) + ENTRY_OVERHEAD_BYTES
    cache = AnswerCache(max_bytes=2 * entry)
    for key in keys[:2]:
        cache.keep_response(key, response)
    assert cache.response(keys[0]) == response  # keys[0] is now the most recently used
    cache.keep_response(keys[2], response)
    assert cache.bytes == 2 * entry and cache.response(keys[1]) is None and cache.response(keys[0]) is not None
    too_big = AnswerCache(max_bytes=entry - 1)
    too_big.keep_response(keys[0], response)
    assert len(too_big) == 0 and too_big.bytes == 0


def test_the_cache_stays_within_its_bytes_and_drops_the_least_recently_used() -> None:
    from clef_head.layout import QuestionLayout, RecordLayout
    from predictor.serving.answer_cache import ENTRY_OVERHEAD_BYTES, AnswerCache

    layout = RecordLayout((QuestionLayout("q", 0, (0, 1), ((1, 2), (2, 3)), ("true", "false")),))
    entry = 4 * 4 + 2 * 4 + ENTRY_OVERHEAD_BYTES  # 4 token ids, 2 float32 logits
    cache = AnswerCache(max_bytes=2 * entry)
    keys = [((bytes([i]) * 16), layout) for i in range(3)]
    cache.put(keys[0], torch.zeros(2))
    cache.put(keys[1], torch.ones(2))
    assert cache.get(keys[0]) is not None  # keys[0] is now the most recently used
    cache.put(keys[2], torch.full((2,), 2.0))
    assert cache.bytes <= 2 * entry and len(cache) == 2
    assert cache.get(keys[1]) is None and cache.get(keys[0]) is not None and cache.get(keys[2]) is not None
    off = AnswerCache(max_bytes=0)
    off.put(keys[0], torch.zeros(2))
    assert len(off) == 0


def test_not_ready_states_refuse_with_retry_after(tokenizer: Any) -> None:
    service = serving(FakeEngine(tokenizer))
    for phase, reason in ((Phase.WARMING_UP, "warming_up"), (Phase.UNLOADED, "unloaded")):
        service.lifecycle.phase = phase
        with pytest.raises(Unavailable) as caught:
            asyncio.run(service.answer(simple_request()))
        assert caught.value.reason == reason
        assert from_service_error(caught.value).headers["Retry-After"]


def test_a_draining_server_is_not_ready_but_still_answers(tokenizer: Any) -> None:
    """The shutdown delay: readiness (clef_ready) is off so the endpoints go, the requests still sent are served."""
    service = serving(FakeEngine(tokenizer))
    service.lifecycle.enter(Phase.DRAINING)
    assert not service.lifecycle.ready
    answer = asyncio.run(service.answer(simple_request()))
    assert answer["answers"], answer


def _model(engine: FakeEngine, exits: list[int], exit_on_death: bool = True) -> ClefModel:
    options = ServingOptions(warmup_max_batch=1, exit_on_engine_death=exit_on_death)
    model = ClefModel(CARD, lambda: engine, options=options, exit_process=exits.append)
    assert model.load() and model.ready and model.engine
    return model


def test_the_warm_up_uses_the_fullest_schema_that_fits_and_refuses_a_length_no_request_fits(tokenizer: Any) -> None:
    full, short = (schema_tokens(tokenizer, questions) for questions in WARMUP_SCHEMAS)
    assert short < full
    assert warmup_schema(tokenizer, full) == WarmupSchema(WARMUP_SCHEMAS[0], full)
    assert warmup_schema(tokenizer, full).full
    assert warmup_schema(tokenizer, full - 1) == WarmupSchema(WARMUP_SCHEMAS[1], short)
    with pytest.raises(WarmupDoesNotFit, match=f"--max-model-len {short - 1} leaves no room .* takes {short} tokens"):
        warmup_schema(tokenizer, short - 1)

    exits: list[int] = []
    engine = FakeEngine(tokenizer, max_length=full - 1)
    model = _model(engine, exits)
    assert model.warmup is not None and not model.warmup.full

    async def warm_up() -> None:
        watching = asyncio.create_task(model.start_engine())
        while not model.lifecycle.ready:
            await asyncio.sleep(0.01)
        model.stop_engine()
        await asyncio.wait_for(watching, 10)

    asyncio.run(warm_up())
    assert engine.lengths and max(engine.lengths) == full - 1 and min(engine.lengths) >= short

    too_short = FakeEngine(tokenizer, max_length=short - 1)
    with pytest.raises(WarmupDoesNotFit):
        ClefModel(CARD, lambda: too_short, options=ServingOptions()).load()
    assert too_short.closed and too_short.calls == 0


def _vision_model(engine: FakeEngine, release_dir: Path) -> ClefModel:
    vision = VisionSettings(str(release_dir), videos=False)
    model = ClefModel(CARD, lambda: engine, options=ServingOptions(warmup_max_batch=1, vision=vision))
    assert model.load()
    return model


def _warmed_up(model: ClefModel) -> None:
    async def scenario() -> None:
        watching = asyncio.create_task(model.start_engine())
        await asyncio.wait_for(_until_ready(model), 60)
        model.stop_engine()
        await asyncio.wait_for(watching, 10)

    asyncio.run(scenario())


def test_on_a_vision_server_ready_waits_for_one_small_image_through_the_engine(
    tokenizer: Any, toy_release: Path
) -> None:
    """After the text shapes, the warm-up sends one request with one image through the preparer and the engine, as
    a user's image goes; the model is not ready while the engine holds it. A text-only server sends none."""
    engine = FakeEngine(tokenizer, max_length=4096)
    model = _vision_model(engine, toy_release)

    async def scenario() -> None:
        engine.image_gate.clear()
        watching = asyncio.create_task(model.start_engine())
        try:
            await asyncio.wait_for(_until(lambda: 1 in engine.images), 60)
            await asyncio.sleep(0.2)
            assert not model.lifecycle.ready  # the image step is held in the engine
            engine.image_gate.set()
            await asyncio.wait_for(_until_ready(model), 60)
        finally:
            model.stop_engine()
            engine.image_gate.set()
            await asyncio.wait_for(watching, 10)

    asyncio.run(scenario())
    assert engine.images[-1] == 1 and not any(engine.images[:-1])  # the text shapes first, then the image
    image_seconds = REGISTRY.get_sample_value("clef_warmup_image_seconds")
    assert image_seconds is not None and image_seconds > 0

    text_only = FakeEngine(tokenizer, max_length=4096)
    _warmed_up(_model(text_only, []))
    assert text_only.calls and not any(text_only.images)
    assert REGISTRY.get_sample_value("clef_warmup_image_seconds") == 0


def test_the_image_step_is_left_out_where_no_image_fits_and_says_so(
    tokenizer: Any, toy_release: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A longest prompt that holds the text warm-up but not the image step's (its shortest question and the
    smallest image): every image request would be refused before the engine, so no image is sent; a warning says
    so and the model is ready."""
    settings = PrepareSettings(MODEL_NAME, DEFAULT_LIMITS, RequestPolicy(), 4096, VisionSettings(str(toy_release)))
    image_prompt = len(prepare(tokenizer, settings, image_warmup_body(MODEL_NAME))[1].input_ids)
    assert image_prompt - 1 >= schema_tokens(tokenizer, WARMUP_SCHEMAS[-1])
    engine = FakeEngine(tokenizer, max_length=image_prompt - 1)
    with caplog.at_level("WARNING", logger="predictor.serving.warmup"):
        _warmed_up(_vision_model(engine, toy_release))
    assert engine.calls and not any(engine.images)
    assert f"no image fits --max-model-len {image_prompt - 1}" in caplog.text


def _pool_model(engine: FakeEngine, release_dir: Path) -> ClefModel:
    options = ServingOptions(warmup_max_batch=1, encode_processes=2, release_dir=release_dir)
    return ClefModel(CARD, lambda: engine, options=options, exit_process=lambda code: None)


def test_encode_workers_start_when_the_engine_is_built_and_ready_waits_for_their_probes(
    tokenizer: Any, toy_release: Path
) -> None:
    """``load()`` spawns the workers, so they load the tokenizer while the listeners open and the engine warms up;
    the model is ready once the warm-up has ended and every worker's probe matched the engine's prompt."""
    engine = FakeEngine(tokenizer)
    model = _pool_model(engine, toy_release)
    before = set(encode_workers(os.getpid()))
    model.load()

    def two_new_workers() -> set[int] | None:
        """Polled: the kernel resumes the spawning process before a new child's command line is in place."""
        launched = set(encode_workers(os.getpid())) - before
        return launched if len(launched) >= 2 else None

    launched = eventually(two_new_workers, "two new encode workers", timeout=30)
    assert len(launched) == 2 and engine.calls == 0  # spawned at load, before start_engine

    async def scenario() -> None:
        engine.gate.clear()
        watching = asyncio.create_task(model.start_engine())
        while not engine.calls:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert not model.lifecycle.ready  # the warm-up is held
        engine.gate.set()
        await asyncio.wait_for(_until_ready(model), 60)
        model.stop_engine()
        await asyncio.wait_for(watching, 10)

    try:
        asyncio.run(scenario())
    finally:
        model.stop_engine()
    assert not set(encode_workers(os.getpid())) & launched


def test_a_worker_that_encodes_otherwise_fails_the_start_and_stops_the_warm_up(
    tokenizer: Any, tiny_release: Path
) -> None:
    """Workers with another release's tokenizer: start_engine raises before the model is ready, and the warm-up
    it started beside the probes is cancelled, not left running."""
    engine = FakeEngine(tokenizer)
    model = _pool_model(engine, tiny_release)  # Qwen3.5's vocabulary; the engine has the toy one
    model.load()

    async def scenario() -> None:
        engine.gate.clear()  # the warm-up stops at its first engine call while the probes are compared
        with pytest.raises(RuntimeError, match="encodes differently from the engine's"):
            await asyncio.wait_for(model.start_engine(), 60)
        held = engine.calls
        engine.gate.set()  # a warm-up still running would go on to its next shapes now
        await asyncio.sleep(0.3)
        assert held >= 1 and engine.calls == held

    try:
        asyncio.run(scenario())
    finally:
        model.stop_engine()
    assert not model.lifecycle.ready


async def _until_ready(model: ClefModel) -> None:
    while not model.lifecycle.ready:
        await asyncio.sleep(0.01)


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("engine_on_shutdown", ["never answers", "raises EngineDead"])
def test_sigterm_during_warm_up_ends_it_quietly(engine_on_shutdown: str, tokenizer: Any) -> None:
    """vLLM's engine core spawned: a closed engine never answers the warm-up's requests (the process hung);
    in process: they raise EngineDead (a traceback). Either way the warm-up ends and start_engine returns."""
    engine = FakeEngine(tokenizer)
    exits: list[int] = []
    model = _model(engine, exits)

    async def scenario() -> None:
        engine.gate.clear()
        watching = asyncio.create_task(model.start_engine())
        while not engine.calls:
            await asyncio.sleep(0.01)
        model.lifecycle.enter(Phase.DRAINING)  # what SIGTERM does first
        if engine_on_shutdown == "raises EngineDead":
            engine.dead = "the engine core is shutting down"
            engine.gate.set()
        else:
            model.stop_engine()  # what KServe does once the shutdown delay is over
        await asyncio.wait_for(watching, 5)

    asyncio.run(scenario())
    assert exits == [] and not model.lifecycle.ready
    assert engine.closed == (engine_on_shutdown == "never answers")


def test_engine_death_ends_the_process_within_five_seconds_and_in_flight_requests_get_503(tokenizer: Any) -> None:
    engine = FakeEngine(tokenizer)
    exits: list[int] = []
    model = _model(engine, exits)

    async def scenario() -> tuple[Any, float]:
        watching = asyncio.create_task(model.start_engine())
        while not model.lifecycle.ready:
            await asyncio.sleep(0.01)
        assert await model.healthy()
        engine.gate.clear()
        in_flight = asyncio.create_task(model.service.answer(simple_request()))
        await asyncio.sleep(0.05)
        died = time.perf_counter()
        engine.dead = "engine core killed"
        engine.gate.set()
        outcome = await asyncio.gather(in_flight, return_exceptions=True)
        await asyncio.wait_for(watching, 10)
        return outcome[0], time.perf_counter() - died

    outcome, elapsed = asyncio.run(scenario())
    assert isinstance(outcome, Unavailable) and outcome.reason == "engine_dead"
    assert from_service_error(outcome).status == 503
    assert exits == [ENGINE_DEAD_EXIT_CODE] and elapsed < 5
    assert model.lifecycle.phase is Phase.ENGINE_DEAD and not model.lifecycle.live and engine.closed
    assert "engine core killed" in (model.lifecycle.failure or "")


def test_without_exit_on_engine_death_the_process_stays_and_liveness_fails(tokenizer: Any) -> None:
    engine = FakeEngine(tokenizer)
    exits: list[int] = []
    model = _model(engine, exits, exit_on_death=False)

    async def scenario() -> None:
        watching = asyncio.create_task(model.start_engine())
        while not model.lifecycle.ready:
            await asyncio.sleep(0.01)
        engine.dead = "worker gone"
        await asyncio.wait_for(watching, 10)

    asyncio.run(scenario())
    assert exits == [] and not model.lifecycle.live and not asyncio.run(model.healthy())
    with pytest.raises(Unavailable, match="worker gone"):
        asyncio.run(model.service.answer(simple_request()))


def test_stopping_the_model_is_not_engine_death(tokenizer: Any) -> None:
    engine = FakeEngine(tokenizer)
    exits: list[int] = []
    model = _model(engine, exits)

    async def scenario() -> None:
        watching = asyncio.create_task(model.start_engine())
        while not model.lifecycle.ready:
            await asyncio.sleep(0.01)
        model.stop_engine()
        engine.dead = "closed"
        await asyncio.wait_for(watching, 10)

    asyncio.run(scenario())
    assert exits == [] and model.lifecycle.phase is Phase.STOPPED and not model.ready


def test_sigterm_fails_readiness_first_and_hands_over_after_the_delay() -> None:
    lifecycle = Lifecycle(MODEL_NAME)
    lifecycle.enter(Phase.OK)
    handed: list[float] = []
    saved = signal.getsignal(signal.SIGTERM)

    async def scenario() -> tuple[Phase, float]:
        signal.signal(signal.SIGTERM, lambda signum, frame: handed.append(time.perf_counter()))
        shutdown = GracefulShutdown(app=None, lifecycle=lifecycle, delay_s=0.3)  # type: ignore[arg-type]
        shutdown.install()
        sent = time.perf_counter()
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.05)
        phase = lifecycle.phase
        while not handed:
            await asyncio.sleep(0.01)
        return phase, handed[0] - sent

    try:
        phase, waited = asyncio.run(scenario())
    finally:
        signal.signal(signal.SIGTERM, saved)
    assert phase is Phase.DRAINING and not lifecycle.ready
    assert waited >= 0.3


def test_the_sigterm_handler_only_hands_the_signal_to_the_loop() -> None:
    """Python runs a signal handler between any two bytecodes of the loop's thread, in the middle of the loop's own
    timer bookkeeping too (where a ``call_later`` made by the handler can be dropped): the handler changes nothing
    itself, the loop starts the drain on its next turn."""
    lifecycle = Lifecycle(MODEL_NAME)
    lifecycle.enter(Phase.OK)
    saved = signal.getsignal(signal.SIGTERM)

    async def scenario() -> tuple[Phase, Phase]:
        shutdown = GracefulShutdown(app=None, lifecycle=lifecycle, delay_s=60)  # type: ignore[arg-type]
        shutdown.install()
        shutdown._on_sigterm(signal.SIGTERM, None)  # as Python calls it, from inside the loop's thread
        during = lifecycle.phase
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return during, lifecycle.phase

    try:
        during, after = asyncio.run(scenario())
    finally:
        signal.signal(signal.SIGTERM, saved)
    assert (during, after) == (Phase.OK, Phase.DRAINING)


def test_drain_timeout_answers_unanswered_requests_503_and_lets_started_ones_finish() -> None:
    """At the drain's end a request with no response yet is cancelled and answered 503 + Retry-After; one whose
    response has started is left to finish (uvicorn would cancel both into a 500)."""
    started_response = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/streaming":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            started_response.set()
            await asyncio.sleep(0.2)
            await send({"type": "http.response.body", "body": b"done"})
        else:
            await asyncio.sleep(3600)

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
        shutdown = GracefulShutdown(app, Lifecycle(MODEL_NAME), delay_s=0, drain_s=0)
        shutdown.shutting_down = True
        sent: dict[str, list[dict[str, Any]]] = {"/slow": [], "/streaming": []}

        async def call(path: str) -> None:
            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message: dict[str, Any]) -> None:
                sent[path].append(message)

            await shutdown({"type": "http", "path": path, "method": "POST", "headers": []}, receive, send)

        tasks = [asyncio.create_task(call("/slow")), asyncio.create_task(call("/streaming"))]
        await started_response.wait()
        cut = shutdown.cut_unanswered()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return sent["/slow"], sent["/streaming"], cut

    slow, streaming, cut = asyncio.run(scenario())
    assert cut == 1
    assert slow[0]["status"] == 503 and (b"retry-after", b"1") in slow[0]["headers"]
    assert (b"connection", b"close") in slow[0]["headers"]  # cut during the drain: the connection is closed too
    assert json.loads(slow[1]["body"])["error"]["type"] == "service_unavailable"
    assert streaming[0]["status"] == 200 and streaming[-1]["body"] == b"done"


def test_non_finite_logits_are_an_engine_error_never_an_answer_nor_cached(tokenizer: Any) -> None:
    engine = FakeEngine(tokenizer)
    service = serving(engine, answer_cache_bytes=1 << 20)
    request = simple_request(state="a ticket")

    async def scenario() -> tuple[Any, dict[str, Any]]:
        engine.nan = True
        refused = await asyncio.gather(service.answer(request), return_exceptions=True)
        engine.nan = False
        return refused[0], await service.answer(request)

    refused, answered = asyncio.run(scenario())
    assert isinstance(refused, EngineFailed) and "non-finite option logits" in refused.message
    error = from_service_error(refused)
    assert error.status == 500 and error.body()["error"]["type"] == "engine_error"
    assert engine.calls == 2 and answered["answers"]  # the failure was not kept: the same request was scored again
