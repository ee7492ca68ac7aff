"""The kserve backend: pure builders of a pool's InferenceService, and what every backend shares with it.

Shared with the deployment backend (``deployment_backend``, which runs the same pod without KServe): the serving
objects' names, labels and annotations, the predictor pod, and the drift check and update patch. Objects are plain
dicts in the API's camelCase, ready to be sent as JSON.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clef_contract.container import DEFAULT_REQUESTS, predictor_container, predictor_volumes
from clef_contract.predictor import PREDICTOR_GID, scrape_annotations
from clef_operator.constants import (
    DECISION_LABEL,
    GPU_COMPUTE_MAJOR_LABEL,
    GPU_COMPUTE_MINOR_LABEL,
    GPU_RESOURCE,
    KSERVE_API_VERSION,
    KSERVE_AUTOSCALER_ANNOTATION,
    KSERVE_DEPLOYMENT_MODE_ANNOTATION,
    MANAGED_BY,
    POOL_ANNOTATION,
    POOL_LABEL,
    POOL_LABEL_KEY_ANNOTATION,
    POOL_LABEL_KEYS,
    VARIANT_ANNOTATION,
)
from clef_operator.pools import NodePool
from clef_operator.spec import KSERVE_REFUSES_DEPLOYMENT_SCALING, ClefDecisionSpec, Variant

# KServe names the predictor's Deployment/Service "<isvc>-predictor"; keep that within a 63-char label.
MAX_ISVC_NAME = 63 - len("-predictor")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def inferenceservice_name(decision: str, pool: str, label_key: str | None = None) -> str:
    """``<decision>-<pool>`` as a DNS-1035 label of at most 53 chars (hash-suffixed when shortened).

    With ``label_key`` the name always carries a hash of (decision, label key, pool): the name of a pool whose
    name another label key already uses.
    """
    raw = f"{decision}-{pool}"
    name = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", raw.lower())).strip("-")
    if not name or not name[0].isalpha():
        name = f"c-{name}".rstrip("-")
    if label_key is None and name == raw and len(name) <= MAX_ISVC_NAME:
        return name
    identity = f"{decision}/{pool}" if label_key is None else f"{decision}/{label_key}/{pool}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
    return f"{name[: MAX_ISVC_NAME - len(digest) - 1].rstrip('-')}-{digest}"


def assign_names(
    decision: str, pools: list[tuple[str, str]], taken: Mapping[tuple[str, str], str], label_key: str | None
) -> dict[tuple[str, str], str]:
    """One InferenceService name per (label key, pool), unique within the ClefDecision.

    A pool keeps the name it already has (``taken``); a new pool gets ``<decision>-<pool>`` unless another
    label key's pool of the same name holds it, in which case its name carries a hash of its label key.
    Pools under the spec's labelKey, then the well-known keys in order, are named first.
    """
    names = {key: name for key, name in taken.items() if key in pools}
    used = set(names.values())
    for key in sorted(pools, key=lambda key: naming_order(key, label_key)):
        if key in names:
            continue
        plain = inferenceservice_name(decision, key[1])
        names[key] = plain if plain not in used else inferenceservice_name(decision, key[1], key[0])
        used.add(names[key])
    return names


def naming_order(key: tuple[str, str], label_key: str | None) -> tuple[int, str, str]:
    """The order in which assign_names names pools: the spec's labelKey, then the well-known keys in order."""
    rank = [label_key, *POOL_LABEL_KEYS] if label_key else list(POOL_LABEL_KEYS)
    return (rank.index(key[0]) if key[0] in rank else len(rank), key[0], key[1])


def possible_names(decision: str, key: tuple[str, str]) -> tuple[str, str]:
    """The two names assign_names may give the serving object of pool ``key`` (label key, pool)."""
    return inferenceservice_name(decision, key[1]), inferenceservice_name(decision, key[1], key[0])


def label_value(name: str) -> str:
    """A name as a label value (hashed when it is not a valid label value)."""
    if len(name) <= 63 and _LABEL_VALUE.match(name):
        return name
    return "h-" + hashlib.sha256(name.encode()).hexdigest()[:16]


