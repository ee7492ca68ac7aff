"""One level-triggered, idempotent reconciliation of a ClefDecision.

Reads the GPU nodes and the serving objects the ClefDecision owns, creates, repairs and (after the removal
grace period) deletes them so that every eligible pool has exactly one predictor, and returns the status to
write, the events to post and when to look again. A pool's predictor is a KServe InferenceService (backend
``kserve``) or a Deployment with its Service and, when autoscaled, its HorizontalPodAutoscaler or KEDA
ScaledObject (backend ``deployment``); the objects of the backend not chosen are deleted once the choice is
certain. The backends' builders decide what the objects look like and ``writes`` makes the calls; this module
reads, compares and builds the status. A failure on one pool is recorded on that pool; the others still converge.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Required, TypedDict

from clef_operator.constants import (
    AUTO_BACKEND,
    BACKENDS,
    DEPLOYMENT_BACKEND,
    KSERVE_BACKEND,
    POOL_ANNOTATION,
    POOL_LABEL_KEY_ANNOTATION,
)
from clef_operator.kserve_backend import assign_names, label_value, naming_order, possible_names
from clef_operator.kube import ApiError, KubeApi
from clef_operator.pass_state import COMPANIONS, PRIMARY, Adopter, Event, Pass, Policy, orphaned, owned_by
from clef_operator.pools import (
    NO_NODES,
    GpuInfo,
    GpuNode,
    NodePool,
    PoolDecision,
    evaluate_pool,
    group_into_pools,
    pool_labels_carried,
)
from clef_operator.resources import INFERENCESERVICES
from clef_operator.spec import ClefDecisionSpec, InvalidSpecError, check_host_path, parse_spec
from clef_operator.status import (
    INELIGIBLE,
    INVALID_SPEC,
    KSERVE_NOT_INSTALLED,
    PENDING,
    READY,
    build_pool_status,
    build_status,
    format_time,
)
from clef_operator.writes import delete, remove_other_backends, remove_stray_companions, serve, withdraw


@dataclass
class Outcome:
    """What one reconciliation decided: status, events, and when (if ever) to reconcile again by itself."""

    status: dict[str, Any] = field(default_factory=dict)  # built by reconcile() from the pass's _Findings
    events: list[Event] = field(default_factory=list)
    invalid_spec: str | None = None
    kserve_missing: bool = False
    failed: bool = False
    requeue_after: float | None = None
    conflicts: list[str] = field(default_factory=list)  # serving-object names held by others


def _stated_pools(obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The (label key, pool)s an owned serving object says it serves: its annotations, its pods' nodeSelector.
    Both are editable copies: a pool is believed only where the object's name fits it (see _pool_of)."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = obj.get("spec") or {}
    pod = spec.get("predictor") or ((spec.get("template") or {}).get("spec")) or {}
    selector = pod.get("nodeSelector") or {}
    stated = []
    pool = annotations.get(POOL_ANNOTATION)
    key = annotations.get(POOL_LABEL_KEY_ANNOTATION) or next(iter(selector), None)
    if isinstance(key, str) and isinstance(pool, str) and key and pool:
        stated.append((key, pool))
    stated += [(key, pool) for key, pool in selector.items() if isinstance(pool, str) and key and pool]
    return stated


def _pool_of(
    obj: Mapping[str, Any], decision: str, fitting: Mapping[str, list[tuple[str, str]]], label_key: str | None
) -> tuple[str, str] | None:
    """The pool an owned serving object serves, told by its name: the operator names each pool's object after the
    ClefDecision and the pool (kserve_backend.possible_names), and a name cannot be edited. ``fitting``: the known pools
    whose names each name fits. Where a name fits several pools (one pool name under two label keys), the one its
    annotations or nodeSelector state wins, else the one named first; a pool that is no longer known (its nodes all
    gone) is taken from what the object states when its name fits it. None: nothing tells (the object is left as
    it is)."""
    name = obj["metadata"]["name"]
    stated = _stated_pools(obj)
    candidates = fitting.get(name) or [key for key in stated if name in possible_names(decision, key)]
    chosen = next((key for key in stated if key in candidates), None)
    return chosen or min(candidates, key=lambda key: naming_order(key, label_key), default=None)


class _Findings(TypedDict, total=False):
    """What a pass found, as build_status's keywords (the others, generation, previous and now, are the same for
    every pass)."""

    pools: Required[list[dict[str, Any]]]
    backend: Required[str | None]
    unpooled: Sequence[str]
    label_key: str | None
    other_pool_labels: Sequence[str]
    kserve_installed: bool
    invalid_spec: str | None
    missing: Sequence[str]


async def resolve_backend(spec: ClefDecisionSpec, policy: Policy, previous: Mapping[str, Any], api: KubeApi) -> str:
    """The backend serving a ClefDecision: spec.backend; else the operator's default; else (auto) the one it
    already has (status.backend: installing or removing KServe later never moves running predictors); else
    kserve when the API server serves InferenceServices, deployment when it positively does not. A discovery
    that fails raises ApiError: nothing is decided, created or deleted on a guess."""
    if spec.backend is not None:
        return spec.backend
    if policy.default_backend != AUTO_BACKEND:
        return policy.default_backend
    if previous.get("backend") in BACKENDS:
        return str(previous["backend"])
    return KSERVE_BACKEND if await api.served(INFERENCESERVICES) else DEPLOYMENT_BACKEND


async def reconcile(
    body: Mapping[str, Any],
    *,
    nodes: Iterable[GpuNode],
    api: KubeApi,
    adopt: Adopter,
    previous_status: Mapping[str, Any] | None = None,
    policy: Policy = Policy(),  # noqa: B008  (frozen: one shared default is safe)
    now: datetime.datetime | None = None,
    held: frozenset[str] = frozenset(),
) -> Outcome:
    """Bring the ClefDecision's serving objects in line with its spec and the cluster's GPU pools.

    ``held``: names found taken by another owner whose backoff is still running; a pool that wants one keeps
    its Conflict entry without a create attempt. Raises ApiError when the backend cannot be told yet.
    """
    previous = previous_status if previous_status is not None else (body.get("status") or {})
    moment = (now or datetime.datetime.now(datetime.UTC)).replace(microsecond=0)
    findings, outcome = await _converge(body, nodes, api, adopt, previous, policy, moment, held)
    generation = body["metadata"].get("generation")
    outcome.status = build_status(generation=generation, previous=previous, now=format_time(moment), **findings)
    outcome.events[:0] = _transition_events(previous, outcome.status)
    return outcome


async def _converge(
    body: Mapping[str, Any],
    nodes: Iterable[GpuNode],
    api: KubeApi,
    adopt: Adopter,
    previous: Mapping[str, Any],
    policy: Policy,
    moment: datetime.datetime,
    held: frozenset[str],
) -> tuple[_Findings, Outcome]:
    """The pass itself: what it found for the status, and the rest of its outcome (events, retries)."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid", "")
    try:
        spec = parse_spec(body.get("spec") or {})
        check_host_path(spec, policy.host_path_prefixes)
    except InvalidSpecError as exc:
        invalid = _Findings(pools=[], invalid_spec=str(exc), backend=previous.get("backend"))
        return invalid, Outcome(invalid_spec=str(exc))

    backend = await resolve_backend(spec, policy, previous, api)
    gpu_nodes = list(nodes)
    pools, unpooled = group_into_pools(gpu_nodes, spec.nodePools.labelKey, spec.nodePools.declared)
    unpooled_names = frozenset(unpooled)
    other_pool_labels = (
        pool_labels_carried(node for node in gpu_nodes if node.name in unpooled_names)
        if spec.nodePools.labelKey is not None
        else []
    )
    findings = _Findings(
        pools=[],
        backend=backend,
        unpooled=unpooled,
        label_key=spec.nodePools.labelKey,
        other_pool_labels=other_pool_labels,
    )
    decisions = {pool.key: evaluate_pool(pool, spec) for pool in pools}
    listed = await api.list_labelled(PRIMARY[backend], namespace, label_value(name))
    if listed is None and backend == KSERVE_BACKEND:
        findings["pools"] = [
            build_pool_status(d, state=PENDING if d.eligible else INELIGIBLE, isvc_name=None, isvc=None)
            for d in decisions.values()
        ]
        findings["kserve_installed"] = False
        return findings, Outcome(kserve_missing=True)
    if listed is None:
        raise ApiError(f"listing {PRIMARY[backend].plural}", 404, "the resource is not served")

    fitting: dict[str, list[tuple[str, str]]] = {}
    for known in sorted(decisions):
        for candidate in dict.fromkeys(possible_names(name, known)):
            fitting.setdefault(candidate, []).append(known)
    owned: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for obj in listed:
        if not (owned_by(obj, uid) or orphaned(obj)):
            continue
        key = _pool_of(obj, name, fitting, spec.nodePools.labelKey)
        if key is not None:
            owned.setdefault(key, []).append(obj)
    for key in owned.keys() - decisions.keys():  # a pool whose nodes are all gone
        pool = NodePool(name=key[1], label_key=key[0], nodes=())
        decisions[key] = PoolDecision(pool, False, NO_NODES, "the pool has no nodes", GpuInfo(None, None, None, 0))
    taken = {key: sorted(obj["metadata"]["name"] for obj in objs)[0] for key, objs in owned.items()}
    names = assign_names(name, sorted(decisions), taken, spec.nodePools.labelKey)
    previous_entries = {(p.get("labelKey", ""), p.get("name", "")): p for p in previous.get("pools") or []}
    run = Pass(
        api=api,
        name=name,
        namespace=namespace,
        uid=uid,
        spec=spec,
        adopt=adopt,
        now=moment,
        previous=previous_entries,
        backend=backend,
        policy=policy,
        held=held,
    )
    for resource in COMPANIONS[backend]:  # a resource not served (KEDA's, not installed) holds none
        found = await api.list_labelled(resource, namespace, label_value(name)) or []
        run.companions[resource] = {
            obj["metadata"]["name"]: obj for obj in found if owned_by(obj, uid) or orphaned(obj)
        }

    entries = findings["pools"]
    for key in sorted(decisions):
        decision = decisions[key]
        current = [obj for obj in owned.get(key, []) if not obj["metadata"].get("deletionTimestamp")]
        keep = next((obj for obj in current if obj["metadata"]["name"] == names[key]), None)
        for extra in (obj for obj in current if obj is not keep):  # a second object for one pool
            await delete(run, key, extra, "it duplicates " + names[key])
        if decision.eligible:
            entries.append(await serve(run, decision, names[key], keep))
        else:
            entry = await withdraw(run, decision, keep)
            if entry is not None:
                entries.append(entry)
    await remove_stray_companions(run)
    await remove_other_backends(run)

    present = {pool.name for pool in pools}
    findings["missing"] = [pool for pool in spec.nodePools.include if pool not in present]
    return findings, Outcome(
        events=run.events,
        failed=run.failed,
        conflicts=run.conflicts,
        requeue_after=min(run.requeue) if run.requeue else None,
    )


