"""The TypeSafe System One / Jev API and the health route, added to KServe's FastAPI app.

``POST /v1/systemone`` answers at the root (beside KServe's routes). The whole Jev API, with its own
``GET /v1/models`` list, is also mounted under ``/jev`` so that ``TypeSafeClient(base_url=".../jev")``
works unchanged while KServe's ``GET /v1/models`` keeps its KServe shape.

``POST /v1/systemone/batch`` takes a JSON array of System One bodies and answers a JSON array of the same
length: each item is a response, or ``{"status", "error", "detail"}`` for an item that failed; the valid
items are submitted to the engine together. Bodies are read, validated and encoded off the event loop
(in a thread, or in encode worker processes: ``--encode-processes``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from predictor.core.errors import ServiceError
from predictor.http.errors import from_service_error
from predictor.serving.body_limits import DEFAULT_MAX_BATCH_ITEMS
from predictor.serving.service import SystemOneService

JEV_PREFIX = "/jev"


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


def system_one_routes(router: APIRouter | FastAPI, service: SystemOneService, max_batch_items: int) -> None:
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


def jev_router(service: SystemOneService, max_batch_items: int = DEFAULT_MAX_BATCH_ITEMS) -> APIRouter:
    """Routes of the Jev API: ``POST /v1/systemone(/batch)`` and ``GET /v1/models`` (TypeSafe's shape: the
    served model, then each alias under its own name)."""
    router = APIRouter()

    async def list_models() -> dict[str, Any]:
        card = service.card.to_json()
        return {"models": [card, *({**card, "name": alias} for alias in service.policy.aliases)]}

    system_one_routes(router, service, max_batch_items)
    router.add_api_route("/v1/models", list_models, methods=["GET"])
    return router


def add_routes(app: FastAPI, service: SystemOneService, max_batch_items: int = DEFAULT_MAX_BATCH_ITEMS) -> None:
    """Add the Jev API under ``/jev`` and ``POST /v1/systemone(/batch)`` at the root too."""
    app.include_router(jev_router(service, max_batch_items), prefix=JEV_PREFIX, tags=["Jev"])
    system_one_routes(app, service, max_batch_items)
