"""One level-triggered, idempotent reconciliation of a ClefDecision.

Reads the GPU nodes and the serving objects the ClefDecision owns, creates, repairs and (after the removal
grace period) deletes them so that every eligible pool has exactly one predictor, and returns the status to
write, the events to post and when to look again. A pool's predictor is a KServe InferenceService (backend
``kserve``) or a Deployment with its Service and, when autoscaled, its HorizontalPodAutoscaler or KEDA
ScaledObject (backend ``deployment``); the objects of the backend not chosen are deleted once the choice is
certain. The backends' builders decide what the objects look like; this module only compares and calls. A failure
on one pool is recorded on that pool; the others still converge.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clef_operator.constants import (
    API_VERSION,
    AUTO_BACKEND,
    BACKENDS,
    DEPLOYMENT_BACKEND,
    KIND,
    KSERVE_BACKEND,
    POOL_ANNOTATION,
    POOL_LABEL_KEY_ANNOTATION,
)
from clef_operator.deployment_backend import (
    DEFAULT_STORAGE_INITIALIZER_IMAGE,
    UnsupportedOnBackendError,
    build_autoscaler,
    build_deployment,
    build_service,
)
from clef_operator.kserve_backend import (
    assign_names,
    build_inferenceservice,
    build_update_patch,
    drifted,
    label_value,
    naming_order,
    possible_names,
)
from clef_operator.kube import ApiError, ConflictError, KubeApi
from clef_operator.pools import (
    CHOSEN_BY_SPEC,
    NO_NODES,
    GpuInfo,
    GpuNode,
    NodePool,
    PoolDecision,
    evaluate_pool,
    group_into_pools,
    pool_labels_carried,
)
from clef_operator.resources import (
    DEPLOYMENTS,
    HORIZONTAL_POD_AUTOSCALERS,
    INFERENCESERVICES,
    SCALED_OBJECTS,
    SERVICES,
    Resource,
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
# Each backend's object per pool, and the objects that go with it (same name, same owner).
PRIMARY: dict[str, Resource] = {KSERVE_BACKEND: INFERENCESERVICES, DEPLOYMENT_BACKEND: DEPLOYMENTS}
COMPANIONS: dict[str, tuple[Resource, ...]] = {
    KSERVE_BACKEND: (),
    DEPLOYMENT_BACKEND: (SERVICES, HORIZONTAL_POD_AUTOSCALERS, SCALED_OBJECTS),
}
# The largest serving object the operator sends: etcd stores objects up to 1.5 MiB, and KServe adds its
# defaults and status to what the operator writes.
MAX_INFERENCESERVICE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Policy:
    """What the operator's own command line allows every ClefDecision."""

    host_path_prefixes: tuple[str, ...] = ()
    default_backend: str = AUTO_BACKEND  # for ClefDecisions without spec.backend
    storage_initializer_image: str = DEFAULT_STORAGE_INITIALIZER_IMAGE  # the deployment backend's release fetcher


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
    conflicts: list[str] = field(default_factory=list)  # serving-object names held by others


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether the ClefDecision of ``uid`` is the object's controller: the one mark of ownership (its labels and
    annotations are copies that a hand edit may change, and that the repair patch puts back)."""
    return any(
        ref.get("uid") == uid and ref.get("controller") is True
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or []
    )


def _orphaned(obj: Mapping[str, Any]) -> bool:
    """Labelled as this ClefDecision's (it was listed by that label) but without any owner: its owner
    reference was stripped. Adopted back by the repair patch, so that it never outlives the ClefDecision."""
    return not (obj.get("metadata") or {}).get("ownerReferences")


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
    backend: str = KSERVE_BACKEND
    policy: Policy = field(default_factory=lambda: Policy())
    held: frozenset[str] = frozenset()
    # The chosen backend's companion objects owned by the ClefDecision, by resource and name.
    companions: dict[Resource, dict[str, dict[str, Any]]] = field(default_factory=dict)
    kept: set[str] = field(default_factory=set)  # names of the pools' primary objects that stay
    events: list[Event] = field(default_factory=list)
    requeue: list[float] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    failed: bool = False
    keda_served: bool | None = None  # whether the API server serves KEDA's ScaledObjects (asked once, when needed)

    def warn_once(self, key: tuple[str, str], entry: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning event, unless the previous status already reported the same message for the pool."""
        if (self.previous.get(key) or {}).get("predictorMessage") != entry.get("predictorMessage"):
            self.events.append(Event("Warning", reason, message))

    @property
    def primary(self) -> Resource:
        """The resource of each pool's predictor object in the chosen backend."""
        return PRIMARY[self.backend]

    def pool_status(self, decision: PoolDecision, **fields: Any) -> dict[str, Any]:
        """build_pool_status for this pass's backend."""
        return build_pool_status(decision, backend=self.backend, **fields)


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
    policy: Policy = Policy(),
    now: datetime.datetime | None = None,
    held: frozenset[str] = frozenset(),
) -> Outcome:
    """Bring the ClefDecision's serving objects in line with its spec and the cluster's GPU pools.

    ``held``: names found taken by another owner whose backoff is still running; a pool that wants one keeps
    its Conflict entry without a create attempt. Raises ApiError when the backend cannot be told yet.
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
        status = build_status(
            generation=generation,
            pools=[],
            invalid_spec=str(exc),
            previous=previous,
            now=stamp,
            backend=previous.get("backend"),
        )
        return Outcome(status=status, events=_transition_events(previous, status), invalid_spec=str(exc))

    backend = await resolve_backend(spec, policy, previous, api)
    gpu_nodes = list(nodes)
    pools, unpooled = group_into_pools(gpu_nodes, spec.nodePools.labelKey, spec.nodePools.declared)
    unpooled_names = frozenset(unpooled)
    other_pool_labels = (
        pool_labels_carried(node for node in gpu_nodes if node.name in unpooled_names)
        if spec.nodePools.labelKey is not None
        else []
    )
    decisions = {pool.key: evaluate_pool(pool, spec) for pool in pools}
    listed = await api.list_labelled(PRIMARY[backend], namespace, label_value(name))
    if listed is None and backend == KSERVE_BACKEND:
        waiting = [
            build_pool_status(d, state=PENDING if d.eligible else INELIGIBLE, isvc_name=None, isvc=None)
            for d in decisions.values()
        ]
        status = build_status(
            generation=generation,
            pools=waiting,
            unpooled=unpooled,
            label_key=spec.nodePools.labelKey,
            other_pool_labels=other_pool_labels,
            kserve_installed=False,
            previous=previous,
            now=stamp,
            backend=backend,
        )
        return Outcome(status=status, events=_transition_events(previous, status), kserve_missing=True)
    if listed is None:
        raise ApiError(f"listing {PRIMARY[backend].plural}", 404, "the resource is not served")

    fitting: dict[str, list[tuple[str, str]]] = {}
    for known in sorted(decisions):
        for candidate in dict.fromkeys(possible_names(name, known)):
            fitting.setdefault(candidate, []).append(known)
    owned: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for obj in listed:
        if not (_owned_by(obj, uid) or _orphaned(obj)):
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
    run = _Pass(
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
            obj["metadata"]["name"]: obj for obj in found if _owned_by(obj, uid) or _orphaned(obj)
        }

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
    await _remove_stray_companions(run)
    await _remove_other_backends(run)

    present = {pool.name for pool in pools}
    missing = [pool for pool in spec.nodePools.include if pool not in present]
    status = build_status(
        generation=generation,
        pools=entries,
        unpooled=unpooled,
        label_key=spec.nodePools.labelKey,
        other_pool_labels=other_pool_labels,
        previous=previous,
        now=stamp,
        missing=missing,
        backend=backend,
    )
    events = _transition_events(previous, status) + run.events
    return Outcome(
        status=status,
        events=events,
        failed=run.failed,
        conflicts=run.conflicts,
        requeue_after=min(run.requeue) if run.requeue else None,
    )


def _build(run: _Pass, decision: PoolDecision, child_name: str) -> list[dict[str, Any]]:
    """The pool's objects in the chosen backend, its predictor object first (UnsupportedOnBackendError when the
    spec asks what the backend cannot do)."""
    options: dict[str, Any] = {
        "decision": run.name,
        "namespace": run.namespace,
        "pool": decision.pool,
        "spec": run.spec,
        "variant": decision.variant,
        "verified": decision.gpu.capability is not None,
        "name": child_name,
    }
    if run.backend == KSERVE_BACKEND:
        return [build_inferenceservice(**options)]
    deployment = build_deployment(**options, storage_initializer_image=run.policy.storage_initializer_image)
    autoscaler = build_autoscaler(run.spec, decision.pool, deployment)
    return [deployment, build_service(deployment), *([autoscaler] if autoscaler is not None else [])]


async def _serve(
    run: _Pass, decision: PoolDecision, child_name: str, current: Mapping[str, Any] | None
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


async def _keda_served(run: _Pass) -> bool:
    """Whether KEDA's ScaledObject resource is served (API discovery, asked once per pass; ApiError when it
    cannot be told now, so that nothing is created or deleted on a guess)."""
    if run.keda_served is None:
        run.keda_served = await run.api.served(SCALED_OBJECTS)
    return run.keda_served


async def _apply_companions(run: _Pass, pool: str, child_name: str, companions: list[dict[str, Any]]) -> None:
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
                    if holder is not None and _owned_by(holder, run.uid)
                    else "exists and is not this ClefDecision's"
                )
                raise ApiError(f"creating {resource.kind} {child_name}", 409, f"one of that name {whose}")
        if drifted(live, desired):
            await run.api.patch(
                resource, run.namespace, child_name, build_update_patch(live, desired, whole_spec=False)
            )
            run.events.append(Event("Normal", f"{resource.kind}Updated", f"updated {child_name} for node pool {pool}"))


async def _remove_stray_companions(run: _Pass) -> None:
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


async def _remove_other_backends(run: _Pass) -> None:
    """Delete what the ClefDecision owns in the backends not chosen (after a switch of spec.backend). Only what a
    list positively returned is deleted; a resource that is not served holds nothing; a failed list is retried."""
    for other in BACKENDS:
        if other == run.backend:
            continue
        for resource in (PRIMARY[other], *COMPANIONS[other]):
            try:
                found = await run.api.list_labelled(resource, run.namespace, label_value(run.name)) or []
                for obj in found:
                    if not (_owned_by(obj, run.uid) or _orphaned(obj)) or obj["metadata"].get("deletionTimestamp"):
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
    run: _Pass, resource: Resource, desired: Mapping[str, Any], pool: str
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
    return _owned_by(holder, uid) and not holder["metadata"].get("deletionTimestamp")


async def _collision(
    run: _Pass, decision: PoolDecision, isvc_name: str, holder: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The wanted name is held by an object this ClefDecision does not own, or by its own on its way out: say whose,
    and wait for it to go (tried again after a backoff per name, at once when the holder is deleted)."""
    run.conflicts.append(isvc_name)
    kind = run.primary.kind
    if holder is not None and _owned_by(holder, run.uid):  # our own, being deleted: wait for it to go
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


async def _withdraw(run: _Pass, decision: PoolDecision, current: Mapping[str, Any] | None) -> dict[str, Any] | None:
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
        error = await _delete(run, pool.key, current, f"node pool {pool.name}: {why}")
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


async def _delete(run: _Pass, key: tuple[str, str], obj: Mapping[str, Any], why: str) -> str | None:
    """Delete one owned predictor object (its companions follow in _remove_stray_companions); a refusal is
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
