"""The writes of one reconciliation pass: serve a pool (create, claim or repair its serving object and
companions), report a name held by another owner, withdraw an ineligible pool after its grace period, delete
duplicates, strays and the objects of a backend no longer chosen. Each write records its Events on the pass; a
failure stays on its pool's status entry.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

from clef_operator.constants import API_VERSION, BACKENDS, KIND, KSERVE_BACKEND
from clef_operator.deployment_backend import (
    UnsupportedOnBackendError,
    build_autoscaler,
    build_deployment,
    build_service,
)
from clef_operator.kserve_backend import Placement, build_inferenceservice, build_update_patch, drifted, label_value
from clef_operator.kube import ApiError, ConflictError
from clef_operator.pass_state import COMPANIONS, PRIMARY, Event, Pass, orphaned, owned_by
from clef_operator.pools import CHOSEN_BY_SPEC, NO_NODES, PoolDecision
from clef_operator.resources import SCALED_OBJECTS, Resource
from clef_operator.status import (
    CONFLICT,
    DEGRADED,
    FAILED,
    INELIGIBLE,
    NAME_COLLISION,
    NAME_TAKEN,
    PENDING,
    SERVING,
    format_time,
    parse_time,
)

# The largest serving object the operator sends: etcd stores objects up to 1.5 MiB, and KServe adds its
# defaults and status to what the operator writes.
MAX_INFERENCESERVICE_BYTES = 1024 * 1024


def _build(run: Pass, decision: PoolDecision, child_name: str) -> list[dict[str, Any]]:
    """The pool's objects in the chosen backend, its predictor object first (UnsupportedOnBackendError when the
    spec asks what the backend cannot do)."""
    placement = Placement(
        decision=run.name,
        namespace=run.namespace,
        pool=decision.pool,
        spec=run.spec,
        variant=decision.variant,
        verified=decision.gpu.capability is not None,
        name=child_name,
    )
    if run.backend == KSERVE_BACKEND:
        return [build_inferenceservice(placement)]
    deployment = build_deployment(placement, storage_initializer_image=run.policy.storage_initializer_image)
    autoscaler = build_autoscaler(run.spec, decision.pool, deployment)
    return [deployment, build_service(deployment), *([autoscaler] if autoscaler is not None else [])]


async def serve(
    run: Pass, decision: PoolDecision, child_name: str, current: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Create or repair the serving objects of an eligible pool; failures stay on this pool's entry."""
    pool = decision.pool
    kind = run.primary.kind
    run.kept.add(child_name)
    try:
        desired, *companions = _build(run, decision, child_name)
    except UnsupportedOnBackendError as exc:
        entry = run.pool_status(decision, state=FAILED, isvc_name=child_name, isvc=None, message=str(exc))
        run.warn_once(pool.key, entry, "UnsupportedOnBackend", f"node pool {pool.name}: {exc}")
        return entry
    for obj in (desired, *companions):
        run.adopt(obj)
    size = len(json.dumps(desired, separators=(",", ":")).encode())
    limit = MAX_INFERENCESERVICE_BYTES
    if size > limit:  # never sent: the API server would refuse it on every retry
        message = (
            f"the {kind} built from this spec would take {size} bytes, more than the "
            f"{limit} the operator sends (the API server stores at most 1.5 MiB "
            "per object): shorten spec.affinity, spec.predictor.compileCache, env, envFrom or extraArgs"
        )
        entry = run.pool_status(decision, state=FAILED, isvc_name=child_name, isvc=None, message=message)
        run.warn_once(pool.key, entry, f"{kind}TooLarge", f"node pool {pool.name}: {message}")
        return entry
    before = run.previous.get(pool.key) or {}
    if current is None and child_name in run.held and before.get("state") in (CONFLICT, PENDING):
        run.conflicts.append(child_name)  # still backing off: no POST, the same report
        return run.pool_status(
            decision,
            state=before["state"],
            isvc_name=child_name,
            isvc=None,
            message=before.get("predictorMessage"),
            predictor_reason=before.get("predictorReason"),
        )
    try:
        if any(obj["kind"] == SCALED_OBJECTS.kind for obj in companions) and not await _keda_served(run):
            message = (
                "autoscaling.keda needs KEDA: the API server does not serve keda.sh/v1alpha1 ScaledObjects; "
                "install KEDA (the operator retries with backoff), or autoscale on scaleMetric cpu or memory"
            )
            run.failed = True
            entry = run.pool_status(decision, state=FAILED, isvc_name=child_name, isvc=None, message=message)
            run.warn_once(pool.key, entry, "KedaNotInstalled", f"node pool {pool.name}: {message}")
            return entry
        if current is None:
            current, holder = await _create_or_claim(run, run.primary, desired, pool.name)
            if current is None:
                return await _collision(run, decision, child_name, holder)
        if drifted(current, desired):
            patch = build_update_patch(current, desired, whole_spec=run.backend == KSERVE_BACKEND)
            current = await run.api.patch(run.primary, run.namespace, child_name, patch)
            run.events.append(Event("Normal", f"{kind}Updated", f"updated {child_name} for node pool {pool.name}"))
        await _apply_companions(run, pool.name, child_name, companions)
    except ApiError as exc:
        run.failed = True
        entry = run.pool_status(decision, state=FAILED, isvc_name=child_name, isvc=None, message=str(exc))
        run.warn_once(pool.key, entry, f"{kind}Failed", f"node pool {pool.name}: {exc}")
        return entry
    return run.pool_status(decision, state=SERVING, isvc_name=child_name, isvc=current)


