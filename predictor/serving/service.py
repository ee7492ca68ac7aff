"""System One answering, shared by every route: admit, prepare (read, validate, encode:
:mod:`predictor.serving.prepare`, in a thread or in encode worker processes), score, answer.

Failures are domain errors (:mod:`predictor.core.errors`); the HTTP layer maps them to statuses.
A body is read and validated before it is admitted: a bad one gets its error naming the field however busy the
server is, and only valid work is shed. Admission is bounded: ``max_queued`` records at once, and no more prompt
tokens ahead of a request than the measured service rate (:class:`~predictor.serving.admission.ServiceRate`, tokens
per busy second) answers within ``max_wait_s``; beyond either, :class:`Unavailable` ``overloaded`` with Retry-After;
identical prompts are scored once, and a body identical to one answered before is answered without being
read again (:class:`~predictor.serving.answer_cache.AnswerCache`). With encode workers, a small raw body that comes
while no other request is being prepared or answered is prepared in this process
(:meth:`SystemOneService.prepares_in_process`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch

from clef_head.answers import build_response
from clef_head.encoder import EncodedRequest
from clef_head.request import DEFAULT_LIMITS, RequestLimits, SystemOneRequest
from predictor.core import metrics
from predictor.core.errors import EngineFailed, ServiceError, Unavailable
from predictor.engines.base import Engine, EngineDead
from predictor.serving import prepare
from predictor.serving.admission import ServiceRate, retry_after_s
from predictor.serving.answer_cache import AnswerCache, body_key, cache_key
from predictor.serving.body_limits import DEFAULT_MAX_QUEUE_WAIT_S
from predictor.serving.encode_pool import DEFAULT_INLINE_ENCODE_MAX_BYTES, InProcessPreparer, Preparer
from predictor.serving.lifecycle import Lifecycle
from predictor.serving.prepare import MediaElsewhere, Prepared, PrepareSettings, VisionSettings
from predictor.serving.request_policy import DEFAULT_POLICY, RequestPolicy
from predictor.serving.request_record import record_tokens

log = logging.getLogger(__name__)

QUEUE_FACTOR = 4
"""Default admission bound: this many times the records the engine runs at once."""
OVERLOADED_RETRY_AFTER_S = 1
ENGINE_DEAD_RETRY_AFTER_S = 5
T = TypeVar("T")


@dataclass(frozen=True)
class ModelCard:
    """What ``GET /v1/models`` says about the served model."""

    name: str
    description: str
    release_date: str

    def to_json(self) -> dict[str, str]:
        """The TypeSafe model-list entry."""
        return {"name": self.name, "description": self.description, "release_date": self.release_date}


def count_record(tokens: int) -> None:
    """Count one answered record of ``tokens`` prompt tokens (metrics, and the request's own tally)."""
    metrics.RECORDS.inc()
    metrics.INPUT_TOKENS.inc(tokens)
    metrics.PROMPT_TOKENS.observe(tokens)
    record_tokens(tokens)


class SystemOneService:
    """Answers System One bodies with one engine while the model's lifecycle says it is serving."""

    def __init__(
        self,
        engine: Engine,
        card: ModelCard,
        lifecycle: Lifecycle,
        limits: RequestLimits = DEFAULT_LIMITS,
        max_queued: int | None = None,
        answer_cache_bytes: int = 0,
        on_engine_failure: Callable[[], None] = lambda: None,
        preparer: Preparer | None = None,
        max_wait_s: float = DEFAULT_MAX_QUEUE_WAIT_S,
        policy: RequestPolicy = DEFAULT_POLICY,
        vision: VisionSettings | None = None,
        inline_encode_max_bytes: int = DEFAULT_INLINE_ENCODE_MAX_BYTES,
    ) -> None:
        self.engine = engine
        pixel_dtype = engine.pixel_dtype
        self.vision = (
            vision
            if vision is None or pixel_dtype is None
            else replace(vision, pixel_dtype=str(pixel_dtype).removeprefix("torch."))
        )
        self.card = card
        self.lifecycle = lifecycle
        self.limits = limits
        self.policy = policy
        self.max_queued = max_queued if max_queued is not None else QUEUE_FACTOR * engine.capacity
        if self.max_queued < 1:
            raise ValueError("max_queued must be at least 1")
        if max_wait_s <= 0:
            raise ValueError("max_wait_s must be positive")
        if inline_encode_max_bytes < 0:
            raise ValueError("inline_encode_max_bytes must be 0 or more")
        self.max_wait_s = max_wait_s
        self.inline_encode_max_bytes = inline_encode_max_bytes
        self.preparing = 0
        self.rate = ServiceRate()
        self.preparer: Preparer = preparer if preparer is not None else InProcessPreparer(engine.tokenizer)
        self.cache = AnswerCache(answer_cache_bytes)
        self.queued = 0
        self.queued_tokens = 0
        self._on_engine_failure = on_engine_failure
        metrics.QUEUE_DEPTH.set_function(lambda: self.queued)

    @contextmanager
    def admitted(self, records: int) -> Iterator[None]:
        """Hold ``records`` places in the admission queue (validated records: a body is prepared first), or raise
        :class:`Unavailable` when the queue would hold more than ``max_queued`` records.

        A request larger than the whole queue (at most ``--max-batch-items`` records) is admitted when the
        queue is empty.
        """
        self.check_serving()
        if self.queued and self.queued + records > self.max_queued:
            metrics.REJECTED.labels(reason="overloaded").inc()
            raise Unavailable(
                f"the server is at capacity ({self.queued} records queued, --max-queued-requests "
                f"{self.max_queued}); retry shortly",
                "overloaded",
                OVERLOADED_RETRY_AFTER_S,
            )
        self.queued += records
        try:
            yield
        finally:
            self.queued -= records

    def shed_if_slow(self) -> None:
        """Raise :class:`Unavailable` when the prompt tokens held (:meth:`holding`) would take more than
        ``max_wait_s`` to answer at the measured rate (none held: never).

        Tokens, not records: a batch engine runs admitted records together, but a batch takes longer the more
        tokens it holds, so the tokens ahead of a request at the measured tokens per busy second say how long it
        waits, whatever the mix of prompt lengths.
        """
        expected_wait = self.rate.expected_wait_s(self.queued_tokens) if self.queued_tokens else None
        if expected_wait is not None and expected_wait > self.max_wait_s:
            metrics.REJECTED.labels(reason="overloaded").inc()
            raise Unavailable(
                f"the server is at capacity: the {self.queued_tokens} prompt tokens queued would take about "
                f"{expected_wait:.1f} s to answer, more than --max-queue-wait-s {self.max_wait_s:g}; retry shortly",
                "overloaded",
                retry_after_s(expected_wait, self.max_wait_s),
            )

    @contextmanager
    def holding(self, prepared: Sequence[Prepared | ServiceError]) -> Iterator[None]:
        """Hold the prompt tokens of ``prepared`` (encoded, admitted records) ahead of later requests until they
        are answered, or raise :class:`Unavailable` (:meth:`shed_if_slow`: the tokens held since this request
        arrived, by requests encoded beside it, count too).

        The rate's busy time is the time records are held here, from encoded to answered: a body refused while it
        is read, validated or encoded never held the engine, and counting its time would lower the rate (a
        fuzzing client's bodies left it too low to admit a load).
        """
        self.shed_if_slow()
        tokens = sum(len(item[1].input_ids) for item in prepared if not isinstance(item, ServiceError))
        records = len(prepared)
        self.queued_tokens += tokens
        self.rate.enter(records)
        try:
            yield
        finally:
            self.queued_tokens -= tokens
            self.rate.leave(records)

    def check_serving(self) -> None:
        """Raise :class:`Unavailable` unless the model serves now (warming up, draining, engine dead)."""
        try:
            self.lifecycle.check_serving()
        except Unavailable as exc:
            metrics.REJECTED.labels(reason=exc.reason).inc()
            raise

    @property
    def settings(self) -> PrepareSettings:
        """What validation and encoding depend on (read when a body is prepared: the policy may change)."""
        return PrepareSettings(self.card.name, self.limits, self.policy, self.engine.max_length, self.vision)

    @property
    def settings_in_process(self) -> PrepareSettings:
        """:attr:`settings` for a body prepared in this process although encode workers run: its images and videos,
        if any, are left to a worker (:class:`MediaElsewhere`)."""
        settings = self.settings
        if settings.vision is None:
            return settings
        return replace(settings, vision=replace(settings.vision, media_here=False))

    def prepares_in_process(self, size: int | None) -> bool:
        """Whether a raw body of ``size`` bytes (``None``: parsed bodies) is prepared in this process although
        encode workers run: a body of at most ``inline_encode_max_bytes`` while no other body is being prepared and
        no record is being answered. Such a body's hop to a worker costs it more than its encoding (BENCHMARKS.md,
        R39), and nothing else waits for this process's interpreter meanwhile. Large bodies stay in the workers (a
        worker's job deadline ends a hung encode; a thread cannot be ended), and so do images and videos: on a
        vision server a body found to hold any is prepared again by a worker (:attr:`settings_in_process`), as a
        small body can still hold a large image (a single-colour 4096 × 4096 PNG takes 57 KB: 16 megapixels to
        decode and process)."""
        return (
            size is not None
            and self.inline_encode_max_bytes > 0
            and size <= self.inline_encode_max_bytes
            and not self.preparing
            and not self.queued
        )

    async def _prepare(self, job: Callable[..., T], *args: Any, size: int | None = None) -> T:
        """Run a :mod:`predictor.serving.prepare` job where the preparer runs it (``size``: the raw body's bytes,
        for :meth:`prepares_in_process`); the encode stage's time is the round trip (reading, validating and
        encoding, plus the hop to a worker process), per record."""
        inline = bool(self.preparer.processes) and self.prepares_in_process(size)
        started = time.perf_counter()
        self.preparing += 1
        try:
            result = await self._run(job, inline, *args)
        finally:
            self.preparing -= 1
        records = len(result) if isinstance(result, list) else 1
        per_record = (time.perf_counter() - started) / max(records, 1)
        for _ in range(records):
            metrics.STAGE_SECONDS.labels(stage="encode").observe(per_record)
        return result

    async def _run(self, job: Callable[..., T], inline: bool, *args: Any) -> T:
        """``job`` in this process (``inline``) or where the preparer runs jobs; a body prepared here that holds
        images or videos (:class:`MediaElsewhere`) is prepared again where the preparer runs jobs. Counted by where
        it was prepared."""
        where = "worker" if self.preparer.processes else "serving"
        try:
            if inline:
                try:
                    where = "serving"
                    return await self.preparer.run(job, self.settings_in_process, *args, inline=True)
                except MediaElsewhere:
                    where = "worker"
            return await self.preparer.run(job, self.settings, *args)
        finally:
            metrics.ENCODE_BODIES.labels(where=where).inc()

    async def _engine_score(self, encoded: EncodedRequest) -> torch.Tensor:
        started = time.perf_counter()
        try:
            logits = await self.engine.score(encoded)
        except EngineDead as exc:
            self._on_engine_failure()
            raise Unavailable(f"the engine is not running: {exc}", "engine_dead", ENGINE_DEAD_RETRY_AFTER_S) from exc
        except Exception as exc:
            self._on_engine_failure()
            try:
                await self.engine.check_health()
            except EngineDead as dead:
                raise Unavailable(
                    f"the engine is not running: {dead}", "engine_dead", ENGINE_DEAD_RETRY_AFTER_S
                ) from exc
            log.exception("engine failure")
            raise EngineFailed(f"the engine failed: {exc!r}") from exc
        if not bool(torch.isfinite(logits).all()):  # never answered, never cached: an engine fault, not an answer
            log.error("the engine returned non-finite option logits for a %d-token prompt", len(encoded.input_ids))
            raise EngineFailed("the engine returned non-finite option logits (NaN or infinity) for this request")
        metrics.STAGE_SECONDS.labels(stage="engine").observe(time.perf_counter() - started)
        return logits

    async def score(self, request: SystemOneRequest, encoded: EncodedRequest) -> dict[str, Any]:
        """The response body of one validated, encoded request (identical prompts scored once)."""
        logits = await self.cache.score(cache_key(encoded), lambda: self._engine_score(encoded))
        answered = time.perf_counter()
        tokens = len(encoded.input_ids)
        self.rate.answered(tokens)
        count_record(tokens)
        response = build_response(request, encoded.layout, logits, tokens)
        response["model"] = self.card.name  # the model that answered, whichever alias was asked for
        response["usage"]["state_truncated"] = encoded.state_truncated
        metrics.STAGE_SECONDS.labels(stage="answer").observe(time.perf_counter() - answered)
        return response

    async def answer(self, body: Any) -> dict[str, Any]:
        """One System One response body for a parsed body."""
        return (await self.answer_many([body], prefixes=[""]))[0]

    async def answer_json(self, raw: bytes, content_type: str) -> dict[str, Any]:
        """``POST /v1/systemone``: the response to a raw body (read, validated and encoded by the preparer, then
        admitted; a body answered before is admitted without being read again)."""
        self.check_serving()
        key = body_key(self.settings, content_type, raw)
        kept = self.cache.response(key)
        if kept is not None:
            with self.admitted(1):
                count_record(kept["usage"]["input_tokens"])
                return kept
        request, encoded = await self._prepare(prepare.prepare_json, raw, content_type, size=len(raw))
        with self.admitted(1), self.holding([(request, encoded)]):
            response = await self.score(request, encoded)
        self.cache.keep_response(key, response)
        return response

    async def answer_many(self, bodies: Sequence[Any], prefixes: Sequence[str]) -> list[dict[str, Any]]:
        """Responses for several parsed bodies; all are validated and encoded, then admitted, before any is scored."""
        self.check_serving()
        prepared = await self._prepare(prepare.prepare_all, list(bodies), list(prefixes))
        with self.admitted(len(bodies)), self.holding(prepared):
            return list(await asyncio.gather(*(self.score(r, e) for r, e in prepared)))

    async def answer_batch_json(
        self, raw: bytes, content_type: str, max_items: int
    ) -> list[dict[str, Any] | ServiceError]:
        """``POST /v1/systemone/batch``: one response or one domain error per item of a raw JSON array.

        The array is prepared in one preparer call (read once, no item copied between processes); then its valid
        items are admitted, one place each, while scored. An array with no valid item is answered with its items'
        errors, however busy the server is.
        """
        self.check_serving()
        items = await self._prepare(prepare.prepare_batch_json, raw, content_type, max_items, size=len(raw))
        valid = sum(not isinstance(item, ServiceError) for item in items)
        if not valid:
            return [item for item in items if isinstance(item, ServiceError)]
        with self.admitted(valid), self.holding(items):

            async def answer(item: Prepared | ServiceError) -> dict[str, Any] | ServiceError:
                if isinstance(item, ServiceError):
                    return item
                try:
                    return await self.score(*item)
                except ServiceError as error:
                    return error

            return list(await asyncio.gather(*(answer(item) for item in items)))
