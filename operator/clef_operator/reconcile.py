"""One level-triggered, idempotent reconciliation of a ClefDecision.

Reads the GPU nodes and the InferenceServices the ClefDecision owns, creates, updates and deletes
InferenceServices so that every eligible pool has exactly one, and returns the status to write and
the events to post. The builders decide what the objects look like; this module only compares and calls.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clef_operator.builders import build_inferenceservice, build_update_patch, label_value, spec_hash, stamp_spec_hash
from clef_operator.constants import POOL_ANNOTATION, SPEC_HASH_ANNOTATION
from clef_operator.kube import ConflictError, KServeNotInstalledError, KubeApi
from clef_operator.pools import GpuNode, PoolDecision, evaluate_pool, group_into_pools
from clef_operator.spec import InvalidSpecError, parse_spec
from clef_operator.status import INVALID_SPEC, KSERVE_NOT_INSTALLED, READY, build_pool_status, build_status

Adopter = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the ClefDecision."""

    type: str  # "Normal" or "Warning"
    reason: str
    message: str


@dataclass
class Outcome:
    """What one reconciliation decided: the status to write, events to post, and whether to retry."""

    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    invalid_spec: str | None = None
    kserve_missing: bool = False
    conflicts: list[str] = field(default_factory=list)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


async def reconcile(
    body: Mapping[str, Any],
    *,
    nodes: Iterable[GpuNode],
    api: KubeApi,
    adopt: Adopter,
    previous_status: Mapping[str, Any] | None = None,
) -> Outcome:
    """Bring the ClefDecision's InferenceServices in line with its spec and the cluster's GPU pools."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid", "")
    generation = meta.get("generation")
    previous = previous_status if previous_status is not None else (body.get("status") or {})

    try:
        spec = parse_spec(body.get("spec") or {})
    except InvalidSpecError as exc:
        status = build_status(generation=generation, pools=[], invalid_spec=str(exc), previous=previous, now=_now())
        events = _transition_events(previous, status, [])
        return Outcome(status=status, events=events, invalid_spec=str(exc))

    pools, unpooled = group_into_pools(nodes, spec.nodePools.labelKey)
    decisions = [
        evaluate_pool(
            pool,
            min_capability=spec.min_capability,
            allow_unverified=spec.allowUnverifiedPools,
            gpus_per_replica=spec.gpus_for(pool.name),
            include=spec.nodePools.include,
            exclude=spec.nodePools.exclude,
        )
        for pool in pools
    ]
    events: list[Event] = []
    try:
        listed = await api.list_inferenceservices(namespace, label_value(name))
    except KServeNotInstalledError:
        entries = [build_pool_status(d, isvc_name=None, isvc=None) for d in decisions]
        status = build_status(
            generation=generation, pools=entries, unpooled=unpooled, kserve_installed=False,
            previous=previous, now=_now(),
        )
        return Outcome(status=status, events=_transition_events(previous, status, decisions), kserve_missing=True)

    owned = {obj["metadata"]["name"]: obj for obj in listed if _owned_by(obj, uid)}
    entries: list[dict[str, Any]] = []
    conflicts: list[str] = []
    wanted: set[str] = set()
    for decision in decisions:
        if not decision.eligible:
            entries.append(build_pool_status(decision, isvc_name=None, isvc=None))
            continue
        desired = build_inferenceservice(decision=name, namespace=namespace, pool=decision.pool, spec=spec)
        adopt(desired)
        stamp_spec_hash(desired)
        isvc_name = desired["metadata"]["name"]
        wanted.add(isvc_name)
        current, conflict = await _apply(api, owned.get(isvc_name), desired, events)
        if conflict is not None:
            conflicts.append(conflict)
        entries.append(build_pool_status(decision, isvc_name=isvc_name, isvc=current, conflict=conflict))

    for stale_name, stale in sorted(owned.items()):
        if stale_name in wanted or (stale.get("metadata") or {}).get("deletionTimestamp"):
            continue
        await api.delete_inferenceservice(namespace, stale_name)
        pool = (stale["metadata"].get("annotations") or {}).get(POOL_ANNOTATION, "?")
        events.append(Event("Normal", "InferenceServiceDeleted",
                            f"deleted {stale_name}: node pool {pool} is gone or no longer eligible"))

    status = build_status(generation=generation, pools=entries, unpooled=unpooled, previous=previous, now=_now())
    events = _transition_events(previous, status, decisions) + events
    return Outcome(status=status, events=events, conflicts=conflicts)


async def _apply(
    api: KubeApi, current: Mapping[str, Any] | None, desired: dict[str, Any], events: list[Event]
) -> tuple[Mapping[str, Any] | None, str | None]:
    """Create or update one InferenceService; return its latest state, or a conflict message."""
    meta = desired["metadata"]
    pool = meta["annotations"][POOL_ANNOTATION]
    if current is None:
        try:
            created = await api.create_inferenceservice(desired)
        except ConflictError:
            return None, f"an InferenceService named {meta['name']} exists and is not owned by this ClefDecision"
        events.append(Event("Normal", "InferenceServiceCreated", f"created {meta['name']} for node pool {pool}"))
        return created, None
    current_hash = ((current.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
    if current_hash == spec_hash(desired):
        return current, None
    updated = await api.patch_inferenceservice(meta["namespace"], meta["name"], build_update_patch(current, desired))
    events.append(Event("Normal", "InferenceServiceUpdated", f"updated {meta['name']} for node pool {pool}"))
    return updated, None


def _transition_events(
    previous: Mapping[str, Any], status: Mapping[str, Any], decisions: list[PoolDecision]
) -> list[Event]:
    """Events for what changed since the previous status: pool eligibility and the Ready condition."""
    events: list[Event] = []
    before = {pool.get("name"): pool for pool in previous.get("pools") or []}
    for decision in decisions:
        old = before.get(decision.pool.name)
        if old is not None and old.get("eligible") == decision.eligible and old.get("reason") == decision.reason:
            continue
        if decision.eligible:
            events.append(Event("Normal", "PoolEligible", f"node pool {decision.pool.name}: {decision.message}"))
        else:
            events.append(Event("Warning", "PoolIneligible", f"node pool {decision.pool.name}: {decision.message}"))
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
