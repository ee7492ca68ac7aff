"""The operator's own work queue: one operator-wide scheduler of reconciliation passes, fed from kopf's indices.

It runs a ClefDecision's pass when it is due (a change seen by a handler, a retry after a failed pass with backoff,
the end of a removal grace period, the periodic resync), one pass at a time per ClefDecision, writes the status
when it changed, posts the events (repeats aggregated), and backs off per name from InferenceService names held by
other owners. One task, not a per-object timer or daemon, so kopf puts no finalizer on ClefDecisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from clef_operator.constants import PEERING_LIFETIME
from clef_operator.kube import ApiError, ConflictError, KubeApi
from clef_operator.pass_state import Event, Policy
from clef_operator.pools import GpuNode
from clef_operator.reconcile import Outcome, reconcile

LOGGER = logging.getLogger(__name__)
RESYNC_SECONDS = float(os.environ.get("CLEF_RESYNC_SECONDS", "300"))
RETRY_BASE_ENV = "CLEF_RETRY_BASE_SECONDS"
RETRY_MAX_SECONDS = 300.0
#: A moment less than this many seconds ahead counts as reached (a pass due, a name's backoff over): a shorter
#: wait would end at once (asyncio runs the timers due within its clock's resolution) and the scheduler would
#: spin until the clock moved past that moment.
DUE_SLACK_SECONDS = 1e-3
# An Event identical to one posted on the same ClefDecision this recently is not posted again (Kubernetes'
# recorder aggregates repeats over the same window).
EVENT_AGGREGATION_SECONDS = 600.0

Key = tuple[str, str]


@dataclass
class OperatorState:
    """Operator-wide state shared by all handlers through kopf's memo."""

    policy: Policy = field(default_factory=Policy)
    peering_lifetime: int = PEERING_LIFETIME  # kopf's settings.peering.lifetime (seconds)
    api: KubeApi | None = None
    locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    last_status: dict[str, dict[str, Any]] = field(default_factory=dict)
    node_fingerprint: frozenset[Any] | None = None
    # The scheduler: when each ClefDecision is due, how often its last passes failed, and a wake-up call.
    due: dict[Key, float] = field(default_factory=dict)
    failures: dict[Key, int] = field(default_factory=dict)
    wake: asyncio.Event | None = None
    task: asyncio.Task[None] | None = None
    # Live views of kopf's indices, captured from the first handler call that receives them.
    nodes_index: kopf.Index[str, GpuNode] | None = None
    decisions_index: kopf.Index[Key, dict[str, Any]] | None = None
    # InferenceService names held by others, by (namespace, name): the ClefDecision waiting for each.
    waiting_for: dict[Key, Key] = field(default_factory=dict)
    # InferenceService names found held by another owner, by (namespace, name): (retry at, failed tries).
    name_backoff: dict[Key, tuple[float, int]] = field(default_factory=dict)
    # Events posted per ClefDecision uid: (type, reason, message) -> loop time, for aggregating repeats.
    posted: dict[str, dict[tuple[str, str, str], float]] = field(default_factory=dict)

    def record(self, body: Mapping[str, Any], events: Iterable[Event]) -> None:
        """Post each event unless the same one (type, reason, message) was posted on this object within
        EVENT_AGGREGATION_SECONDS, as Kubernetes' event recorder aggregates repeats."""
        now = asyncio.get_running_loop().time()
        seen = self.posted.setdefault(body["metadata"].get("uid", ""), {})
        for key in [key for key, when in seen.items() if now - when >= EVENT_AGGREGATION_SECONDS]:
            del seen[key]
        for event in events:
            key = (event.type, event.reason, event.message)
            if key in seen:
                continue
            seen[key] = now
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)  # type: ignore[arg-type]

    def schedule(self, key: Key, delay: float) -> None:
        """Reconcile ``key`` within ``delay`` seconds (an earlier due time stays)."""
        when = asyncio.get_running_loop().time() + max(delay, 0.0)
        self.due[key] = min(self.due.get(key, when), when)
        if self.wake is not None:
            self.wake.set()


def operator_state(memo: Any) -> OperatorState:
    """The operator's state in kopf's memo (created on first use)."""
    if getattr(memo, "clef", None) is None:
        memo.clef = OperatorState()
    return memo.clef


def plain(value: Any) -> Any:
    """A deep plain-dict copy of a kopf body view."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def retry_delay(retry: int) -> float:
    """Exponential backoff for retries: base * 2**retry, capped at five minutes."""
    base = float(os.environ.get(RETRY_BASE_ENV, "10"))
    return min(base * 2 ** min(retry, 16), RETRY_MAX_SECONDS)


def indexed_nodes(index: kopf.Index[str, GpuNode] | None) -> list[GpuNode]:
    """The GPU nodes in kopf's index of them."""
    return [node for _, store in (index or {}).items() for node in store]