def build_resources(spec: ClefDecisionSpec, gpus: int) -> dict[str, dict[str, str | int]]:
    """The container's resources: the spec's (default CPU/memory requests) with ``nvidia.com/gpu`` = ``gpus``.

    A CPU or memory request without a limit gets a limit equal to the request: KServe's defaulting webhook gives
    every container without a CPU or memory limit its configured default (1 CPU, 2Gi out of the box), which is
    below our requests, and the API server then refuses KServe's Deployment ("must be less than or equal to cpu
    limit").
    """
    requests = dict(spec.predictor.resources.get("requests") or DEFAULT_REQUESTS)
    limits = dict(spec.predictor.resources.get("limits", {}))
    for name in ("cpu", "memory"):
        if name in requests:
            limits.setdefault(name, requests[name])
    requests[GPU_RESOURCE] = str(gpus)
    limits[GPU_RESOURCE] = str(gpus)
    return {"requests": requests, "limits": limits}


# The pod's securityContext: the predictor image's group as fsGroup, so the compile cache is writable. The kubelet
# gives the volumes it manages (emptyDir, claims whose volume plugin supports it; never hostPath) group
# PREDICTOR_GID with group write, and adds that group to every container's process. OnRootMismatch skips the
# recursive ownership change when the volume's root already matches, which keeps a large shared cache from being
# walked at every start. Not in KServe's Knative mode: Knative Serving rejects a pod securityContext unless its
# kubernetes.podspec-securitycontext feature is enabled.
POD_SECURITY_CONTEXT: dict[str, Any] = {
    "fsGroup": PREDICTOR_GID,
    "fsGroupChangePolicy": "OnRootMismatch",
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def build_predictor_container(spec: ClefDecisionSpec, gpus: int, variant: Variant | None = None) -> dict[str, Any]:
    """The predictor container (the contract's), serving ``variant`` (default: the spec's best release)."""
    chosen = variant or spec.variants[0]
    container = predictor_container(
        image=spec.image(),
        model_name=spec.model.name,
        dp=str(gpus),
        max_model_len=str(spec.predictor.maxModelLen),
        resources=build_resources(spec, gpus),
        env=[
            {"name": "STORAGE_URI", "value": chosen.storageUri},
            *(var.model_dump(exclude_none=True) for var in spec.predictor.env),
        ],
        extra_args=spec.predictor.extraArgs,
        api_key_file=spec.predictor.apiKeySecret is not None,
        startup_period=spec.predictor.startupProbe.periodSeconds,
        startup_failures=spec.predictor.startupProbe.failureThreshold,
    )
    if spec.predictor.envFrom:
        container["envFrom"] = copy.deepcopy(spec.predictor.envFrom)
    if spec.predictor.imagePullPolicy:
        container["imagePullPolicy"] = spec.predictor.imagePullPolicy
    return container


def build_volumes(spec: ClefDecisionSpec) -> list[dict[str, Any]]:
    """The pod's volumes (the contract's), with the spec's compile-cache source and API-key Secret."""
    secret = spec.predictor.apiKeySecret
    return predictor_volumes(
        compile_cache=spec.predictor.compileCache,
        shm_size=spec.predictor.shmSize,
        api_key_secret=(secret.name, secret.key) if secret else None,
    )


def capability_affinity(min_capability: tuple[int, int]) -> dict[str, Any]:
    """Required node affinity: only nodes whose GPU Feature Discovery labels show ``min_capability`` or more."""
    major, minor = min_capability
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": GPU_COMPUTE_MAJOR_LABEL, "operator": "Gt", "values": [str(major)]}]},
                    {
                        "matchExpressions": [
                            {"key": GPU_COMPUTE_MAJOR_LABEL, "operator": "In", "values": [str(major)]},
                            {"key": GPU_COMPUTE_MINOR_LABEL, "operator": "Gt", "values": [str(minor - 1)]},
                        ]
                    },
                ]
            }
        }
    }


def build_affinity(spec: ClefDecisionSpec, variant: Variant | None, verified: bool) -> dict[str, Any]:
    """The spec's affinity plus the capability rule of the release served (none on an unverified pool)."""
    affinity = copy.deepcopy(spec.affinity)
    if verified and variant is not None:
        required = capability_affinity(variant.min_capability)["nodeAffinity"]
        affinity["nodeAffinity"] = {**affinity.get("nodeAffinity", {}), **required}
    return affinity


class UnsupportedOnBackendError(ValueError):
    """The spec asks for something the chosen backend does not do (the message says what and what to do)."""


