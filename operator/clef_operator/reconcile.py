"""One level-triggered, idempotent reconciliation of a ClefDecision.

Reads the GPU nodes and the InferenceServices the ClefDecision owns, creates, repairs and (after the removal
grace period) deletes InferenceServices so that every eligible pool has exactly one, and returns the status
to write, the events to post and when to look again. The builders decide what the objects look like; this
module only compares and calls. A failure on one pool is recorded on that pool; the others still converge.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clef_operator.builders import assign_names, build_inferenceservice, build_update_patch, drifted, label_value
from clef_operator.constants import API_VERSION, KIND, POOL_ANNOTATION, POOL_LABEL_KEY_ANNOTATION
from clef_operator.kube import ApiError, ConflictError, KServeNotInstalledError, KubeApi
from clef_operator.pools import (
    CHOSEN_BY_SPEC,
    NO_NODES,
    GpuInfo,
    GpuNode,
    NodePool,
    PoolDecision,
    evaluate_pool,
    group_into_pools,
)
from clef_operator.spec import ClefDecisionSpec, InvalidSpecError, check_host_path, parse_spec
from clef_operator.status import (
    CONFLICT,
    DEGRADED,
    FAILED,
    INELIGIBLE,
    INVALID_SPEC,
    KSERVE_NOT_INSTALLED,
    NAME_COLLISION,
    NAME_TAKEN,
    PENDING,
    READY,
    SERVING,
    build_pool_status,
    build_status,
    format_time,
    parse_time,
)

Adopter = Callable[[dict[str, Any]], None]
# The largest InferenceService the operator sends: etcd stores objects up to 1.5 MiB, and KServe adds its
# defaults and status to what the operator writes.
MAX_INFERENCESERVICE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Policy:
    """What the operator's own command line allows every ClefDecision."""

    host_path_prefixes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the ClefDecision."""

    type: str  # "Normal" or "Warning"
    reason: str
    message: str


@dataclass
class Outcome:
    """What one reconciliation decided: status, events, and when (if ever) to reconcile again by itself."""

    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    invalid_spec: str | None = None
    kserve_missing: bool = False
    failed: bool = False
    requeue_after: float | None = None
    conflicts: list[str] = field(default_factory=list)  # InferenceService names held by others


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def _orphaned(obj: Mapping[str, Any]) -> bool:
    """Labelled as this ClefDecision's (it was listed by that label) but without any owner: its owner
    reference was stripped. Adopted back by the repair patch, so that it never outlives the ClefDecision."""
    return not (obj.get("metadata") or {}).get("ownerReferences")


def _pool_key(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(label key, pool) an owned InferenceService serves, from its annotations (or its nodeSelector)."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    pool = annotations.get(POOL_ANNOTATION)
    key = annotations.get(POOL_LABEL_KEY_ANNOTATION)
    if key is None:
        selector = ((obj.get("spec") or {}).get("predictor") or {}).get("nodeSelector") or {}
        key = next(iter(selector), None)
    return (key, pool) if key and pool else None


@dataclass
class _Pass:
    """The state of one reconciliation pass."""

    api: KubeApi
    name: str
    namespace: str
    uid: str
    spec: ClefDecisionSpec
    adopt: Adopter
    now: datetime.datetime
    previous: Mapping[tuple[str, str], Mapping[str, Any]]
    held: frozenset[str] = frozenset()
    events: list[Event] = field(default_factory=list)
    requeue: list[float] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    failed: bool = False

    def warn_once(self, key: tuple[str, str], entry: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning event, unless the previous status already reported the same message for the pool."""
        if (self.previous.get(key) or {}).get("predictorMessage") != entry.get("predictorMessage"):
            self.events.append(Event("Warning", reason, message))


