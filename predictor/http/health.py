"""Health routes: ``GET /health/live`` (liveness), ``GET /health`` (status as JSON) and KServe's server
readiness ``GET /v2/health/ready``, answered from the lifecycle (KServe's own answers 200 while warm-up runs),
at the root and under every other API base (``/jev/health``: a client configured with the ``/jev`` base
finds them there).

Model readiness stays on KServe's own routes (``GET /v1/models/<name>``, ``/v2/models/<name>/ready``),
which ask the model's :class:`~predictor.serving.lifecycle.Lifecycle` too. KServe logs each of their 503s with a
traceback at ERROR; :class:`NotReadyTracebackFilter` drops those (a probe during warm-up is no error).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse
from kserve.errors import ModelNotReady

from predictor.serving.lifecycle import Lifecycle, Phase

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
        return JSONResponse(
            {"status": "alive" if lifecycle.live else Phase.ENGINE_DEAD.value}, 200 if lifecycle.live else 503
        )

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


def install_health_routes(app: FastAPI, lifecycle: Lifecycle, bases: Sequence[str] = ("",)) -> None:
    """Put the health routes, under each of ``bases`` (``""``: the root), first in ``app``: the first route that
    matches answers, and KServe's app already has its own ``/v2/health/ready``."""
    routes = APIRouter()
    for base in bases:
        routes.include_router(health_router(lifecycle), prefix=base)
    app.router.routes[:0] = routes.routes


class NotReadyTracebackFilter(logging.Filter):
    """Drops KServe's ERROR record, with traceback, of a request answered 503 because the model is not ready
    (every readiness probe that lands in the warm-up gets one); the 503 itself stays in the access log."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a record of :class:`kserve.errors.ModelNotReady`."""
        return not (record.exc_info is not None and isinstance(record.exc_info[1], ModelNotReady))
