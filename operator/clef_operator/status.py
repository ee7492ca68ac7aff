"""Pure builders of the ClefDecision's status: per-pool entries and the three conditions."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from clef_operator.constants import DEPLOYMENT_BACKEND, KSERVE_BACKEND
from clef_operator.deployment_backend import deployment_ready, service_url
from clef_operator.pools import PoolDecision

NODE_POOLS_ELIGIBLE = "NodePoolsEligible"
PREDICTORS_READY = "PredictorsReady"
READY = "Ready"
KSERVE_NOT_INSTALLED = "KServeNotInstalled"
INVALID_SPEC = "InvalidSpec"
POOL_FAILED = "PoolFailed"

# status.pools[].state: what the operator does about the pool.
SERVING = "Serving"  # eligible; its InferenceService exists and matches the spec
PENDING = "Pending"  # eligible, but InferenceServices cannot be created yet (KServe missing)
DEGRADED = "Degraded"  # not eligible right now; its InferenceService is kept until removalAt
INELIGIBLE = "Ineligible"  # not eligible; no InferenceService
FAILED = "Failed"  # a write refused for this pool, or the spec asks what its backend cannot do (predictorMessage)
CONFLICT = "Conflict"  # the InferenceService name is held by an object this ClefDecision does not own
POOL_STATES = (SERVING, PENDING, DEGRADED, INELIGIBLE, FAILED, CONFLICT)
"""Every status.pools[].state (the CRD's enum)."""
# status.pools[].predictorReason of a Conflict.
NAME_COLLISION = "NameCollision"  # held by another ClefDecision's InferenceService
NAME_TAKEN = "NameTaken"  # held by an InferenceService no ClefDecision owns


def format_time(moment: datetime.datetime) -> str:
    """A UTC time as Kubernetes writes it (RFC 3339, seconds, Z)."""
    return moment.astimezone(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_time(text: str | None) -> datetime.datetime | None:
    """The inverse of format_time (None for a missing or malformed value)."""
    try:
        return datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def inferenceservice_ready(isvc: Mapping[str, Any] | None) -> tuple[bool, str]:
    """Whether an InferenceService's Ready condition is True, and otherwise why not."""
    if isvc is None:
        return False, "not created yet"
    for condition in (isvc.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            if condition.get("status") == "True":
                return True, ""
            why = condition.get("message") or condition.get("reason") or f"Ready={condition.get('status')}"
            return False, str(why)
    return False, "no Ready condition yet"


# Per backend: the status.pools[] field naming a pool's serving object, and what the conditions call them.
CHILD_FIELD: dict[str, str] = {KSERVE_BACKEND: "inferenceService", DEPLOYMENT_BACKEND: "deployment"}
CHILD_NOUN: dict[str, str] = {KSERVE_BACKEND: "InferenceServices", DEPLOYMENT_BACKEND: "Deployments"}


def build_pool_status(
    decision: PoolDecision,
    *,
    state: str,
    isvc_name: str | None,
    isvc: Mapping[str, Any] | None,
    message: str | None = None,
    predictor_reason: str | None = None,
    degraded_since: str | None = None,
    removal_at: str | None = None,
    backend: str = KSERVE_BACKEND,
) -> dict[str, Any]:
    """One status.pools[] entry: eligibility with its reason, the GPU and release, and the predictor's state.

    ``isvc_name``/``isvc``: the pool's serving object, an InferenceService or (``backend`` deployment) a
    Deployment, whose readiness is KServe's Ready condition or the Deployment's available replicas.
    """
    entry: dict[str, Any] = {
        "name": decision.pool.name,
        "labelKey": decision.pool.label_key,
        "nodes": len(decision.pool.nodes),
        "eligible": decision.eligible,
        "reason": decision.reason,
        "message": decision.message,
        "state": state,
        "gpu": decision.gpu.as_status(),
        "ready": False,
    }
    if decision.variant is not None and decision.eligible:
        entry["variant"] = {"quantization": decision.variant.quantization, "storageUri": decision.variant.storageUri}
    if isvc_name is not None:
        entry[CHILD_FIELD[backend]] = isvc_name
    if degraded_since is not None:
        entry["degradedSince"] = degraded_since
    if removal_at is not None:
        entry["removalAt"] = removal_at
    if predictor_reason is not None:
        entry["predictorReason"] = predictor_reason
    if message is not None:
        entry["predictorMessage"] = message
        return entry
    if state not in (SERVING, DEGRADED):
        return entry
    if backend == DEPLOYMENT_BACKEND:
        ready, why = deployment_ready(None if isvc is None else dict(isvc))
        meta = (isvc or {}).get("metadata") or {}
        url = service_url(meta["name"], meta["namespace"]) if ready else None
    else:
        ready, why = inferenceservice_ready(isvc)
        url = ((isvc or {}).get("status") or {}).get("url")
    entry["ready"] = ready
    if not ready:
        entry["predictorMessage"] = why
    if url:
        entry["url"] = url
    return entry


def _condition(
    kind: str, status: str, reason: str, message: str, previous: Sequence[Mapping[str, Any]], now: str
) -> dict[str, Any]:
    before = next((c for c in previous if c.get("type") == kind), None)
    if before is not None and before.get("status") == status and before.get("lastTransitionTime"):
        since = before["lastTransitionTime"]  # unchanged: the transition is the earlier one
    else:
        since = now
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}


def _names(pools: Iterable[Mapping[str, Any]]) -> str:
    return ", ".join(str(pool["name"]) for pool in pools)


def build_status(
    *,
    generation: int | None,
    pools: list[dict[str, Any]],
    unpooled: Sequence[str] = (),
    label_key: str | None = None,
    other_pool_labels: Sequence[str] = (),
    kserve_installed: bool = True,
    invalid_spec: str | None = None,
    previous: Mapping[str, Any] | None = None,
    now: str,
    missing: Sequence[str] = (),
    backend: str | None = None,
) -> dict[str, Any]:
    """The whole status: pools, ready/total counts, conditions, observedGeneration.

    Ready is True only when at least one pool is eligible and every eligible pool's
    InferenceService reports Ready=True (every Deployment has its replicas available). ``lastTransitionTime``
    only moves when a condition flips. ``backend``: the one serving the pools (None: not chosen yet).
    """
    before = list((previous or {}).get("conditions") or [])
    eligible = [pool for pool in pools if pool["eligible"]]
    degraded = [pool for pool in pools if pool.get("state") == DEGRADED]
    ready = [pool for pool in eligible if pool["ready"]]
    if invalid_spec is not None:
        pools_cond = ("Unknown", INVALID_SPEC, "the spec does not validate")
        predictors_cond = ("Unknown", INVALID_SPEC, "the spec does not validate")
        ready_cond = ("False", INVALID_SPEC, invalid_spec)
    else:
        pools_cond = _pools_condition(pools, eligible, degraded, _unpooled_note(unpooled, label_key, other_pool_labels))
        if missing:  # named in spec.nodePools.include, found nowhere
            pools_cond = (
                pools_cond[0],
                pools_cond[1],
                f"{pools_cond[2]}; spec.nodePools.include names pools that no GPU node carries: {', '.join(missing)}",
            )
        predictors_cond = _predictors_condition(
            eligible, ready, kserve_installed, CHILD_NOUN[backend or KSERVE_BACKEND]
        )
        if pools_cond[0] == "True" and predictors_cond[0] == "True":
            ready_cond = ("True", READY, f"{len(ready)}/{len(eligible)} predictors ready")
        else:
            blocking = pools_cond if pools_cond[0] != "True" else predictors_cond
            ready_cond = ("False", blocking[1], blocking[2])
    status: dict[str, Any] = {
        "pools": pools,
        "readyPools": len(ready),
        "eligiblePools": len(eligible),
        "poolsReady": f"{len(ready)}/{len(eligible)}",
        "conditions": [
            _condition(NODE_POOLS_ELIGIBLE, *pools_cond, before, now),
            _condition(PREDICTORS_READY, *predictors_cond, before, now),
            _condition(READY, *ready_cond, before, now),
        ],
    }
    if backend is not None:
        status["backend"] = backend
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def _pools_condition(
    pools: Sequence[Mapping[str, Any]],
    eligible: Sequence[Mapping[str, Any]],
    degraded: Sequence[Mapping[str, Any]],
    unpooled_note: str,
) -> tuple[str, str, str]:
    held = "; ".join(
        f"{pool['name']} degraded ({pool['reason']}), kept until {pool.get('removalAt')}" for pool in degraded
    )
    if not eligible and degraded:
        return "False", "PoolsDegraded", held
    if not pools:
        return "False", "NoGPUNodePools", f"no GPU node pools found{unpooled_note}"
    ineligible = [pool for pool in pools if not pool["eligible"]]
    details = "; ".join(f"{pool['name']}: {pool['message']}" for pool in ineligible)
    if not eligible:
        return "False", "NoEligiblePools", f"none of {len(pools)} GPU node pools is eligible: {details}"
    message = f"{len(eligible)} of {len(pools)} GPU node pools eligible: {_names(eligible)}"
    if ineligible:
        message += f"; not eligible: {details}"
    if degraded:
        message += f"; {held}"
    return "True", "EligiblePoolsFound", message


def _unpooled_note(unpooled: Sequence[str], label_key: str | None, other_pool_labels: Sequence[str]) -> str:
    """What the NoGPUNodePools message says of the GPU nodes in no pool: the label they lack (the key
    spec.nodePools.labelKey names, when set) and the pool labels they carry instead."""
    if not unpooled:
        return ""
    nodes = ", ".join(unpooled)
    if label_key is None:
        return f" ({len(unpooled)} GPU nodes carry no pool label: {nodes})"
    note = f" ({len(unpooled)} GPU nodes carry no {label_key} label, the key spec.nodePools.labelKey names: {nodes}"
    if other_pool_labels:
        note += (
            f"; they carry {', '.join(other_pool_labels)}: set spec.nodePools.labelKey to that key, "
            f"or label the nodes with {label_key}"
        )
    return note + ")"


def _predictors_condition(
    eligible: Sequence[Mapping[str, Any]], ready: Sequence[Mapping[str, Any]], kserve_installed: bool, noun: str
) -> tuple[str, str, str]:
    if not kserve_installed:
        return (
            "False",
            KSERVE_NOT_INSTALLED,
            (
                "the InferenceService resource (serving.kserve.io/v1beta1) is not served by this cluster; "
                "install KServe (the operator retries with backoff) or set spec.backend: deployment"
            ),
        )
    if not eligible:
        return "False", "NoPredictors", f"no eligible node pool, so no {noun[:-1]}"
    failing = [pool for pool in eligible if pool.get("state") in (FAILED, CONFLICT)]
    if failing:
        details = "; ".join(f"{pool['name']}: {pool.get('predictorMessage', '')}" for pool in failing)
        reason = (
            POOL_FAILED
            if any(pool["state"] == FAILED for pool in failing)
            else str(failing[0].get("predictorReason", CONFLICT))
        )
        return "False", reason, f"{len(ready)}/{len(eligible)} {noun} ready; failing: {details}"
    if len(ready) == len(eligible):
        return "True", "AllPredictorsReady", f"{len(ready)}/{len(eligible)} {noun} ready"
    waiting = "; ".join(
        f"{pool.get('inferenceService') or pool.get('deployment')} ({pool.get('predictorMessage', 'not ready')})"
        for pool in eligible
        if not pool["ready"]
    )
    return "False", "PredictorsNotReady", f"{len(ready)}/{len(eligible)} {noun} ready; waiting for {waiting}"