def remember(
    state: OperatorState, memo: Any, gpu_nodes: kopf.Index[str, GpuNode], decisions: kopf.Index[Key, dict[str, Any]]
) -> None:
    """Keep the live indices and start the scheduler from the first resource handler that runs.

    Started here rather than at start-up: a task inherits its creator's context, and kopf.event() needs
    the context kopf gives its resource handlers.
    """
    state.nodes_index = gpu_nodes
    state.decisions_index = decisions
    if state.task is None:
        state.wake = asyncio.Event()
        state.task = asyncio.create_task(_scheduler(state, memo), name="clef-scheduler")


async def run_pass(body: Mapping[str, Any], memo: Any, nodes_index: kopf.Index[str, GpuNode] | None) -> Outcome | None:
    """Reconcile one ClefDecision under its lock, write its status if changed, post its events, schedule it.

    The GPU nodes are read from kopf's live index once the lock is held: passes wait for each other, and a pass
    given the nodes as they were when it was asked for (two nodes deleted at once: one handler per node) could run
    after a newer one and write a status from nodes already gone. The previous status is the one this process last
    wrote (the body's copy may lag behind it). A failed pass (a pool's write refused, a lost race, KServe missing)
    is scheduled again with backoff; a removal grace period that is running schedules a pass for its end. Returns
    None for a ClefDecision being deleted.
    """
    state = operator_state(memo)
    if state.api is None:
        raise kopf.TemporaryError("the Kubernetes client is not configured yet", delay=1)
    meta = body["metadata"]
    if meta.get("deletionTimestamp"):
        return None
    key = (meta["namespace"], meta["name"])
    uid = meta.get("uid", "")
    lock = state.locks.setdefault(key, asyncio.Lock())
    try:
        async with lock:
            previous = state.last_status.get(uid) or plain(body.get("status") or {})
            now = _reached_time()
            held = frozenset(
                name
                for (namespace, name), (until, _) in state.name_backoff.items()
                if namespace == key[0] and until > now
            )
            outcome = await reconcile(
                body,
                nodes=indexed_nodes(nodes_index),
                api=state.api,
                previous_status=previous,
                policy=state.policy,
                # kopf.adopt reads its owner as a mapping; its annotation asks for kopf's Body view of one
                adopt=lambda child: kopf.adopt(child, owner=body),  # type: ignore[arg-type]
                held=held,
            )
            if outcome.status != previous:
                await state.api.patch_decision_status(key[0], key[1], outcome.status)
            state.last_status[uid] = outcome.status
    except (ConflictError, ApiError):
        _retry_later(state, key)
        raise
    state.record(body, outcome.events)
    _back_off_taken_names(state, key, outcome.conflicts, held)
    if outcome.failed or outcome.kserve_missing:
        _retry_later(state, key)
    else:
        state.failures.pop(key, None)
        if outcome.requeue_after is not None:
            state.schedule(key, outcome.requeue_after)
    return outcome


def _back_off_taken_names(state: OperatorState, key: Key, conflicts: Iterable[str], held: frozenset[str]) -> None:
    """A name found taken again is tried after an exponential, capped backoff (its holder's deletion wakes
    the waiting ClefDecision at once); a name no longer in conflict is forgotten."""
    now = asyncio.get_running_loop().time()
    wanted = set(conflicts)
    for name in wanted:
        state.waiting_for[(key[0], name)] = key
        if name in held:
            continue
        _, tries = state.name_backoff.get((key[0], name), (0.0, 0))
        delay = retry_delay(tries)
        state.name_backoff[(key[0], name)] = (now + delay, tries + 1)
        state.schedule(key, delay)
    for taken in [taken for taken, owner in state.waiting_for.items() if owner == key and taken[1] not in wanted]:
        state.waiting_for.pop(taken, None)
        state.name_backoff.pop(taken, None)


def _retry_later(state: OperatorState, key: Key) -> None:
    failures = state.failures.get(key, 0)
    state.failures[key] = failures + 1
    state.schedule(key, retry_delay(failures))


def _reached_time() -> float:
    """The running loop's time plus :data:`DUE_SLACK_SECONDS`: every moment up to it counts as reached."""
    return asyncio.get_running_loop().time() + DUE_SLACK_SECONDS


async def _scheduler(state: OperatorState, memo: Any) -> None:
    """Run due passes; every RESYNC_SECONDS make every ClefDecision due (repairs drift nobody reported)."""
    assert state.wake is not None and state.decisions_index is not None  # set before the task starts
    loop = asyncio.get_running_loop()
    next_resync = loop.time() + RESYNC_SECONDS
    while True:
        now = _reached_time()
        if now >= next_resync:
            next_resync = now + RESYNC_SECONDS
            for key in state.decisions_index:
                state.due.setdefault(key, now)
        for key in [key for key, when in state.due.items() if when <= now]:
            del state.due[key]
            body = next(iter(state.decisions_index.get(key, [])), None)
            if body is None:
                continue
            try:
                await run_pass(body, memo, state.nodes_index)
            except (ConflictError, ApiError, kopf.TemporaryError):
                pass  # _run has scheduled the retry
            except Exception:  # a bug must not stop every later retry, grace expiry and resync
                LOGGER.exception("reconciling %s/%s failed; retrying with backoff", *key)
                _retry_later(state, key)
        state.wake.clear()
        wait = min([next_resync, *state.due.values()]) - loop.time()
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.wake.wait(), timeout=wait)