def build_autoscaling(spec: ClefDecisionSpec, namespace: str, name: str) -> dict[str, Any]:
    """KServe's scaling fields: scaleMetric/scaleTarget, or a KEDA trigger on the predictor's own metric
    (UnsupportedOnBackendError for the deployment backend's podMetric and stabilization windows)."""
    scaling = spec.autoscaling
    if scaling is None:
        return {}
    if scaling.deployment_only:
        raise UnsupportedOnBackendError(KSERVE_REFUSES_DEPLOYMENT_SCALING)
    if scaling.keda is not None:
        keda = scaling.keda
        query = f'sum({keda.metric}{{namespace="{namespace}",pod=~"{name}-predictor-.*"}})'
        return {
            "autoScaling": {
                "metrics": [
                    {
                        "type": "External",
                        "external": {
                            "metric": {"backend": "prometheus", "serverAddress": keda.serverAddress, "query": query},
                            "target": {"type": "AverageValue", "averageValue": keda.target},
                        },
                    }
                ]
            }
        }
    fields: dict[str, Any] = {}
    if scaling.scaleMetric is not None:
        fields["scaleMetric"] = scaling.scaleMetric
    if scaling.scaleTarget is not None:
        fields["scaleTarget"] = scaling.scaleTarget
    return fields


# KServe's default rolling update (25 % surge) asks for a new pod's GPUs before an old pod frees its own: on a
# pool whose GPUs are all taken (a one-GPU node, a full pool) the new pod stays Pending and the rollout never
# ends. A rolling update without surge would need maxUnavailable >= 1, and KServe calls a predictor Ready when
# its Deployment is Available, which such a Deployment of one replica is with no pod ready (the ClefDecision
# would be Ready during the warm-up). Recreate needs no spare GPU and keeps Available = every replica ready.
REPLACE_WITHOUT_SURGE: dict[str, Any] = {"type": "Recreate"}


def predictor_labels(decision: str, pool: NodePool) -> dict[str, str]:
    """The labels of a pool's serving objects and of their pods."""
    return {
        "app.kubernetes.io/name": "clef-predictor",
        "app.kubernetes.io/instance": decision,
        "app.kubernetes.io/part-of": "clef-serving",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        DECISION_LABEL: label_value(decision),
        POOL_LABEL: label_value(pool.name),
    }


def pool_annotations(pool: NodePool, variant: Variant) -> dict[str, str]:
    """The annotations naming the pool (and its label key) and the release a serving object is for."""
    return {
        POOL_ANNOTATION: pool.name,
        POOL_LABEL_KEY_ANNOTATION: pool.label_key,
        VARIANT_ANNOTATION: variant.quantization,
    }


@dataclass(frozen=True)
class Placement:
    """What a backend builds one pool's predictor from, the same for every backend.

    ``variant``: the release served (None: the spec's best). ``verified``: the pool's capability is known (labelled
    or declared), so node affinity pins the pods to nodes that can run the release. ``name``: the serving object's
    name (None: ``<decision>-<pool>``).
    """

    decision: str  # the ClefDecision's name
    namespace: str
    pool: NodePool
    spec: ClefDecisionSpec
    variant: Variant | None = None
    verified: bool = True
    name: str | None = None

    @property
    def release(self) -> Variant:
        """The release served."""
        return self.variant or self.spec.variants[0]

    @property
    def object_name(self) -> str:
        """The name of the pool's serving object."""
        return self.name or inferenceservice_name(self.decision, self.pool.name)


def build_pod_spec(placement: Placement, *, security_context: bool) -> dict[str, Any]:
    """The predictor pod's fields, the same for every backend: the contract's container and volumes, pinned to
    the pool (and, when verified, to nodes able to run the release), with the spec's scheduling and identity.

    ``security_context``: add POD_SECURITY_CONTEXT.
    """
    spec, pool, variant = placement.spec, placement.pool, placement.release
    pod: dict[str, Any] = {
        "nodeSelector": {pool.label_key: pool.name},
        "containers": [build_predictor_container(spec, spec.gpus_for(pool.name), variant)],
        "volumes": build_volumes(spec),
    }
    affinity = build_affinity(spec, variant, placement.verified)
    if affinity:
        pod["affinity"] = affinity
    if spec.tolerations:
        pod["tolerations"] = [toleration.model_dump(exclude_none=True) for toleration in spec.tolerations]
    if spec.serviceAccountName:
        pod["serviceAccountName"] = spec.serviceAccountName
    if spec.imagePullSecrets:
        pod["imagePullSecrets"] = [secret.model_dump() for secret in spec.imagePullSecrets]
    if spec.priorityClassName:
        pod["priorityClassName"] = spec.priorityClassName
    if security_context:
        pod["securityContext"] = copy.deepcopy(POD_SECURITY_CONTEXT)
    return pod