async def reconcile(
    body: Mapping[str, Any],
    *,
    nodes: Iterable[GpuNode],
    api: KubeApi,
    adopt: Adopter,
    previous_status: Mapping[str, Any] | None = None,
    policy: Policy = Policy(),
    now: datetime.datetime | None = None,
    held: frozenset[str] = frozenset(),
) -> Outcome:
    """Bring the ClefDecision's InferenceServices in line with its spec and the cluster's GPU pools.

    ``held``: InferenceService names found taken by another owner whose backoff is still running; a pool
    that wants one keeps its Conflict entry without a create attempt.
    """
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid", "")
    generation = meta.get("generation")
    previous = previous_status if previous_status is not None else (body.get("status") or {})
    moment = (now or datetime.datetime.now(datetime.UTC)).replace(microsecond=0)
    stamp = format_time(moment)

    try:
        spec = parse_spec(body.get("spec") or {})
        check_host_path(spec, policy.host_path_prefixes)
    except InvalidSpecError as exc:
        status = build_status(generation=generation, pools=[], invalid_spec=str(exc), previous=previous, now=stamp)
        return Outcome(status=status, events=_transition_events(previous, status), invalid_spec=str(exc))

    pools, unpooled = group_into_pools(nodes, spec.nodePools.labelKey, spec.nodePools.declared)
    decisions = {pool.key: evaluate_pool(pool, spec) for pool in pools}
    try:
        listed = await api.list_inferenceservices(namespace, label_value(name))
    except KServeNotInstalledError:
        entries = [
            build_pool_status(d, state=PENDING if d.eligible else INELIGIBLE, isvc_name=None, isvc=None)
            for d in decisions.values()
        ]
        status = build_status(
            generation=generation,
            pools=entries,
            unpooled=unpooled,
            kserve_installed=False,
            previous=previous,
            now=stamp,
        )
        return Outcome(status=status, events=_transition_events(previous, status), kserve_missing=True)

    owned: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for obj in listed:
        key = _pool_key(obj)
        if (_owned_by(obj, uid) or _orphaned(obj)) and key is not None:
            owned.setdefault(key, []).append(obj)
    for key in owned.keys() - decisions.keys():  # a pool whose nodes are all gone
        pool = NodePool(name=key[1], label_key=key[0], nodes=())
        decisions[key] = PoolDecision(pool, False, NO_NODES, "the pool has no nodes", GpuInfo(None, None, None, 0))
    taken = {key: sorted(obj["metadata"]["name"] for obj in objs)[0] for key, objs in owned.items()}
    names = assign_names(name, sorted(decisions), taken, spec.nodePools.labelKey)
    previous_entries = {(p.get("labelKey", ""), p.get("name", "")): p for p in previous.get("pools") or []}
    run = _Pass(
        api=api,
        name=name,
        namespace=namespace,
        uid=uid,
        spec=spec,
        adopt=adopt,
        now=moment,
        previous=previous_entries,
        held=held,
    )

    entries = []
    for key in sorted(decisions):
        decision = decisions[key]
        current = [obj for obj in owned.get(key, []) if not obj["metadata"].get("deletionTimestamp")]
        keep = next((obj for obj in current if obj["metadata"]["name"] == names[key]), None)
        for extra in (obj for obj in current if obj is not keep):  # a second object for one pool
            await _delete(run, key, extra, "it duplicates " + names[key])
        if decision.eligible:
            entries.append(await _serve(run, decision, names[key], keep))
        else:
            entry = await _withdraw(run, decision, keep)
            if entry is not None:
                entries.append(entry)

    present = {pool.name for pool in pools}
    missing = [pool for pool in spec.nodePools.include if pool not in present]
    status = build_status(
        generation=generation, pools=entries, unpooled=unpooled, previous=previous, now=stamp, missing=missing
    )
    events = _transition_events(previous, status) + run.events
    return Outcome(
        status=status,
        events=events,
        failed=run.failed,
        conflicts=run.conflicts,
        requeue_after=min(run.requeue) if run.requeue else None,
    )


