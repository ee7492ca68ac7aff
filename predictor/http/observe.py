"""Per-request observation: request ids on every response, and for the inference routes Prometheus
metrics and optional JSON log lines.

An ASGI middleware gives every response ``x-request-id`` and the TypeSafe SDK's ``x-typesafe-request-id``
(a client's own ``x-request-id`` is echoed when it is short printable text), times each inference
request, reads its status, and collects the prompt tokens the service reports through a context
variable (so KServe's routes are covered too).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from predictor.core import metrics
from predictor.serving.request_record import RequestRecord, current_record

REQUEST_ID_HEADER = "x-request-id"
SDK_REQUEST_ID_HEADER = "x-typesafe-request-id"
#: A client's request id is echoed only when it matches this (else a fresh id is made).
CLIENT_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")
ROUTES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("systemone", re.compile(r"^(/jev)?/v1/systemone$")),
    ("systemone_batch", re.compile(r"^(/jev)?/v1/systemone/batch$")),
    ("v1_predict", re.compile(r"^/v1/models/[^/]+:predict$")),
    ("v2_infer", re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")),
)
request_logger = logging.getLogger("clef.requests")


def route_of(path: str) -> str | None:
    """The metric label of an inference path, or None for other paths."""
    for name, pattern in ROUTES:
        if pattern.match(path):
            return name
    return None


def configure_json_logs() -> None:
    """Write one JSON object per request to stdout (``--json-logs``)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    request_logger.handlers = [handler]
    request_logger.setLevel(logging.INFO)
    request_logger.propagate = False


def request_id_of(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's ``x-request-id`` (or ``x-typesafe-request-id``) when it is sane, else a new id."""
    for name, value in headers:
        if name.lower() in (b"x-request-id", b"x-typesafe-request-id"):
            text = value.decode("latin-1")
            if CLIENT_REQUEST_ID.match(text):
                return text
    return uuid.uuid4().hex


class RequestObserverMiddleware:
    """Gives every response its request ids; counts, times and (with JSON logs on) logs inference requests."""

    def __init__(self, app: Callable[..., Any], json_logs: bool = False) -> None:
        self.app = app
        self.json_logs = json_logs

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        """ASGI entry point."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope["headers"])
        id_headers = [
            (REQUEST_ID_HEADER.encode(), request_id.encode()),
            (SDK_REQUEST_ID_HEADER.encode(), request_id.encode()),
        ]
        status = 500

        async def send_with_id(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                response_headers = [
                    (key, value)
                    for key, value in message.get("headers", [])
                    if key.lower() not in (b"x-request-id", b"x-typesafe-request-id")
                ]
                message = {**message, "headers": response_headers + id_headers}
            await send(message)

        route = route_of(scope.get("path", ""))
        if route is None:
            await self.app(scope, receive, send_with_id)
            return
        record = RequestRecord(request_id=request_id, route=route)
        token = current_record.set(record)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            current_record.reset(token)
            latency = time.perf_counter() - record.started
            metrics.REQUESTS.labels(route=route, status=str(status)).inc()
            metrics.LATENCY.labels(route=route).observe(latency)
            if self.json_logs:
                request_logger.info(
                    json.dumps(
                        {
                            "id": request_id,
                            "route": route,
                            "path": scope.get("path"),
                            "status": status,
                            "latency_ms": round(latency * 1000, 3),
                            "records": record.records,
                            "input_tokens": record.input_tokens,
                        }
                    )
                )
