"""SIGTERM at the HTTP surface: a pure ASGI middleware that drains before uvicorn stops.

The lifecycle states it moves (``draining``) live in :mod:`predictor.serving.lifecycle`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

from predictor.core.errors import Unavailable
from predictor.http.errors import from_service_error
from predictor.serving.lifecycle import RETRY_AFTER_S, Lifecycle, Phase

log = logging.getLogger(__name__)

CONNECTION_CLOSE = (b"connection", b"close")


def closing(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``Connection: close`` (instead of any ``Connection`` header they had)."""
    return [*((name, value) for name, value in headers if name.lower() != b"connection"), CONNECTION_CLOSE]


class GracefulShutdown:
    """SIGTERM: fail readiness while still answering for ``delay_s`` seconds, then drain for ``drain_s``.

    Installed as a pure ASGI middleware: on the lifespan startup (uvicorn has installed its signal
    handlers by then) it puts its own SIGTERM handler in front of uvicorn's. Kubernetes keeps
    sending traffic for a moment after it starts terminating a pod (until the failed readiness has
    withdrawn its endpoints everywhere); during ``delay_s`` those requests are answered as before
    (a Service's client cannot retry a 503 on another replica by itself), in-flight requests go on. Then
    uvicorn's own handler stops accepting connections and waits for the requests in flight, and the
    ``drain_hooks`` start (the gRPC server's own drain). A request still unanswered ``drain_s`` seconds
    later is cancelled here and answered 503 with ``Retry-After`` (uvicorn's own graceful timeout, which
    would cancel it into a 500, is set later than this: :mod:`predictor.http.server` does it).

    Every answer that starts after SIGTERM carries ``Connection: close``, and the server closes the connection
    once it is sent (h11 does for that header): a keep-alive client opens its next connection, to another
    replica, instead of sending it on one the server is about to drop (a reset, not an answer).
    """

    def __init__(self, app: Callable[..., Any], lifecycle: Lifecycle, delay_s: float, drain_s: float = 20.0) -> None:
        self.app = app
        self.lifecycle = lifecycle
        self.delay_s = delay_s
        self.drain_s = drain_s
        self.drain_hooks: list[Callable[[float], Any]] = []
        self._previous: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight: dict[asyncio.Task[Any], _Exchange] = {}
        self.shutting_down = False

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        """ASGI entry point: watch the lifespan startup, track HTTP requests until answered."""
        if scope["type"] == "http":
            await self._tracked(scope, receive, send)
            return
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def watched_receive() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.install()
            return message

        await self.app(scope, watched_receive, send)

    async def _tracked(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        task = asyncio.current_task()
        assert task is not None
        exchange = _Exchange()

        async def watched_send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                exchange.started = True
                if self.shutting_down:
                    message = {**message, "headers": closing(message.get("headers", ()))}
            await send(message)

        self._in_flight[task] = exchange
        try:
            await self.app(scope, receive, watched_send)
        except asyncio.CancelledError:
            if not exchange.cut or exchange.started:
                raise
            task.uncancel()
            error = Unavailable(
                "the server is shutting down; retry on another replica", "draining", RETRY_AFTER_S["draining"]
            )
            await from_service_error(error).response()(scope, receive, watched_send)
        finally:
            del self._in_flight[task]

    def install(self) -> None:
        """Put our SIGTERM handler in front of the current one (uvicorn's)."""
        self._loop = asyncio.get_running_loop()
        self._previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: it runs between any two bytecodes of the loop's thread, the loop's own timer
        bookkeeping included (a ``call_later`` from here can be lost), so it only hands the signal to the loop."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._start_draining, signum, frame)

    def _start_draining(self, signum: int, frame: FrameType | None) -> None:
        if self.lifecycle.phase is Phase.DRAINING:
            return
        self.shutting_down = True
        self.lifecycle.enter(Phase.DRAINING)
        log.info(
            "SIGTERM: not ready; answering for %.1fs more while the endpoints go, then %.1fs for requests in flight",
            self.delay_s,
            self.drain_s,
        )
        assert self._loop is not None
        self._loop.call_later(self.delay_s, self._hand_over, signum, frame)

    def _hand_over(self, signum: int, frame: FrameType | None) -> None:
        assert self._loop is not None
        self._loop.call_later(self.drain_s, self.cut_unanswered)
        for hook in self.drain_hooks:
            hook(self.drain_s)
        signal.signal(signal.SIGTERM, self._previous)
        if callable(self._previous):
            self._previous(signum, frame)

    def cut_unanswered(self) -> int:
        """Cancel every request not yet answered (each then gets 503 + Retry-After); return how many."""
        cut = 0
        for task, exchange in list(self._in_flight.items()):
            if not exchange.started and not exchange.cut:
                exchange.cut = True
                task.cancel()
                cut += 1
        if cut:
            log.warning("drain timeout: %d request(s) still in flight answered 503 with Retry-After", cut)
        return cut


@dataclass
class _Exchange:
    """One HTTP request in flight: whether its response has started, and whether the drain cut it."""

    started: bool = False
    cut: bool = False