async def _serve(
    run: _Pass, decision: PoolDecision, isvc_name: str, current: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Create or repair the InferenceService of an eligible pool; failures stay on this pool's entry."""
    pool = decision.pool
    desired = build_inferenceservice(
        decision=run.name,
        namespace=run.namespace,
        pool=pool,
        spec=run.spec,
        variant=decision.variant,
        verified=decision.gpu.capability is not None,
        name=isvc_name,
    )
    run.adopt(desired)
    size = len(json.dumps(desired, separators=(",", ":")).encode())
    limit = MAX_INFERENCESERVICE_BYTES
    if size > limit:  # never sent: the API server would refuse it on every retry
        message = (
            f"the InferenceService built from this spec would take {size} bytes, more than the "
            f"{limit} the operator sends (the API server stores at most 1.5 MiB "
            "per object): shorten spec.affinity, spec.predictor.compileCache, env, envFrom or extraArgs"
        )
        entry = build_pool_status(decision, state=FAILED, isvc_name=isvc_name, isvc=None, message=message)
        run.warn_once(pool.key, entry, "InferenceServiceTooLarge", f"node pool {pool.name}: {message}")
        return entry
    before = run.previous.get(pool.key) or {}
    if current is None and isvc_name in run.held and before.get("state") == CONFLICT:
        run.conflicts.append(isvc_name)  # still backing off: no POST, the same report
        return build_pool_status(
            decision,
            state=CONFLICT,
            isvc_name=isvc_name,
            isvc=None,
            message=before.get("predictorMessage"),
            predictor_reason=before.get("predictorReason"),
        )
    try:
        if current is None:
            try:
                current = await run.api.create_inferenceservice(desired)
            except ConflictError:
                return await _collision(run, decision, isvc_name)
            run.events.append(
                Event("Normal", "InferenceServiceCreated", f"created {isvc_name} for node pool {pool.name}")
            )
        elif drifted(current, desired):
            current = await run.api.patch_inferenceservice(
                run.namespace, isvc_name, build_update_patch(current, desired)
            )
            run.events.append(
                Event("Normal", "InferenceServiceUpdated", f"updated {isvc_name} for node pool {pool.name}")
            )
    except ApiError as exc:
        run.failed = True
        entry = build_pool_status(decision, state=FAILED, isvc_name=isvc_name, isvc=None, message=str(exc))
        run.warn_once(pool.key, entry, "InferenceServiceFailed", f"node pool {pool.name}: {exc}")
        return entry
    return build_pool_status(decision, state=SERVING, isvc_name=isvc_name, isvc=current)


async def _collision(run: _Pass, decision: PoolDecision, isvc_name: str) -> dict[str, Any]:
    """The wanted name is held by an object this ClefDecision does not own: say whose, and wait for it to go."""
    run.conflicts.append(isvc_name)
    holder = await run.api.get_inferenceservice(run.namespace, isvc_name)
    if holder is not None and _owned_by(holder, run.uid):  # our own, still being deleted: wait for it to go
        return build_pool_status(
            decision,
            state=PENDING,
            isvc_name=isvc_name,
            isvc=None,
            message=f"waiting for the previous {isvc_name} to finish deleting",
        )
    owner = next(
        (
            ref
            for ref in ((holder or {}).get("metadata") or {}).get("ownerReferences") or []
            if ref.get("kind") == KIND and ref.get("apiVersion") == API_VERSION
        ),
        None,
    )
    if owner is not None:
        reason = NAME_COLLISION
        message = (
            f"the InferenceService name {isvc_name} is already used by ClefDecision {owner.get('name')} "
            "(rename one of the two ClefDecisions or pools)"
        )
    else:
        reason = NAME_TAKEN
        message = f"an InferenceService named {isvc_name} exists and is not owned by this ClefDecision"
    entry = build_pool_status(
        decision, state=CONFLICT, isvc_name=isvc_name, isvc=None, message=message, predictor_reason=reason
    )
    run.warn_once(decision.pool.key, entry, reason, f"node pool {decision.pool.name}: {message}")
    return entry


async def _withdraw(run: _Pass, decision: PoolDecision, current: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An ineligible pool: its predictor stays (Degraded) for the grace period, then goes.

    Returns the pool's status entry, or None for a pool that no longer exists in any form.
    """
    pool = decision.pool
    if current is None:
        return (
            None
            if not pool.nodes and decision.reason == NO_NODES
            else build_pool_status(decision, state=INELIGIBLE, isvc_name=None, isvc=None)
        )
    isvc_name = current["metadata"]["name"]
    before = run.previous.get(pool.key) or {}
    since = parse_time(before.get("degradedSince")) if before.get("state") == DEGRADED else None
    since = since or run.now
    removal = since + datetime.timedelta(seconds=run.spec.nodePools.removal_grace_seconds)
    if decision.reason in CHOSEN_BY_SPEC or run.now >= removal:
        why = (
            decision.message
            if decision.reason in CHOSEN_BY_SPEC
            else (f"{decision.message} since {format_time(since)}")
        )
        error = await _delete(run, pool.key, current, f"node pool {pool.name}: {why}")
        if error is not None:
            return build_pool_status(decision, state=FAILED, isvc_name=isvc_name, isvc=None, message=error)
        return None if not pool.nodes else build_pool_status(decision, state=INELIGIBLE, isvc_name=None, isvc=None)
    run.requeue.append((removal - run.now).total_seconds())
    entry = build_pool_status(
        decision,
        state=DEGRADED,
        isvc_name=isvc_name,
        isvc=current,
        degraded_since=format_time(since),
        removal_at=format_time(removal),
    )
    if before.get("state") != DEGRADED:
        run.events.append(
            Event(
                "Warning",
                "PoolDegraded",
                f"node pool {pool.name}: {decision.message}; {isvc_name} is kept until "
                f"{format_time(removal)} unless the pool recovers",
            )
        )
    return entry


async def _delete(run: _Pass, key: tuple[str, str], obj: Mapping[str, Any], why: str) -> str | None:
    """Delete one owned InferenceService; a refusal is reported as a Warning, returned, and retried later."""
    isvc_name = obj["metadata"]["name"]
    try:
        await run.api.delete_inferenceservice(run.namespace, isvc_name)
    except ApiError as exc:
        run.failed = True
        run.events.append(Event("Warning", "InferenceServiceFailed", f"node pool {key[1]}: {exc}"))
        return str(exc)
    run.events.append(Event("Normal", "InferenceServiceDeleted", f"deleted {isvc_name}: {why}"))
    return None


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
