"""Thin kopf handlers: they pick the trigger, call reconcile(), write the status and post events.

Triggers: a ClefDecision is created, changed or found at start-up; a change in what the GPU nodes say about
pools; any change to an owned InferenceService or Deployment (readiness, URL, hand edits) or the deletion of
one whose name a ClefDecision waits for; and the operator's own scheduler, which retries failed
passes with backoff, wakes up when a removal grace period ends, and resyncs every ClefDecision periodically.
The scheduler is one operator-wide task fed from kopf's indices, not a per-object timer or daemon, so kopf
puts no finalizer on ClefDecisions: deleting one never waits for the operator.
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

from clef_operator.constants import (
    API_VERSION,
    DECISION_LABEL,
    GROUP,
    KIND,
    KSERVE_GROUP,
    KSERVE_PLURAL,
    KSERVE_VERSION,
    PEERING_LIFETIME,
    PLURAL,
    VERSION,
)
from clef_operator.diffbase import DigestDiffBaseStorage
from clef_operator.kserve_backend import label_value
from clef_operator.kube import ApiError, ConflictError, KubeApi, connection_info, load_configuration
from clef_operator.pools import GpuNode, node_fingerprint, summarize_node
from clef_operator.reconcile import Event, Outcome, Policy, reconcile
from clef_operator.resources import DEPLOYMENTS
from clef_operator.watch_healing import install as install_watch_healing
from clef_operator.watch_healing import stale_streams

LOGGER = logging.getLogger(__name__)
RESYNC_SECONDS = float(os.environ.get("CLEF_RESYNC_SECONDS", "300"))
RETRY_BASE_ENV = "CLEF_RETRY_BASE_SECONDS"
RETRY_MAX_SECONDS = 300.0
#: A moment less than this many seconds ahead counts as reached (a pass due, a name's backoff over): a shorter
#: wait would end at once (asyncio runs the timers due within its clock's resolution) and the scheduler would
#: spin until the clock moved past that moment.
DUE_SLACK_SECONDS = 1e-3
# kopf's watch requests: the server ends each watch after server_timeout, the client gives up on a silent
# one after client_timeout, and every other API call kopf makes is bounded too.
WATCH_SERVER_TIMEOUT = 300
WATCH_CLIENT_TIMEOUT = 330
CONNECT_TIMEOUT = 30
REQUEST_TIMEOUT = 60
# Events of owned InferenceServices within this long of the first one cost one pass of their owner.
OWNED_EVENT_COALESCE_SECONDS = 0.5
# An Event identical to one posted on the same ClefDecision this recently is not posted again (Kubernetes'
# recorder aggregates repeats over the same window).
EVENT_AGGREGATION_SECONDS = 600.0
# kopf retries a failed API call after each of these delays (its default waits up to 21 s between tries, so a
# spec change made during an outage could wait that long after the API answers again); after the last one the
# watch stream lists again (watch_healing).
ERROR_BACKOFFS = (0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0)
# SIGTERM: kopf's own last resort when a graceful exit hangs (its default: 10 minutes).
EXIT_TIMEOUT = 10.0
# The liveness probe fails when a watch stream made no progress for this long beyond what a silent stream
# (reconnected every inactivity timeout) and a stream retrying through an outage may take.
LIVENESS_MARGIN = 60.0

Key = tuple[str, str]

install_watch_healing()  # before any watch starts: every watch failure ends in a new list, not an exit


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


def _state(memo: Any) -> OperatorState:
    if getattr(memo, "clef", None) is None:
        memo.clef = OperatorState()
    return memo.clef


def _plain(value: Any) -> Any:
    """A deep plain-dict copy of a kopf body view."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def retry_delay(retry: int) -> float:
    """Exponential backoff for retries: base * 2**retry, capped at five minutes."""
    base = float(os.environ.get(RETRY_BASE_ENV, "10"))
    return min(base * 2 ** min(retry, 16), RETRY_MAX_SECONDS)


def _gpu_nodes(index: kopf.Index[str, GpuNode] | None) -> list[GpuNode]:
    return [node for _, store in (index or {}).items() for node in store]


