"""Thin kopf handlers: they pick the trigger and hand the ClefDecision to the work queue (``work_queue``), which
reconciles it, writes the status and posts the events.

Triggers: a ClefDecision is created, changed or found at start-up; a change in what the GPU nodes say about
pools; any change to an owned InferenceService or Deployment (readiness, URL, hand edits) or the deletion of
one whose name a ClefDecision waits for; and the work queue's own scheduler, which retries failed
passes with backoff, wakes up when a removal grace period ends, and resyncs every ClefDecision periodically.
The scheduler is one operator-wide task fed from kopf's indices, not a per-object timer or daemon, so kopf
puts no finalizer on ClefDecisions: deleting one never waits for the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
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
    PLURAL,
    VERSION,
)
from clef_operator.diffbase import DigestDiffBaseStorage
from clef_operator.kserve_backend import label_value
from clef_operator.kube import ApiError, ConflictError, KubeApi, connection_info, load_configuration
from clef_operator.pools import GpuNode, node_fingerprint, summarize_node
from clef_operator.resources import DEPLOYMENTS
from clef_operator.watch_healing import install as install_watch_healing
from clef_operator.watch_healing import stale_streams
from clef_operator.work_queue import Key, indexed_nodes, operator_state, plain, remember, run_pass

# kopf's watch requests: the server ends each watch after server_timeout, the client gives up on a silent
# one after client_timeout, and every other API call kopf makes is bounded too.
WATCH_SERVER_TIMEOUT = 300
WATCH_CLIENT_TIMEOUT = 330
CONNECT_TIMEOUT = 30
REQUEST_TIMEOUT = 60
# Events of owned InferenceServices within this long of the first one cost one pass of their owner.
OWNED_EVENT_COALESCE_SECONDS = 0.5
# kopf retries a failed API call after each of these delays (its default waits up to 21 s between tries, so a
# spec change made during an outage could wait that long after the API answers again); after the last one the
# watch stream lists again (watch_healing).
ERROR_BACKOFFS = (0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0)
# SIGTERM: kopf's own last resort when a graceful exit hangs (its default: 10 minutes).
EXIT_TIMEOUT = 10.0
# The liveness probe fails when a watch stream made no progress for this long beyond what a silent stream
# (reconnected every inactivity timeout) and a stream retrying through an outage may take.
LIVENESS_MARGIN = 60.0

install_watch_healing()  # before any watch starts: every watch failure ends in a new list, not an exit


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """kopf's bookkeeping in our own annotations, warnings-only event posting, bounded watches and calls."""
    state = operator_state(memo)
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
    state = operator_state(memo)
    stale = stale_streams(settings, asyncio.get_running_loop().time(), liveness_limit(settings))
    if stale:
        raise kopf.PermanentError(f"no progress on the watch streams of {', '.join(stale)}")
    if state.task is not None and state.task.done():
        raise kopf.PermanentError("the reconciliation scheduler has stopped")
    return {"scheduler": "running" if state.task is not None else "not started"}


@kopf.on.cleanup()
async def stop_scheduler(memo: kopf.Memo, **_: Any) -> None:
    """Stop the scheduler task with the operator."""
    task = operator_state(memo).task
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """In-cluster service account or $KUBECONFIG, shared by kopf and the operator's own client."""
    configuration = load_configuration()
    operator_state(memo).api = KubeApi(configuration)
    return connection_info(configuration)


@kopf.index("nodes")
def gpu_nodes(body: kopf.Body, name: str, **_: Any) -> dict[str, GpuNode] | None:
    """GPU nodes by name (other nodes are not indexed)."""
    node = summarize_node(plain(body))
    return {name: node} if node is not None else None


@kopf.index(GROUP, VERSION, PLURAL)
def decisions(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[Key, dict[str, Any]]:
    """ClefDecisions by (namespace, name), as plain dicts, for node-, child- and scheduler-triggered passes."""
    return {(_namespaced(namespace), name): plain(body)}


def _indices(handler_kwargs: Mapping[str, Any]) -> tuple[kopf.Index[str, GpuNode], kopf.Index[Key, dict[str, Any]]]:
    """The two indices above, which kopf passes every handler as keyword arguments named after them (its
    handler protocols cannot declare them, so the handlers take them in ``**kwargs``)."""
    return handler_kwargs["gpu_nodes"], handler_kwargs["decisions"]


def _namespaced(namespace: str | None) -> str:
    """The namespace of a ClefDecision or InferenceService (kopf's None is for cluster-scoped kinds only)."""
    if namespace is None:
        raise ValueError("a namespaced object came without a namespace")
    return namespace


async def _reconcile_for_handler(
    body: kopf.Body, memo: kopf.Memo, gpu_nodes: kopf.Index[str, GpuNode], decisions: kopf.Index[Key, Any]
) -> None:
    remember(operator_state(memo), memo, gpu_nodes, decisions)
    try:
        outcome = await run_pass(plain(body), memo, gpu_nodes)
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
        state = operator_state(memo)
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
    state = operator_state(memo)
    gpu_nodes, decisions = _indices(kwargs)
    remember(state, memo, gpu_nodes, decisions)
    nodes = indexed_nodes(gpu_nodes)
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
                await run_pass(body, memo, gpu_nodes)


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
    state = operator_state(memo)
    remember(state, memo, gpu_nodes, decisions)
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
