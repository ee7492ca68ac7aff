"""System One answering, shared by every route: admit, validate (clef_head), encode, score, answer.

Failures are domain errors (:mod:`predictor.service_errors`); the HTTP layer maps them to statuses.
Admission is bounded (``max_queued`` records at once, beyond that :class:`Unavailable` ``overloaded``);
identical prompts are scored once (:class:`~predictor.answer_cache.AnswerCache`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from clef_head.answers import build_response
from clef_head.encoder import EncodedRequest, SchemaTooLong, StateTooLong, encode_request
from clef_head.request import DEFAULT_LIMITS, InvalidRequest, RequestLimits, SystemOneRequest, parse_request
from predictor import metrics
from predictor.answer_cache import AnswerCache, cache_key
from predictor.engines.base import Engine, EngineDead
from predictor.errors import parse_param
from predictor.lifecycle import Lifecycle
from predictor.observe import record_tokens
from predictor.request_policy import RequestPolicy
from predictor.route_guard import quoted
from predictor.service_errors import BadInput, EngineFailed, ModelNotServed, ServiceError, TooLarge, Unavailable

log = logging.getLogger(__name__)

QUEUE_FACTOR = 4
"""Default admission bound: this many times the records the engine runs at once."""
OVERLOADED_RETRY_AFTER_S = 1
ENGINE_DEAD_RETRY_AFTER_S = 5


@dataclass(frozen=True)
class ModelCard:
    """What ``GET /v1/models`` says about the served model."""

    name: str
    description: str
    release_date: str

    def to_json(self) -> dict[str, str]:
        """The TypeSafe model-list entry."""
        return {"name": self.name, "description": self.description, "release_date": self.release_date}


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
    ) -> None:
        self.engine = engine
        self.card = card
        self.lifecycle = lifecycle
        self.limits = limits
        self.policy = RequestPolicy()
        self.max_queued = max_queued if max_queued is not None else QUEUE_FACTOR * engine.capacity
        if self.max_queued < 1:
            raise ValueError("max_queued must be at least 1")
        self.cache = AnswerCache(answer_cache_bytes)
        self.queued = 0
        self._on_engine_failure = on_engine_failure
        metrics.QUEUE_DEPTH.set_function(lambda: self.queued)

    @contextmanager
    def admitted(self, records: int) -> Iterator[None]:
        """Hold ``records`` places in the admission queue, or raise :class:`Unavailable`.

        A request larger than the whole queue is admitted when the queue is empty.
        """
        try:
            self.lifecycle.check_serving()
        except Unavailable as exc:
            metrics.REJECTED.labels(reason=exc.reason).inc()
            raise
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

    def validate(self, body: Any, prefix: str = "") -> SystemOneRequest:
        """A validated request; :class:`BadInput` (or :class:`ModelNotServed`) names the field under ``prefix``."""
        where = parse_param(prefix)
        try:
            request = parse_request(body, self.limits)
        except InvalidRequest as exc:
            raise BadInput(exc.message, (*where, *exc.loc), exc.kind) from None
        if not self.policy.serves(self.card.name, request.model):
            served = ", ".join(map(repr, (self.card.name, *self.policy.aliases)))
            raise ModelNotServed(
                f"model {quoted(request.model)} is not served here; this server serves {served}", (*where, "model")
            )
        return request

    def encode(self, request: SystemOneRequest, prefix: str = "") -> EncodedRequest:
        """The prompt; :class:`BadInput` with the token counts when the schema alone exceeds the maximum
        (:class:`TooLarge` when the state does not fit and the policy refuses over-long states)."""
        started = time.perf_counter()
        where = parse_param(prefix)
        try:
            encoded = encode_request(
                self.engine.tokenizer, request, max_length=self.engine.max_length, overflow=self.policy.state_overflow
            )
        except SchemaTooLong as exc:
            raise BadInput(
                f"the questions need {exc.required} tokens before any state, more than the maximum prompt "
                f"length of {exc.maximum} tokens (--max-model-len); send fewer or shorter questions",
                (*where, "questions"),
            ) from None
        except StateTooLong as exc:
            raise TooLarge(
                f"{exc} (--max-model-len {exc.maximum}); send a shorter state or fewer questions", (*where, "state")
            ) from None
        metrics.STAGE_SECONDS.labels(stage="encode").observe(time.perf_counter() - started)
        return encoded

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
        metrics.STAGE_SECONDS.labels(stage="engine").observe(time.perf_counter() - started)
        return logits

    async def score(self, request: SystemOneRequest, encoded: EncodedRequest) -> dict[str, Any]:
        """The response body of one validated, encoded request (identical prompts scored once)."""
        logits = await self.cache.score(cache_key(encoded), lambda: self._engine_score(encoded))
        answered = time.perf_counter()
        tokens = len(encoded.input_ids)
        metrics.RECORDS.inc()
        metrics.INPUT_TOKENS.inc(tokens)
        metrics.PROMPT_TOKENS.observe(tokens)
        record_tokens(tokens)
        response = build_response(request, encoded.layout, logits, tokens)  # echoes the name asked for (an alias)
        response["usage"]["state_truncated"] = encoded.state_truncated
        metrics.STAGE_SECONDS.labels(stage="answer").observe(time.perf_counter() - answered)
        return response

    async def answer(self, body: Any) -> dict[str, Any]:
        """One System One response body."""
        return (await self.answer_many([body], prefixes=[""]))[0]

    async def answer_many(self, bodies: Sequence[Any], prefixes: Sequence[str]) -> list[dict[str, Any]]:
        """Responses for several bodies; all are validated and encoded before any is scored."""
        with self.admitted(len(bodies)):
            prepared = await asyncio.to_thread(
                lambda: [self.prepare(body, prefix) for body, prefix in zip(bodies, prefixes)]
            )
            return list(await asyncio.gather(*(self.score(r, e) for r, e in prepared)))

    def prepare(self, body: Any, prefix: str = "") -> tuple[SystemOneRequest, EncodedRequest]:
        """Validate and encode one body (CPU work: callers run it off the event loop)."""
        request = self.validate(body, prefix)
        return request, self.encode(request, prefix)

    async def answer_each(self, bodies: Sequence[Any], prefixes: Sequence[str]) -> list[dict[str, Any] | ServiceError]:
        """One response or one domain error per item; the valid items are scored together."""
        with self.admitted(len(bodies)):

            def prepare_each() -> list[tuple[SystemOneRequest, EncodedRequest] | ServiceError]:
                results: list[tuple[SystemOneRequest, EncodedRequest] | ServiceError] = []
                for body, prefix in zip(bodies, prefixes):
                    try:
                        results.append(self.prepare(body, prefix))
                    except ServiceError as error:
                        results.append(error)
                return results

            async def answer(item: tuple[SystemOneRequest, EncodedRequest] | ServiceError) -> dict[str, Any] | ServiceError:
                if isinstance(item, ServiceError):
                    return item
                try:
                    return await self.score(*item)
                except ServiceError as error:
                    return error

            return list(await asyncio.gather(*(answer(item) for item in await asyncio.to_thread(prepare_each))))
