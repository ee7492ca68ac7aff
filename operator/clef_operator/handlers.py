"""Thin kopf handlers: they pick the trigger, call reconcile(), write the status and post events.

Triggers: a ClefDecision is created, changed or found at start-up; a resync timer; a change in the
GPU nodes' labels (a pool appears, disappears or changes GPU); and a change in an owned
InferenceService's readiness or URL.
"""

from __future__ import annotations

import asyncio
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
    PLURAL,
    VERSION,
)
from clef_operator.kube import ConflictError, KubeApi, connection_info, load_configuration
from clef_operator.pools import GpuNode, summarize_node
from clef_operator.reconcile import Outcome, reconcile

RESYNC_SECONDS = float(os.environ.get("CLEF_RESYNC_SECONDS", "300"))
RETRY_BASE_ENV = "CLEF_RETRY_BASE_SECONDS"
RETRY_MAX_SECONDS = 300.0


@dataclass
class OperatorState:
    """Operator-wide state shared by all handlers through kopf's memo."""

    api: KubeApi | None = None
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    last_status: dict[str, dict[str, Any]] = field(default_factory=dict)
    node_fingerprint: frozenset[tuple[str, tuple[tuple[str, str], ...], int]] | None = None


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


def _gpu_nodes(index: kopf.Index[str, GpuNode]) -> list[GpuNode]:
    return [node for _, store in index.items() for node in store]


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Keep kopf's bookkeeping in our own annotations and post only warnings from logs as events."""
    _state(memo)
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING


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
def decisions(body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """ClefDecisions by (namespace, name), as plain dicts, for node- and child-triggered reconciles."""
    return {(namespace, name): _plain(body)}


async def _run(
    body: Mapping[str, Any], memo: Any, nodes: Iterable[GpuNode], *, trust_body_status: bool = False
) -> Outcome | None:
    """Reconcile one ClefDecision under its lock, write its status if changed, post its events.

    The previous status is the one this process last wrote (the body's copy may lag behind it),
    unless ``trust_body_status`` asks to compare with what the cluster holds (to repair drift).
    Returns None for a ClefDecision that is being deleted.
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
    async with lock:
        cluster_status = _plain(body.get("status") or {})
        previous = cluster_status if trust_body_status else state.last_status.get(uid) or cluster_status
        outcome = await reconcile(
            body, nodes=nodes, api=state.api, previous_status=previous,
            adopt=lambda child: kopf.adopt(child, owner=body),  # type: ignore[arg-type]
        )
        if outcome.status != previous:
            await state.api.patch_decision_status(key[0], key[1], outcome.status)
        state.last_status[uid] = outcome.status
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)  # type: ignore[arg-type]
    return outcome


async def _reconcile_for_handler(body: kopf.Body, memo: kopf.Memo, index: kopf.Index[str, GpuNode], retry: int) -> None:
    try:
        outcome = await _run(_plain(body), memo, _gpu_nodes(index))
    except ConflictError as exc:
        raise kopf.TemporaryError(f"lost a race, retrying: {exc}", delay=1) from exc
    if outcome is None:
        return
    if outcome.invalid_spec is not None:
        raise kopf.PermanentError(f"invalid spec: {outcome.invalid_spec}")
    if outcome.kserve_missing:
        raise kopf.TemporaryError("KServe's InferenceService CRD is not installed", delay=retry_delay(retry))


@kopf.on.resume(GROUP, VERSION, PLURAL)
async def resumed(body: kopf.Body, memo: kopf.Memo, gpu_nodes: kopf.Index[str, GpuNode], retry: int, **_: Any) -> None:
    """Reconcile every ClefDecision found when the operator starts."""
    await _reconcile_for_handler(body, memo, gpu_nodes, retry)


@kopf.on.create(GROUP, VERSION, PLURAL)
async def created(body: kopf.Body, memo: kopf.Memo, gpu_nodes: kopf.Index[str, GpuNode], retry: int, **_: Any) -> None:
    """Reconcile a new ClefDecision."""
    await _reconcile_for_handler(body, memo, gpu_nodes, retry)


@kopf.on.update(GROUP, VERSION, PLURAL)
async def updated(body: kopf.Body, memo: kopf.Memo, gpu_nodes: kopf.Index[str, GpuNode], retry: int, **_: Any) -> None:
    """Reconcile a ClefDecision whose spec, labels or annotations changed."""
    await _reconcile_for_handler(body, memo, gpu_nodes, retry)


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
async def resync(body: kopf.Body, memo: kopf.Memo, gpu_nodes: kopf.Index[str, GpuNode], **_: Any) -> None:
    """Periodic level-triggered resync: repairs drift nobody told the operator about."""
    try:
        await _run(_plain(body), memo, _gpu_nodes(gpu_nodes), trust_body_status=True)
    except ConflictError:
        pass  # the next trigger or tick reconciles again


@kopf.on.event(GROUP, VERSION, PLURAL)
def forget_deleted(type: str | None, namespace: str, name: str, uid: str, memo: kopf.Memo, **_: Any) -> None:
    """Drop the per-ClefDecision state of a deleted ClefDecision."""
    if type == "DELETED":
        state = _state(memo)
        state.locks.pop((namespace, name), None)
        state.last_status.pop(uid, None)


def node_fingerprint(nodes: Iterable[GpuNode]) -> frozenset[tuple[str, tuple[tuple[str, str], ...], int]]:
    """What about the GPU nodes matters to pools: names, labels, GPU counts (not heartbeats)."""
    return frozenset((node.name, tuple(sorted(node.labels.items())), node.gpus) for node in nodes)


@kopf.on.event("nodes")
async def node_changed(
    memo: kopf.Memo,
    gpu_nodes: kopf.Index[str, GpuNode],
    decisions: kopf.Index[tuple[str, str], dict[str, Any]],
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Re-reconcile every ClefDecision when a GPU node appears, disappears or changes labels."""
    state = _state(memo)
    nodes = _gpu_nodes(gpu_nodes)
    fingerprint = node_fingerprint(nodes)
    if fingerprint == state.node_fingerprint:
        return
    state.node_fingerprint = fingerprint
    for _, store in list(decisions.items()):
        for body in list(store):
            try:
                await _run(body, memo, nodes)
            except (ConflictError, kopf.TemporaryError) as exc:
                logger.info(f"Reconciling {body['metadata']['name']} after a node change is deferred: {exc}")


@kopf.on.event(KSERVE_GROUP, KSERVE_VERSION, KSERVE_PLURAL, labels={DECISION_LABEL: kopf.PRESENT})
async def inferenceservice_changed(
    body: kopf.Body,
    namespace: str,
    name: str,
    type: str | None,
    memo: kopf.Memo,
    gpu_nodes: kopf.Index[str, GpuNode],
    decisions: kopf.Index[tuple[str, str], dict[str, Any]],
    **_: Any,
) -> None:
    """Feed an owned InferenceService's readiness and URL back into its ClefDecision's status."""
    owner = next(
        (ref for ref in body.metadata.get("ownerReferences") or []
         if ref.get("kind") == KIND and ref.get("apiVersion") == API_VERSION),
        None,
    )
    if owner is None:
        return
    parents = decisions.get((namespace, owner["name"]), [])
    parent = next((p for p in parents if p["metadata"].get("uid") == owner["uid"]), None)
    if parent is None:
        return
    state = _state(memo)
    known = next(
        (pool for pool in (state.last_status.get(owner["uid"]) or {}).get("pools", [])
         if pool.get("inferenceService") == name),
        None,
    )
    status = body.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    if type != "DELETED" and known is not None and (known.get("ready"), known.get("url")) == (ready, status.get("url")):
        return
    try:
        await _run(parent, memo, _gpu_nodes(gpu_nodes))
    except ConflictError:
        pass  # the next event or the resync timer reconciles again
