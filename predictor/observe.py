"""Per-request observation for the inference routes: Prometheus metrics and optional JSON log lines.

An ASGI middleware times each inference request, reads its status, and collects the prompt tokens
the service reports through a context variable (so KServe's routes are covered too).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable

from predictor import metrics

REQUEST_ID_HEADER = "x-request-id"
ROUTES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("systemone", re.compile(r"^(/jev)?/v1/systemone$")),
    ("v1_predict", re.compile(r"^/v1/models/[^/]+:predict$")),
    ("v2_infer", re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")),
)
request_logger = logging.getLogger("clef.requests")


@dataclass
class RequestRecord:
    """What is known about one request while it runs."""

    request_id: str
    route: str
    started: float = field(default_factory=time.perf_counter)
    input_tokens: int = 0
    records: int = 0


_current: ContextVar[RequestRecord | None] = ContextVar("clef_request", default=None)


def record_tokens(tokens: int) -> None:
    """Add one scored record of ``tokens`` prompt tokens to the current request, if any."""
    record = _current.get()
    if record is not None:
        record.input_tokens += tokens
        record.records += 1


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


class RequestObserverMiddleware:
    """Counts, times and (with JSON logs on) logs every inference request."""

    def __init__(self, app: Callable[..., Any], json_logs: bool = False) -> None:
        self.app = app
        self.json_logs = json_logs

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        """ASGI entry point."""
        route = route_of(scope.get("path", "")) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        request_id = headers.get(REQUEST_ID_HEADER.encode(), b"").decode("latin-1") or uuid.uuid4().hex
        record = RequestRecord(request_id=request_id, route=route)
        status = 500

        async def send_with_id(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                response_headers = list(message.get("headers", []))
                if not any(key.lower() == b"x-request-id" for key, _ in response_headers):
                    response_headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": response_headers}
            await send(message)

        token = _current.set(record)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            _current.reset(token)
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