def build_inferenceservice(placement: Placement) -> dict[str, Any]:
    """The InferenceService serving the placement's release on its pool (not yet adopted by its ClefDecision)."""
    decision, namespace, pool, spec = placement.decision, placement.namespace, placement.pool, placement.spec
    chosen = placement.release
    low, high = spec.replicas_for(pool.name)
    isvc_name = placement.object_name
    annotations = {
        KSERVE_DEPLOYMENT_MODE_ANNOTATION: spec.deploymentMode,
        **pool_annotations(pool, chosen),
    }
    if spec.autoscaling is not None and spec.autoscaling.keda is not None:
        annotations[KSERVE_AUTOSCALER_ANNOTATION] = "keda"
    labels = predictor_labels(decision, pool)
    predictor: dict[str, Any] = {
        "labels": dict(labels),  # on the pods too: the chart's NetworkPolicy selects them by name
        "annotations": scrape_annotations(),  # on the pods: Prometheus scrapes them
        "minReplicas": low,
        "maxReplicas": high,
        **build_autoscaling(spec, namespace, isvc_name),
        **build_pod_spec(placement, security_context=spec.deploymentMode != "Knative"),
    }
    if spec.deploymentMode == "Standard":
        predictor["deploymentStrategy"] = REPLACE_WITHOUT_SURGE
    return {
        "apiVersion": KSERVE_API_VERSION,
        "kind": "InferenceService",
        "metadata": {
            "name": isvc_name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"predictor": predictor},
    }


def covers(live: Any, desired: Any) -> bool:
    """Whether ``live`` holds everything ``desired`` says: equal scalars, lists of the same length whose items
    cover, and mappings with every desired key covered (keys others add, such as KServe's defaults, are fine)."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            key in live and covers(live[key], value) for key, value in desired.items()
        )
    if isinstance(desired, list):
        return isinstance(live, list) and len(live) == len(desired) and all(map(covers, live, desired))
    return bool(live == desired)


def drifted(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the live object differs from the desired one in a field the operator manages."""
    meta, want = current.get("metadata") or {}, desired["metadata"]
    return not (
        covers(current.get("spec"), desired["spec"])
        and covers(meta.get("labels") or {}, want.get("labels", {}))
        and covers(meta.get("annotations") or {}, want.get("annotations", {}))
        and covers(meta.get("ownerReferences") or [], want.get("ownerReferences", []))
    )


def build_update_patch(
    current: Mapping[str, Any], desired: Mapping[str, Any], *, whole_spec: bool = True
) -> list[dict[str, Any]]:
    """A JSON patch turning ``current`` into ``desired`` for managed fields; guarded by resourceVersion.

    ``whole_spec``: the whole ``spec`` is replaced (KServe's mutating webhook re-applies its defaults on
    update); otherwise each top-level key of the desired spec is, so that fields the operator leaves to others
    keep their values (a Deployment's replicas under an autoscaler, a Service's cluster IP). Labels and
    annotations are merged so that keys added by others survive.
    """
    meta = current.get("metadata", {})
    labels = {**(meta.get("labels") or {}), **desired["metadata"].get("labels", {})}
    annotations = {**(meta.get("annotations") or {}), **desired["metadata"].get("annotations", {})}
    ops: list[dict[str, Any]] = []
    if meta.get("resourceVersion"):
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]})
    ops += [
        {"op": "add", "path": "/metadata/labels", "value": labels},
        {"op": "add", "path": "/metadata/annotations", "value": annotations},
        {"op": "add", "path": "/metadata/ownerReferences", "value": desired["metadata"].get("ownerReferences", [])},
    ]
    if whole_spec:
        ops.append({"op": "add", "path": "/spec", "value": desired["spec"]})
    else:
        ops += [{"op": "add", "path": f"/spec/{key}", "value": value} for key, value in desired["spec"].items()]
    return ops
