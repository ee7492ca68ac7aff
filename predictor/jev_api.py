"""The TypeSafe System One / Jev API, added to KServe's FastAPI app.

``POST /v1/systemone`` answers at the root (beside KServe's routes). The whole Jev API, with its own
``GET /v1/models`` list, is also mounted under ``/jev`` so that ``TypeSafeClient(base_url=".../jev")``
works unchanged while KServe's ``GET /v1/models`` keeps its KServe shape.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from predictor.http_body import decode_json_body
from predictor.service import SystemOneService

JEV_PREFIX = "/jev"


def system_one_handler(service: SystemOneService) -> Callable[[Request], Awaitable[JSONResponse]]:
    """The ``POST /v1/systemone`` handler."""

    async def system_one(request: Request) -> JSONResponse:
        body = decode_json_body(await request.body(), request.headers.get("content-type", ""))
        return JSONResponse(await service.answer(body))

    return system_one


def jev_router(service: SystemOneService) -> APIRouter:
    """Routes of the Jev API: ``POST /v1/systemone`` and ``GET /v1/models`` (TypeSafe's shape)."""
    router = APIRouter()

    async def list_models() -> dict[str, Any]:
        return {"models": [service.card.to_json()]}

    router.add_api_route("/v1/systemone", system_one_handler(service), methods=["POST"], response_model=None)
    router.add_api_route("/v1/models", list_models, methods=["GET"])
    return router


def add_routes(app: FastAPI, service: SystemOneService) -> None:
    """Add the Jev API under ``/jev`` and ``POST /v1/systemone`` at the root too."""
    app.include_router(jev_router(service), prefix=JEV_PREFIX, tags=["Jev"])
    app.add_api_route(
        "/v1/systemone", system_one_handler(service), methods=["POST"], response_model=None, tags=["Jev"]
    )
