"""Health routes: ``GET /health/live`` (liveness), ``GET /health`` (status as JSON) and KServe's server
readiness ``GET /v2/health/ready``, answered from the lifecycle (KServe's own answers 200 while warm-up runs).

Model readiness stays on KServe's own routes (``GET /v1/models/<name>``, ``/v2/models/<name>/ready``),
which ask the model's :class:`~predictor.lifecycle.Lifecycle` too.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse

from predictor.lifecycle import Lifecycle, Phase

SERVER_READY_PATH = "/v2/health/ready"
LIVENESS_PATH = "/health/live"
"""Equal to ``clef_contract.predictor.LIVENESS_PATH`` (the operator's probes; a test ties the two): the
predictor image does not install the operator's distribution."""


def health_router(lifecycle: Lifecycle) -> APIRouter:
    """``GET /health/live``: 200 while the process can serve, 503 once the engine is dead.
    ``GET /health``: ``{"status": "ok"|"warming_up"|"draining"|"engine_dead"|...}``, 200 only for ``ok``.
    ``GET /v2/health/ready``: KServe's body (``{"ready": ...}``), 200 only once the model is ready; the
    router's routes must precede KServe's (see :func:`install_health_routes`).
    """
    router = APIRouter()

    async def live() -> JSONResponse:
        return JSONResponse({"status": "alive" if lifecycle.live else Phase.ENGINE_DEAD.value}, 200 if lifecycle.live else 503)

    async def health() -> JSONResponse:
        body: dict[str, str] = {"status": lifecycle.phase.value}
        if lifecycle.failure:
            body["cause"] = lifecycle.failure
        return JSONResponse(body, 200 if lifecycle.ready else 503)

    async def server_ready() -> JSONResponse:
        return JSONResponse({"ready": lifecycle.ready}, 200 if lifecycle.ready else 503)

    router.add_api_route(LIVENESS_PATH, live, methods=["GET"])
    router.add_api_route(SERVER_READY_PATH, server_ready, methods=["GET"])
    router.add_api_route("/health", health, methods=["GET"])
    return router


def install_health_routes(app: FastAPI, lifecycle: Lifecycle) -> None:
    """Put the health routes first in ``app``: the first route that matches answers, and KServe's app already
    has its own ``/v2/health/ready``."""
    app.router.routes[:0] = health_router(lifecycle).routes
