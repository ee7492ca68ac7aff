"""System One answering, shared by every route: validate (clef_head), check the model, encode, score."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Sequence

from clef_head.answers import build_response
from clef_head.encoder import EncodedRequest, SchemaTooLong, StateTooLong, encode_request
from clef_head.request import DEFAULT_LIMITS, InvalidRequest, RequestLimits, SystemOneRequest, parse_request
from predictor import metrics
from predictor.engines.base import Engine, EngineDead
from predictor.errors import ENGINE_ERROR, NOT_FOUND, TOO_LARGE, UNAVAILABLE, ApiError, invalid_field, parse_param
from predictor.observe import record_tokens
from predictor.request_policy import RequestPolicy
from predictor.route_guard import quoted

log = logging.getLogger(__name__)


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
    """Answers System One bodies with one engine; ``ready`` is set once warm-up has finished."""

    def __init__(self, engine: Engine, card: ModelCard, limits: RequestLimits = DEFAULT_LIMITS) -> None:
        self.engine = engine
        self.card = card
        self.limits = limits
        self.policy = RequestPolicy()
        self.ready = False

    def validate(self, body: Any, prefix: str = "") -> SystemOneRequest:
        """A validated request, or a 422 (404 for another model's name) naming the field under ``prefix``."""
        where = parse_param(prefix)
        try:
            request = parse_request(body, self.limits)
        except InvalidRequest as exc:
            raise invalid_field(exc.message, (*where, *exc.loc), exc.kind) from None
        if not self.policy.serves(self.card.name, request.model):
            served = ", ".join(map(repr, (self.card.name, *self.policy.aliases)))
            raise ApiError(
                HTTPStatus.NOT_FOUND,
                NOT_FOUND,
                f"model {quoted(request.model)} is not served here; this server serves {served}",
                (*where, "model"),
            )
        return request

    def encode(self, request: SystemOneRequest, prefix: str = "") -> EncodedRequest:
        """The prompt, or a 422 with the token counts when the schema alone exceeds the maximum length
        (a 413 when the state does not fit and the policy refuses over-long states)."""
        started = time.perf_counter()
        where = parse_param(prefix)
        try:
            encoded = encode_request(
                self.engine.tokenizer, request, max_length=self.engine.max_length, overflow=self.policy.state_overflow
            )
        except SchemaTooLong as exc:
            raise invalid_field(
                f"the questions need {exc.required} tokens before any state, more than the maximum prompt "
                f"length of {exc.maximum} tokens (--max-model-len); send fewer or shorter questions",
                (*where, "questions"),
            ) from None
        except StateTooLong as exc:
            raise ApiError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                TOO_LARGE,
                f"{exc} (--max-model-len {exc.maximum}); send a shorter state or fewer questions",
                (*where, "state"),
            ) from None
        metrics.STAGE_SECONDS.labels(stage="encode").observe(time.perf_counter() - started)
        return encoded

    def check_ready(self) -> None:
        """503 until warm-up has finished."""
        if not self.ready:
            raise ApiError(
                HTTPStatus.SERVICE_UNAVAILABLE, UNAVAILABLE, f"model {self.card.name!r} is warming up; retry shortly"
            )

    async def score(self, request: SystemOneRequest, encoded: EncodedRequest) -> dict[str, Any]:
        """The response body of one validated, encoded request."""
        started = time.perf_counter()
        try:
            logits = await self.engine.score(encoded)
        except EngineDead as exc:
            raise ApiError(HTTPStatus.SERVICE_UNAVAILABLE, UNAVAILABLE, f"the engine is not running: {exc}") from exc
        except Exception as exc:
            log.exception("engine failure")
            raise ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, ENGINE_ERROR, f"the engine failed: {exc!r}") from exc
        scored = time.perf_counter()
        metrics.STAGE_SECONDS.labels(stage="engine").observe(scored - started)
        tokens = len(encoded.input_ids)
        metrics.RECORDS.inc()
        metrics.INPUT_TOKENS.inc(tokens)
        metrics.PROMPT_TOKENS.observe(tokens)
        record_tokens(tokens)
        response = build_response(request, encoded.layout, logits, tokens)
        response["usage"]["state_truncated"] = encoded.state_truncated
        metrics.STAGE_SECONDS.labels(stage="answer").observe(time.perf_counter() - scored)
        return response

    async def answer(self, body: Any) -> dict[str, Any]:
        """One System One response body."""
        return (await self.answer_many([body], prefixes=[""]))[0]

    async def answer_many(self, bodies: Sequence[Any], prefixes: Sequence[str]) -> list[dict[str, Any]]:
        """Responses for several bodies; all are validated and encoded before any is scored."""
        self.check_ready()
        prepared = await asyncio.to_thread(
            lambda: [self.prepare(body, prefix) for body, prefix in zip(bodies, prefixes)]
        )
        return list(await asyncio.gather(*(self.score(r, e) for r, e in prepared)))

    def prepare(self, body: Any, prefix: str = "") -> tuple[SystemOneRequest, EncodedRequest]:
        """Validate and encode one body (CPU work: callers run it off the event loop)."""
        request = self.validate(body, prefix)
        return request, self.encode(request, prefix)

    async def answer_each(self, bodies: Sequence[Any], prefixes: Sequence[str]) -> list[dict[str, Any]]:
        """One response or one error body per item; the valid items are scored together."""
        self.check_ready()

        def prepare_each() -> list[tuple[SystemOneRequest, EncodedRequest] | ApiError]:
            results: list[tuple[SystemOneRequest, EncodedRequest] | ApiError] = []
            for body, prefix in zip(bodies, prefixes):
                try:
                    results.append(self.prepare(body, prefix))
                except ApiError as error:
                    results.append(error)
            return results

        async def answer(item: tuple[SystemOneRequest, EncodedRequest] | ApiError) -> dict[str, Any]:
            if isinstance(item, ApiError):
                return {"status": item.status, **item.body()}
            try:
                return await self.score(*item)
            except ApiError as error:
                return {"status": error.status, **error.body()}

        return list(await asyncio.gather(*(answer(item) for item in await asyncio.to_thread(prepare_each))))
