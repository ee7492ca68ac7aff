"""HTTP limits KServe's ModelServer does not expose: bind address, header size, header read timeout and
a connection cap, applied to the uvicorn server it builds.

KServe binds uvicorn to 0.0.0.0 with httptools, which accepts headers of any size and waits forever for a
request's headers. Here the HTTP protocol is h11 (its ``h11_max_incomplete_event_size`` bounds the bytes
of a request line plus headers: past it, 431/400 and the connection closes), every connection must
deliver a request's headers within ``header_timeout`` seconds of opening or of its previous response
(else it is closed), and ``limit_concurrency`` answers 503 past ``max_connections`` connections.
The heap built at startup is frozen (``gc.freeze``) before serving.
The body's own timeout and size are the request-body middleware's (``predictor.http_body``).
"""

from __future__ import annotations

import asyncio
import gc
from dataclasses import dataclass
from typing import Any

import h11
import kserve
from uvicorn.protocols.http.h11_impl import H11Protocol


@dataclass(frozen=True)
class HttpLimits:
    """Where to listen and how much a client may hold."""

    host: str = "127.0.0.1"
    max_header_bytes: int = 64 * 1024
    header_timeout: float = 30.0
    max_connections: int = 1024
    #: Seconds requests in flight have after SIGTERM's delay (the shutdown middleware answers 503 then).
    drain_s: float = 20.0


#: uvicorn cancels requests still running this long after the drain (a cancelled request is a 500): it never
#: comes to that, the shutdown middleware (``predictor.lifecycle.GracefulShutdown``) answers them 503 first.
UVICORN_GRACE_AFTER_DRAIN_S = 3.0


class HeaderDeadlineProtocol(H11Protocol):
    """h11 with a deadline for each request's headers (a slowloris client cannot hold a connection)."""

    header_timeout: float = 30.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the first request's header deadline."""
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        """Start the next request's header deadline (an idle keep-alive connection has its own timeout)."""
        super().on_response_complete()
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the deadline with the connection."""
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._header_deadline_passed)

    def _header_deadline_passed(self) -> None:
        self._header_deadline = None
        waiting_for_headers = self.conn.their_state in (h11.IDLE, h11.DONE) and (
            self.cycle is None or self.cycle.response_complete
        )
        if waiting_for_headers and not self.transport.is_closing():
            self.transport.close()


def protocol_with_deadline(header_timeout: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class with ``header_timeout`` set (uvicorn instantiates it per connection)."""
    return type("BoundedH11Protocol", (HeaderDeadlineProtocol,), {"header_timeout": header_timeout})


class ClefModelServer(kserve.ModelServer):
    """KServe's ModelServer with :class:`HttpLimits` applied to its uvicorn server before it starts."""

    def __init__(self, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.limits = limits

    def setup_event_loop(self) -> None:
        """KServe's loop setup, then the limits (the REST server exists by now and has not started)."""
        super().setup_event_loop()
        # The startup heap (engine, tokenizer, modules) is long-lived: frozen, the collections that a
        # request's many new objects trigger do not walk it again and again.
        gc.freeze()
        rest = self._rest_server
        assert rest is not None, "one REST server (workers=1) is expected"
        config = rest.config
        config.host = self.limits.host
        config.http = protocol_with_deadline(self.limits.header_timeout)
        config.h11_max_incomplete_event_size = self.limits.max_header_bytes
        config.limit_concurrency = self.limits.max_connections
        config.timeout_graceful_shutdown = int(self.limits.drain_s + UVICORN_GRACE_AFTER_DRAIN_S)
