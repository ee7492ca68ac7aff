"""Health routes: ``GET /health/live`` (liveness) and ``GET /health`` (status as JSON).

Readiness stays on KServe's own routes (``GET /v1/models/<name>``, ``/v2/models/<name>/ready``),
which ask the model's :class:`~predictor.lifecycle.Lifecycle` too.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from predictor.lifecycle import Lifecycle, Phase

LIVENESS_PATH = "/health/live"
"""Equal to ``clef_contract.predictor.LIVENESS_PATH`` (the operator's probes; a test ties the two): the
predictor image does not install the operator's distribution."""


def health_router(lifecycle: Lifecycle) -> APIRouter:
    """``GET /health/live``: 200 while the process can serve, 503 once the engine is dead.
    ``GET /health``: ``{"status": "ok"|"warming_up"|"draining"|"engine_dead"|...}``, 200 only for ``ok``.
    """
    router = APIRouter()

    async def live() -> JSONResponse:
        return JSONResponse({"status": "alive" if lifecycle.live else Phase.ENGINE_DEAD.value}, 200 if lifecycle.live else 503)

    async def health() -> JSONResponse:
        body: dict[str, str] = {"status": lifecycle.phase.value}
        if lifecycle.failure:
            body["cause"] = lifecycle.failure
        return JSONResponse(body, 200 if lifecycle.ready else 503)

    router.add_api_route(LIVENESS_PATH, live, methods=["GET"])
    router.add_api_route("/health", health, methods=["GET"])
    return router
