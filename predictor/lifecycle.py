"""The model's one lifecycle state, and what moves it: warm-up, engine death, SIGTERM.

``loading`` → ``warming_up`` → ``ok``; then ``draining`` (SIGTERM) or ``engine_dead``; ``ok`` ⇄ ``unloaded``
through KServe's repository API (``--enable-model-repository``: out of service, the engine kept). Readiness
(KServe's ``GET /v1/models/<name>``, ``/v2/models/<name>/ready``) is ``ok`` only; liveness
(``GET /health/live``) fails only when the engine is dead.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import signal
from dataclasses import dataclass
from types import FrameType
from typing import Any, Awaitable, Callable

from predictor import metrics
from predictor.engines.base import EngineDead
from predictor.errors import from_service_error
from predictor.service_errors import Unavailable

log = logging.getLogger(__name__)

ENGINE_DEAD_EXIT_CODE = 3
WATCHDOG_PERIOD_S = 1.0
#: Seconds the process may take to stop after the drain (close the engine, stop the servers, exit); the pod's
#: grace period must cover ``--shutdown-delay`` + ``--drain-timeout`` + this.
EXIT_AFTER_DRAIN_S = 5.0
RETRY_AFTER_S = {"loading": 5, "warming_up": 5, "draining": 1, "engine_dead": 5, "stopped": 1, "unloaded": 5}


class Phase(str, enum.Enum):
    """Where the model is in its life (the value is what ``GET /health`` reports)."""

    LOADING = "loading"
    WARMING_UP = "warming_up"
    OK = "ok"
    DRAINING = "draining"
    ENGINE_DEAD = "engine_dead"
    STOPPED = "stopped"
    UNLOADED = "unloaded"


class Lifecycle:
    """The one readiness state of a served model (``clef_ready`` reads it)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.phase = Phase.LOADING
        self.failure: str | None = None
        metrics.READY.set_function(lambda: float(self.ready))

    @property
    def ready(self) -> bool:
        """Warmed up, engine alive, not shutting down."""
        return self.phase is Phase.OK

    @property
    def live(self) -> bool:
        """The process can still serve (false once the engine is dead)."""
        return self.phase is not Phase.ENGINE_DEAD

    def enter(self, phase: Phase) -> None:
        """Move to ``phase``; a dead engine or a stopped model stays so."""
        if self.phase in (Phase.ENGINE_DEAD, Phase.STOPPED) and phase is not Phase.STOPPED:
            return
        self.phase = phase

    def take_out_of_service(self) -> bool:
        """``ok`` → ``unloaded`` (the repository API's unload); False in any other phase."""
        if self.phase is not Phase.OK:
            return False
        self.phase = Phase.UNLOADED
        return True

    def put_back_in_service(self) -> bool:
        """``unloaded`` → ``ok`` (the repository API's load); True when the model is serving afterwards."""
        if self.phase is Phase.UNLOADED:
            self.phase = Phase.OK
        return self.phase is Phase.OK

    def engine_died(self, cause: str) -> bool:
        """Record the engine's death; True the first time (so the cause is logged once).

        An engine closed on purpose (``stopped``) is not dead.
        """
        if self.phase in (Phase.ENGINE_DEAD, Phase.STOPPED):
            return False
        self.failure = cause
        self.phase = Phase.ENGINE_DEAD
        return True

    def check_serving(self) -> None:
        """Raise :class:`Unavailable` unless requests may be admitted now."""
        if self.phase is Phase.OK:
            return
        reason = self.phase.value
        messages = {
            Phase.LOADING: f"model {self.name!r} is loading; retry shortly",
            Phase.WARMING_UP: f"model {self.name!r} is warming up; retry shortly",
            Phase.DRAINING: "the server is shutting down; retry on another replica",
            Phase.ENGINE_DEAD: f"the engine is not running ({self.failure}); the server is restarting",
            Phase.STOPPED: "the server has stopped",
            Phase.UNLOADED: (
                f"model {self.name!r} is unloaded; load it with POST /v2/repository/models/{self.name}/load"
            ),
        }
        raise Unavailable(messages[self.phase], reason, RETRY_AFTER_S[reason])


def flush_logs() -> None:
    """Write out what the log handlers hold (before ``os._exit``, which skips it)."""
    for handler in logging.getLogger().handlers + logging.getLogger("predictor").handlers:
        handler.flush()