def _remember(
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


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """kopf's bookkeeping in our own annotations, warnings-only event posting, bounded watches and calls."""
    state = _state(memo)
    settings.peering.lifetime = state.peering_lifetime
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = DigestDiffBaseStorage(prefix=GROUP, key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    if _delays(settings.networking.error_backoffs) == _delays(kopf.OperatorSettings().networking.error_backoffs):
        settings.networking.error_backoffs = ERROR_BACKOFFS
    exiting = settings.process.ultimate_exiting_timeout
    settings.process.ultimate_exiting_timeout = min(exiting, EXIT_TIMEOUT) if exiting else EXIT_TIMEOUT
    settings.watching.server_timeout = settings.watching.server_timeout or WATCH_SERVER_TIMEOUT
    settings.watching.client_timeout = settings.watching.client_timeout or WATCH_CLIENT_TIMEOUT
    settings.watching.connect_timeout = settings.watching.connect_timeout or CONNECT_TIMEOUT
    settings.networking.connect_timeout = settings.networking.connect_timeout or CONNECT_TIMEOUT
    settings.networking.request_timeout = min(settings.networking.request_timeout or REQUEST_TIMEOUT, REQUEST_TIMEOUT)


def _delays(backoffs: float | Iterable[float]) -> tuple[float, ...]:
    """kopf's error backoffs as the delays it waits between tries (one number: one retry after it)."""
    return tuple(backoffs) if isinstance(backoffs, Iterable) else (backoffs,)


def liveness_limit(settings: kopf.OperatorSettings) -> float:
    """Seconds without progress after which a watch stream counts as stuck."""
    backoffs = _delays(settings.networking.error_backoffs)
    retrying = sum(backoffs)
    attempts = len(backoffs) + 1
    connect = settings.networking.connect_timeout or CONNECT_TIMEOUT
    return settings.watching.inactivity_timeout + retrying + attempts * connect + LIVENESS_MARGIN


@kopf.on.probe(id="watching")
async def liveness(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """GET /healthz fails (HTTP 500) when a watch stream is stuck or the operator's scheduler has stopped."""
    state = _state(memo)
    stale = stale_streams(settings, asyncio.get_running_loop().time(), liveness_limit(settings))
    if stale:
        raise kopf.PermanentError(f"no progress on the watch streams of {', '.join(stale)}")
    if state.task is not None and state.task.done():
        raise kopf.PermanentError("the reconciliation scheduler has stopped")
    return {"scheduler": "running" if state.task is not None else "not started"}


@kopf.on.cleanup()
async def stop_scheduler(memo: kopf.Memo, **_: Any) -> None:
    """Stop the scheduler task with the operator."""
    task = _state(memo).task
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """In-cluster service account or $KUBECONFIG, shared by kopf and the operator's own client."""
    configuration = load_configuration()
    _state(memo).api = KubeApi(configuration)
    return connection_info(configuration)


@kopf.index("nodes")
def gpu_nodes(body: kopf.Body, name: str, **_: Any) -> dict[str, GpuNode] | None:
    """GPU nodes by name (other nodes are not indexed)."""
    node = summarize_node(_plain(body))
    return {name: node} if node is not None else None


@kopf.index(GROUP, VERSION, PLURAL)
def decisions(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[Key, dict[str, Any]]:
    """ClefDecisions by (namespace, name), as plain dicts, for node-, child- and scheduler-triggered passes."""
    return {(_namespaced(namespace), name): _plain(body)}


def _indices(handler_kwargs: Mapping[str, Any]) -> tuple[kopf.Index[str, GpuNode], kopf.Index[Key, dict[str, Any]]]:
    """The two indices above, which kopf passes every handler as keyword arguments named after them (its
    handler protocols cannot declare them, so the handlers take them in ``**kwargs``)."""
    return handler_kwargs["gpu_nodes"], handler_kwargs["decisions"]


def _namespaced(namespace: str | None) -> str:
    """The namespace of a ClefDecision or InferenceService (kopf's None is for cluster-scoped kinds only)."""
    if namespace is None:
        raise ValueError("a namespaced object came without a namespace")
    return namespace


async def _run(body: Mapping[str, Any], memo: Any, nodes: Iterable[GpuNode]) -> Outcome | None:
    """Reconcile one ClefDecision under its lock, write its status if changed, post its events, schedule it.

    The previous status is the one this process last wrote (the body's copy may lag behind it). A failed
    pass (a pool's write refused, a lost race, KServe missing) is scheduled again with backoff; a removal
    grace period that is running schedules a pass for its end. Returns None for a ClefDecision being deleted.
    """
    state = _state(memo)
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
            previous = state.last_status.get(uid) or _plain(body.get("status") or {})
            now = _reached_time()
            held = frozenset(
                name
                for (namespace, name), (until, _) in state.name_backoff.items()
                if namespace == key[0] and until > now
            )
            outcome = await reconcile(
                body,
                nodes=nodes,
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
                await _run(body, memo, _gpu_nodes(state.nodes_index))
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


async def _reconcile_for_handler(
    body: kopf.Body, memo: kopf.Memo, gpu_nodes: kopf.Index[str, GpuNode], decisions: kopf.Index[Key, Any]
) -> None:
    _remember(_state(memo), memo, gpu_nodes, decisions)
    try:
        outcome = await _run(_plain(body), memo, _gpu_nodes(gpu_nodes))
    except (ConflictError, ApiError):
        return  # scheduled again with backoff
    if outcome is not None and outcome.invalid_spec is not None:
        raise kopf.PermanentError(f"invalid spec: {outcome.invalid_spec}")


@kopf.on.resume(GROUP, VERSION, PLURAL)
async def resumed(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """Reconcile every ClefDecision found when the operator starts."""
    await _reconcile_for_handler(body, memo, *_indices(kwargs))


@kopf.on.create(GROUP, VERSION, PLURAL)
async def created(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """Reconcile a new ClefDecision."""
    await _reconcile_for_handler(body, memo, *_indices(kwargs))


@kopf.on.update(GROUP, VERSION, PLURAL)
async def updated(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """Reconcile a ClefDecision whose spec, labels or annotations changed."""
    await _reconcile_for_handler(body, memo, *_indices(kwargs))


@kopf.on.event(GROUP, VERSION, PLURAL)
def forget_deleted(type: str | None, namespace: str | None, name: str, uid: str, memo: kopf.Memo, **_: Any) -> None:
    """Drop the per-ClefDecision state of a deleted ClefDecision."""
    if type == "DELETED":
        state = _state(memo)
        key = (_namespaced(namespace), name)
        state.locks.pop(key, None)
        state.last_status.pop(uid, None)
        state.due.pop(key, None)
        state.failures.pop(key, None)
        state.posted.pop(uid, None)


@kopf.on.event("nodes")
async def node_changed(memo: kopf.Memo, **kwargs: Any) -> None:
    """Re-reconcile every ClefDecision when what the GPU nodes say about pools changes.

    Only pool labels, GPU Feature Discovery's GPU labels and GPU counts count: heartbeats, GFD's timestamp
    and other relabelling trigger nothing. A failed pass is retried by the scheduler with backoff.
    """
    state = _state(memo)
    gpu_nodes, decisions = _indices(kwargs)
    _remember(state, memo, gpu_nodes, decisions)
    nodes = _gpu_nodes(gpu_nodes)
    label_keys = {
        key
        for store in decisions.values()
        for body in store
        if (key := ((body.get("spec") or {}).get("nodePools") or {}).get("labelKey"))
    }
    fingerprint = node_fingerprint(nodes, label_keys)
    if fingerprint == state.node_fingerprint:
        return
    state.node_fingerprint = fingerprint
    for store in list(decisions.values()):
        for body in list(store):
            with contextlib.suppress(ConflictError, ApiError, kopf.TemporaryError):
                await _run(body, memo, nodes)


@kopf.on.event(KSERVE_GROUP, KSERVE_VERSION, KSERVE_PLURAL)
async def inferenceservice_changed(
    body: kopf.Body, namespace: str | None, name: str, type: str | None, memo: kopf.Memo, **kwargs: Any
) -> None:
    """A changed InferenceService (the kserve backend): see child_changed."""
    child_changed(body, _namespaced(namespace), name, type, memo, *_indices(kwargs))


@kopf.on.event(DEPLOYMENTS.group, DEPLOYMENTS.version, DEPLOYMENTS.plural)
async def deployment_changed(
    body: kopf.Body, namespace: str | None, name: str, type: str | None, memo: kopf.Memo, **kwargs: Any
) -> None:
    """A changed Deployment (the deployment backend; a Deployment holding a wanted name): see child_changed."""
    child_changed(body, _namespaced(namespace), name, type, memo, *_indices(kwargs))


def child_changed(
    body: kopf.Body,
    namespace: str,
    name: str,
    type: str | None,
    memo: kopf.Memo,
    gpu_nodes: kopf.Index[str, GpuNode],
    decisions: kopf.Index[Key, dict[str, Any]],
) -> None:
    """Schedule a pass of the owner of a changed serving object (readiness, URL, hand edits are repaired;
    events within OWNED_EVENT_COALESCE_SECONDS share one pass), of the ClefDecision whose label an ownerless
    one carries (adopted back), and at once of the ClefDecision waiting for a deleted one's name."""
    state = _state(memo)
    _remember(state, memo, gpu_nodes, decisions)
    isvc_namespace = namespace
    owner = next(
        (
            ref
            for ref in body.metadata.get("ownerReferences") or []
            if ref.get("kind") == KIND and ref.get("apiVersion") == API_VERSION
        ),
        None,
    )
    targets: list[Key] = []
    if owner is not None:
        targets.append((isvc_namespace, owner["name"]))
    elif not body.metadata.get("ownerReferences") and (label := body.metadata.labels.get(DECISION_LABEL)):
        # An owner reference stripped by hand: the ClefDecision of its label adopts it back.
        targets += [key for key in decisions if key[0] == isvc_namespace and label_value(key[1]) == label]
    if type == "DELETED" and (isvc_namespace, name) in state.waiting_for:
        state.name_backoff.pop((isvc_namespace, name), None)
        state.schedule(state.waiting_for.pop((isvc_namespace, name)), 0.0)  # a freed name is taken at once
    for key in dict.fromkeys(targets):
        parent = next(iter(decisions.get(key, [])), None)
        if parent is None or (owner is not None and parent["metadata"].get("uid") != owner.get("uid")):
            continue
        # Coalesced: KServe's status updates of many InferenceServices cost one pass of their owner.
        state.schedule(key, OWNED_EVENT_COALESCE_SECONDS)