def _transition_events(previous: Mapping[str, Any], status: Mapping[str, Any]) -> list[Event]:
    """Events for what changed since the previous status: pool eligibility and the Ready condition."""
    events: list[Event] = []
    before = {(pool.get("labelKey"), pool.get("name")): pool for pool in previous.get("pools") or []}
    for pool in status.get("pools") or []:
        old = before.get((pool.get("labelKey"), pool.get("name")))
        if old is not None and old.get("eligible") == pool["eligible"] and old.get("reason") == pool["reason"]:
            continue
        if pool["eligible"]:
            events.append(Event("Normal", "PoolEligible", f"node pool {pool['name']}: {pool['message']}"))
        else:
            events.append(Event("Warning", "PoolIneligible", f"node pool {pool['name']}: {pool['message']}"))
    old_ready = _condition(previous, READY)
    new_ready = _condition(status, READY)
    if (old_ready.get("status"), old_ready.get("reason")) != (new_ready.get("status"), new_ready.get("reason")):
        if new_ready.get("status") == "True":
            events.append(Event("Normal", "Ready", new_ready.get("message", "")))
        else:
            reason = str(new_ready.get("reason", "NotReady"))
            kind = "Warning" if reason in (KSERVE_NOT_INSTALLED, INVALID_SPEC) else "Normal"
            events.append(Event(kind, reason, new_ready.get("message", "")))
    return events


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})
