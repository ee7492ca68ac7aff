"""System One answering, shared by every route: validate (clef_head), check the model, encode, score."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Sequence

from clef_head.answers import build_response
from clef_head.encoder import EncodedRequest, SchemaTooLong, encode_request
from clef_head.request import DEFAULT_LIMITS, InvalidRequest, RequestLimits, SystemOneRequest, parse_request
from predictor import metrics
from predictor.engines.base import Engine, EngineDead
from predictor.errors import ENGINE_ERROR, NOT_FOUND, UNAVAILABLE, ApiError, bad_request, join_param
from predictor.observe import record_tokens

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
        self.ready = False

    def validate(self, body: Any, prefix: str = "") -> SystemOneRequest:
        """A validated request, or a 400 (404 for another model's name) naming the field under ``prefix``."""
        try:
            request = parse_request(body, self.limits)
        except InvalidRequest as exc:
            raise bad_request(exc.message, join_param(prefix, exc.param)) from None
        if request.model != self.card.name:
            raise ApiError(
                HTTPStatus.NOT_FOUND,
                NOT_FOUND,
                f"model {request.model!r} is not served here; this server serves {self.card.name!r}",
                join_param(prefix, "model"),
            )
        return request

    def encode(self, request: SystemOneRequest, prefix: str = "") -> EncodedRequest:
        """The prompt, or a 400 with the token counts when the schema alone exceeds the maximum length."""
        started = time.perf_counter()
        try:
            encoded = encode_request(self.engine.tokenizer, request, max_length=self.engine.max_length)
        except SchemaTooLong as exc:
            raise bad_request(
                f"the questions need {exc.required} tokens before any state, more than the maximum prompt "
                f"length of {exc.maximum} tokens (--max-model-len); send fewer or shorter questions",
                join_param(prefix, "questions"),
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
        response = build_response(request, encoded.layout, logits, tokens, model_name=self.card.name)
        metrics.STAGE_SECONDS.labels(stage="answer").observe(time.perf_counter() - scored)
        return response

    async def answer(self, body: Any) -> dict[str, Any]:
        """One System One response body."""
        return (await self.answer_many([body], prefixes=[""]))[0]

    async def answer_many(self, bodies: Sequence[Any], prefixes: Sequence[str]) -> list[dict[str, Any]]:
        """Responses for several bodies; all are validated and encoded before any is scored."""
        self.check_ready()
        requests = [self.validate(body, prefix) for body, prefix in zip(bodies, prefixes)]
        encoded = await asyncio.to_thread(
            lambda: [self.encode(request, prefix) for request, prefix in zip(requests, prefixes)]
        )
        return list(await asyncio.gather(*(self.score(r, e) for r, e in zip(requests, encoded))))
