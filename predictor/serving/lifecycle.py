"""The model's one lifecycle state, and what moves it: warm-up, engine death, SIGTERM.

``loading`` → ``warming_up`` → ``ok``; then ``draining`` (SIGTERM) or ``engine_dead``; ``ok`` ⇄ ``unloaded``
through KServe's repository API (``--enable-model-repository``: out of service, the engine kept). Readiness
(KServe's ``GET /v1/models/<name>``, ``/v2/models/<name>/ready``) is ``ok`` only; liveness
(``GET /health/live``) fails only when the engine is dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from predictor.core import metrics
from predictor.core.errors import Unavailable
from predictor.engines.base import EngineDead

log = logging.getLogger(__name__)

ENGINE_DEAD_EXIT_CODE = 3
WATCHDOG_PERIOD_S = 1.0
#: Seconds the process may take to stop after the drain (close the engine, stop the servers, exit); the pod's
#: grace period must cover ``--shutdown-delay`` + ``--drain-timeout`` + this.
EXIT_AFTER_DRAIN_S = 5.0
RETRY_AFTER_S = {"loading": 5, "warming_up": 5, "draining": 1, "engine_dead": 5, "stopped": 1, "unloaded": 5}


class Phase(enum.StrEnum):
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
        """Raise :class:`Unavailable` unless requests may be admitted now.

        A draining server still admits them: during the shutdown delay readiness fails so that Kubernetes withdraws
        the pod's endpoints, but the requests its Services still send meanwhile are answered, not refused (a client
        of a Service cannot retry on another replica by itself). After the delay the server stops accepting
        connections; only then does the drain timeout answer what is left with 503.
        """
        if self.phase in (Phase.OK, Phase.DRAINING):
            return
        reason = self.phase.value
        messages = {
            Phase.LOADING: f"model {self.name!r} is loading; retry shortly",
            Phase.WARMING_UP: f"model {self.name!r} is warming up; retry shortly",
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.period_s)
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
        except Exception as exc:  # noqa: BLE001 (the engine is dead: a failed close is logged, the exit still happens)
            log.warning("closing the dead engine failed: %r", exc)
        flush_logs()
        self._exit(ENGINE_DEAD_EXIT_CODE)
