"""The TypeSafe System One / Jev API, added to KServe's FastAPI app.

``POST /v1/systemone`` and ``GET /v1/models`` answer at the root (in front of KServe's own ``/v1/models``) and,
with the health routes, under ``/jev`` too, so a client works with either base URL
(``TypeSafeClient(base_url=".../jev")``, as the SDK's hosted paths need, or the server's root).

``GET /v1/models`` answers one body that every reader of a model list accepts: the hosted API's
``{"models": [{"name", "description", "release_date"}]}`` (the TypeSafe SDK, ``jev-lite``, ``avrik-sdk``) beside
OpenAI's ``{"object": "list", "data": [{"id", "object", "created", "owned_by"}]}`` (the model card's server),
each listing the served model, then each alias.

``POST /v1/systemone/batch`` takes a JSON array of System One bodies and answers a JSON array of the same
length: each item is a response, or ``{"status", "error", "detail"}`` for an item that failed; the valid
items are submitted to the engine together. Bodies are read, validated and encoded off the event loop
(in a thread, or in encode worker processes: ``--encode-processes``).
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from predictor.core.errors import ServiceError
from predictor.http.errors import from_service_error
from predictor.serving.body_limits import DEFAULT_MAX_BATCH_ITEMS
from predictor.serving.service import ModelCard, SystemOneService

JEV_PREFIX = "/jev"
API_BASES = ("", JEV_PREFIX)
"""The base paths the Jev API answers under: the server's root and ``/jev``."""
MODELS_PATH = "/v1/models"
OWNER = "clef"
"""``owned_by`` of the OpenAI-style entries."""


def release_timestamp(release_date: str) -> int:
    """OpenAI's ``created`` (Unix seconds, UTC midnight) of a ``YYYY-MM-DD`` release date."""
    day = datetime.date.fromisoformat(release_date)
    return int(datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.UTC).timestamp())


def model_list(card: ModelCard, aliases: Sequence[str]) -> dict[str, Any]:
    """``GET /v1/models``: the served model, then each alias, in the hosted shape and in OpenAI's."""
    names = [card.name, *aliases]
    created = release_timestamp(card.release_date)
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": created, "owned_by": OWNER} for name in names],
        "models": [{**card.to_json(), "name": name} for name in names],
    }


def system_one_handler(service: SystemOneService) -> Callable[[Request], Awaitable[JSONResponse]]:
    """The ``POST /v1/systemone`` handler."""

    async def system_one(request: Request) -> JSONResponse:
        return JSONResponse(await service.answer_json(await request.body(), request.headers.get("content-type", "")))

    return system_one


def error_item(error: ServiceError) -> dict[str, Any]:
    """A failed batch item: its status and the error body it would have had alone."""
    failure = from_service_error(error)
    return {"status": int(failure.status), **failure.body()}


def batch_handler(service: SystemOneService, max_items: int) -> Callable[[Request], Awaitable[JSONResponse]]:
    """The ``POST /v1/systemone/batch`` handler: an array of bodies, an array of answers or errors."""

    async def batch(request: Request) -> JSONResponse:
        answers = await service.answer_batch_json(
            await request.body(), request.headers.get("content-type", ""), max_items
        )
        return JSONResponse([item if isinstance(item, dict) else error_item(item) for item in answers])

    return batch


def system_one_routes(router: APIRouter, service: SystemOneService, max_batch_items: int) -> None:
    """``POST /v1/systemone`` and ``POST /v1/systemone/batch`` on ``router``."""
    router.add_api_route(
        "/v1/systemone", system_one_handler(service), methods=["POST"], response_model=None, tags=["Jev"]
    )
    router.add_api_route(
        "/v1/systemone/batch",
        batch_handler(service, max_batch_items),
        methods=["POST"],
        response_model=None,
        tags=["Jev"],
    )


def add_routes(app: FastAPI, service: SystemOneService, max_batch_items: int = DEFAULT_MAX_BATCH_ITEMS) -> None:
    """``POST /v1/systemone(/batch)`` and ``GET /v1/models`` at the root and under ``/jev``; the root's
    ``/v1/models`` comes before KServe's (its routes are added when the server starts)."""

    async def list_models() -> dict[str, Any]:
        return model_list(service.card, service.policy.aliases)

    for base in API_BASES:
        router = APIRouter()
        system_one_routes(router, service, max_batch_items)
        router.add_api_route(MODELS_PATH, list_models, methods=["GET"])
        app.include_router(router, prefix=base, tags=["Jev"])