async def _keda_served(run: Pass) -> bool:
    """Whether KEDA's ScaledObject resource is served (API discovery, asked once per pass; ApiError when it
    cannot be told now, so that nothing is created or deleted on a guess)."""
    if run.keda_served is None:
        run.keda_served = await run.api.served(SCALED_OBJECTS)
    return run.keda_served


async def _apply_companions(run: Pass, pool: str, child_name: str, companions: list[dict[str, Any]]) -> None:
    """Create or repair the objects that go with a pool's predictor object; delete those no longer wanted."""
    wanted = {obj["kind"]: obj for obj in companions}
    # Deletions first: an autoscaler replaced by the other kind is gone before its successor takes the Deployment.
    for resource in sorted(COMPANIONS[run.backend], key=lambda resource: resource.kind in wanted):
        live = run.companions.get(resource, {}).get(child_name)
        desired = wanted.get(resource.kind)
        if desired is None:
            if live is not None:
                await run.api.delete(resource, run.namespace, child_name)
                run.events.append(Event("Normal", f"{resource.kind}Deleted", f"deleted {child_name}: not wanted"))
            continue
        if live is None:
            live, holder = await _create_or_claim(run, resource, desired, pool)
            if live is None:
                whose = (
                    "is this ClefDecision's, being deleted"
                    if holder is not None and owned_by(holder, run.uid)
                    else "exists and is not this ClefDecision's"
                )
                raise ApiError(f"creating {resource.kind} {child_name}", 409, f"one of that name {whose}")
        if drifted(live, desired):
            await run.api.patch(
                resource, run.namespace, child_name, build_update_patch(live, desired, whole_spec=False)
            )
            run.events.append(Event("Normal", f"{resource.kind}Updated", f"updated {child_name} for node pool {pool}"))


async def remove_stray_companions(run: Pass) -> None:
    """Delete owned companion objects whose predictor object is gone (a pass cut short between deletions)."""
    for resource, objects in run.companions.items():
        for child_name in sorted(objects.keys() - run.kept):
            try:
                await run.api.delete(resource, run.namespace, child_name)
            except ApiError as exc:
                run.failed = True
                run.events.append(Event("Warning", f"{resource.kind}Failed", str(exc)))
                continue
            run.events.append(Event("Normal", f"{resource.kind}Deleted", f"deleted {child_name}: its pool is gone"))


async def remove_other_backends(run: Pass) -> None:
    """Delete what the ClefDecision owns in the backends not chosen (after a switch of spec.backend). Only what a
    list positively returned is deleted; a resource that is not served holds nothing; a failed list is retried."""
    for other in BACKENDS:
        if other == run.backend:
            continue
        for resource in (PRIMARY[other], *COMPANIONS[other]):
            try:
                found = await run.api.list_labelled(resource, run.namespace, label_value(run.name)) or []
                for obj in found:
                    if not (owned_by(obj, run.uid) or orphaned(obj)) or obj["metadata"].get("deletionTimestamp"):
                        continue
                    await run.api.delete(resource, run.namespace, obj["metadata"]["name"])
                    run.events.append(
                        Event(
                            "Normal",
                            f"{resource.kind}Deleted",
                            f"deleted {obj['metadata']['name']}: the ClefDecision's backend is {run.backend}",
                        )
                    )
            except ApiError as exc:
                run.failed = True
                run.events.append(Event("Warning", f"{resource.kind}Failed", str(exc)))