def exit_after_shutdown(exit_process: Callable[[int], Any] = os._exit) -> None:
    """End the process once the servers have stopped and the engine is closed.

    An engine step (a forward pass in a worker thread) that started before the engine closed has nobody
    waiting for it; the interpreter's normal exit would join its thread and hold the process past the pod's
    grace period, so the process ends here without it.
    """
    log.info("servers stopped and engine closed: exiting")
    flush_logs()
    exit_process(0)


class EngineWatchdog:
    """Checks the engine every second; on death logs the cause once and (by default) ends the process.

    The exit is non-zero (:data:`ENGINE_DEAD_EXIT_CODE`) so that Kubernetes restarts the container;
    requests in flight get 503 with ``Retry-After`` first (the service maps the engine's failure).
    """

    def __init__(
        self,
        lifecycle: Lifecycle,
        check: Callable[[], Awaitable[None]],
        close: Callable[[], None],
        exit_on_death: bool = True,
        exit_process: Callable[[int], Any] = os._exit,
        period_s: float = WATCHDOG_PERIOD_S,
    ) -> None:
        self.lifecycle = lifecycle
        self._check = check
        self._close = close
        self.exit_on_death = exit_on_death
        self._exit = exit_process
        self.period_s = period_s
        self._wake = asyncio.Event()

    def poke(self) -> None:
        """Check now (a request just failed in the engine)."""
        self._wake.set()

    async def run(self) -> None:
        """Check until the engine dies (then handle it) or the model stops."""
        while self.lifecycle.phase is not Phase.STOPPED:
            try:
                await self._check()
            except EngineDead as exc:
                await self._died(str(exc))
                return
            try:
                await asyncio.wait_for(self._wake.wait(), self.period_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    async def _died(self, cause: str) -> None:
        if not self.lifecycle.engine_died(cause):
            return
        if not self.exit_on_death:
            log.error("engine died: %s; --no-exit-on-engine-death: serving 503 until restarted", cause)
            return
        log.error("engine died: %s; exiting with code %d so the container is restarted", cause, ENGINE_DEAD_EXIT_CODE)
        await asyncio.sleep(0.2)  # let the 503s of requests in flight go out
        try:
            self._close()
        except Exception as exc:  # the engine is dead already: closing is best effort
            log.warning("closing the dead engine failed: %r", exc)
        flush_logs()
        self._exit(ENGINE_DEAD_EXIT_CODE)


class GracefulShutdown:
    """SIGTERM: fail readiness and refuse new requests for ``delay_s`` seconds, then drain for ``drain_s``.

    Installed as a pure ASGI middleware: on the lifespan startup (uvicorn has installed its signal
    handlers by then) it puts its own SIGTERM handler in front of uvicorn's. Kubernetes keeps
    sending traffic for a moment after it starts terminating a pod; during ``delay_s`` those
    requests get 503 with ``Retry-After`` (not a refused connection), in-flight requests go on. Then
    uvicorn's own handler stops accepting connections and waits for the requests in flight, and the
    ``drain_hooks`` start (the gRPC server's own drain). A request still unanswered ``drain_s`` seconds
    later is cancelled here and answered 503 with ``Retry-After`` (uvicorn's own graceful timeout, which
    would cancel it into a 500, is set later than this: :func:`predictor.server_limits` does it).
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

        async def watched_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                exchange.started = True
            await send(message)

        self._in_flight[task] = exchange
        try:
            await self.app(scope, receive, watched_send)
        except asyncio.CancelledError:
            if not exchange.cut or exchange.started:
                raise
            task.uncancel()
            error = Unavailable("the server is shutting down; retry on another replica", "draining",
                                RETRY_AFTER_S["draining"])
            await from_service_error(error).response()(scope, receive, send)
        finally:
            del self._in_flight[task]

    def install(self) -> None:
        """Put our SIGTERM handler in front of the current one (uvicorn's)."""
        self._loop = asyncio.get_running_loop()
        self._previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self.lifecycle.phase is Phase.DRAINING:
            return
        self.lifecycle.enter(Phase.DRAINING)
        log.info(
            "SIGTERM: not ready; new requests get 503 for %.1fs, then %.1fs to finish requests in flight",
            self.delay_s, self.drain_s,
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