async def _create_or_claim(
    run: Pass, resource: Resource, desired: Mapping[str, Any], pool: str
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Create a pool's object (its predictor object or a companion); when the create is refused (409) because this
    ClefDecision already controls an object of that name (its decision label was edited by hand, so the list by that
    label missed it), that object, for the caller's drift check to repair in place: the patch puts the label back,
    and the next pass lists it again. Returns (the created or claimed object, None), or (None, the holder) when the
    name is held by another owner's object or by this ClefDecision's own on its way out (None: gone meanwhile)."""
    name = desired["metadata"]["name"]
    try:
        created = await run.api.create(resource, desired)
    except ConflictError:
        holder = await run.api.get(resource, run.namespace, name)
        if holder is not None and _claimable(holder, run.uid):
            return holder, None
        return None, holder
    run.events.append(Event("Normal", f"{resource.kind}Created", f"created {name} for node pool {pool}"))
    return created, None


def _claimable(holder: Mapping[str, Any], uid: str) -> bool:
    """Whether the object holding a name whose create was refused (409) is ours to repair: this ClefDecision is its
    controller and it is not being deleted. The list by the decision label missed it because that label was edited
    by hand; the repair patch puts the label back."""
    return owned_by(holder, uid) and not holder["metadata"].get("deletionTimestamp")


async def _collision(
    run: Pass, decision: PoolDecision, isvc_name: str, holder: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The wanted name is held by an object this ClefDecision does not own, or by its own on its way out: say whose,
    and wait for it to go (tried again after a backoff per name, at once when the holder is deleted)."""
    run.conflicts.append(isvc_name)
    kind = run.primary.kind
    if holder is not None and owned_by(holder, run.uid):  # our own, being deleted: wait for it to go
        return run.pool_status(
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
            f"the {kind} name {isvc_name} is already used by ClefDecision {owner.get('name')} "
            "(rename one of the two ClefDecisions or pools)"
        )
    else:
        reason = NAME_TAKEN
        article = "an" if kind[0] in "AEIOU" else "a"
        message = f"{article} {kind} named {isvc_name} exists and is not owned by this ClefDecision"
    entry = run.pool_status(
        decision, state=CONFLICT, isvc_name=isvc_name, isvc=None, message=message, predictor_reason=reason
    )
    run.warn_once(decision.pool.key, entry, reason, f"node pool {decision.pool.name}: {message}")
    return entry


async def withdraw(run: Pass, decision: PoolDecision, current: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An ineligible pool: its predictor stays (Degraded) for the grace period, then goes.

    Returns the pool's status entry, or None for a pool that no longer exists in any form.
    """
    pool = decision.pool
    if current is None:
        return (
            None
            if not pool.nodes and decision.reason == NO_NODES
            else run.pool_status(decision, state=INELIGIBLE, isvc_name=None, isvc=None)
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
        error = await delete(run, pool.key, current, f"node pool {pool.name}: {why}")
        if error is not None:
            return run.pool_status(decision, state=FAILED, isvc_name=isvc_name, isvc=None, message=error)
        return None if not pool.nodes else run.pool_status(decision, state=INELIGIBLE, isvc_name=None, isvc=None)
    run.kept.add(isvc_name)
    run.requeue.append((removal - run.now).total_seconds())
    entry = run.pool_status(
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


async def delete(run: Pass, key: tuple[str, str], obj: Mapping[str, Any], why: str) -> str | None:
    """Delete one owned predictor object (its companions follow in remove_stray_companions); a refusal is
    reported as a Warning, returned, and retried later."""
    isvc_name = obj["metadata"]["name"]
    kind = run.primary.kind
    try:
        await run.api.delete(run.primary, run.namespace, isvc_name)
    except ApiError as exc:
        run.failed = True
        run.events.append(Event("Warning", f"{kind}Failed", f"node pool {key[1]}: {exc}"))
        return str(exc)
    run.events.append(Event("Normal", f"{kind}Deleted", f"deleted {isvc_name}: {why}"))
    return None
