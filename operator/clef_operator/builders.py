"""Pure builders of the objects the operator writes: InferenceService names, bodies and patches.

KServe objects are plain dicts in the API's camelCase, ready to be sent as JSON.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from clef_contract.predictor import (
    COMPILE_CACHE_DIR,
    COMPILE_CACHE_ENV,
    COMPILE_CACHE_VOLUME,
    MODEL_DIR,
    PREDICTOR_GID,
    PREDICTOR_PORT,
)
from clef_operator.constants import (
    DECISION_LABEL,
    GPU_RESOURCE,
    KSERVE_API_VERSION,
    KSERVE_CONTAINER_NAME,
    KSERVE_DEPLOYMENT_MODE_ANNOTATION,
    MANAGED_BY,
    POOL_ANNOTATION,
    POOL_LABEL,
    SPEC_HASH_ANNOTATION,
)
from clef_operator.pools import NodePool
from clef_operator.spec import ClefDecisionSpec

# KServe names the predictor's Deployment/Service "<isvc>-predictor"; keep that within a 63-char label.
MAX_ISVC_NAME = 63 - len("-predictor")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
READINESS_PERIOD_SECONDS = 10


def inferenceservice_name(decision: str, pool: str) -> str:
    """``<decision>-<pool>`` as a DNS-1035 label of at most 53 chars (hash-suffixed when shortened)."""
    raw = f"{decision}-{pool}"
    name = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", raw.lower())).strip("-")
    if not name or not name[0].isalpha():
        name = f"c-{name}".rstrip("-")
    if name == raw and len(name) <= MAX_ISVC_NAME:
        return name
    digest = hashlib.sha256(f"{decision}/{pool}".encode()).hexdigest()[:8]
    return f"{name[: MAX_ISVC_NAME - len(digest) - 1].rstrip('-')}-{digest}"


def label_value(name: str) -> str:
    """A name as a label value (hashed when it is not a valid label value)."""
    if len(name) <= 63 and _LABEL_VALUE.match(name):
        return name
    return "h-" + hashlib.sha256(name.encode()).hexdigest()[:16]


def build_predictor_args(spec: ClefDecisionSpec, gpus: int) -> list[str]:
    """The predictor's command line: ``python -m predictor`` followed by these arguments."""
    return [
        "--model-dir", MODEL_DIR,
        "--model-name", spec.model.name,
        "--engine", "vllm",
        "--dp", str(gpus),
        "--max-model-len", str(spec.predictor.maxModelLen),
        "--http_port", str(PREDICTOR_PORT),
        *spec.predictor.extraArgs,
    ]


def build_resources(spec: ClefDecisionSpec, gpus: int) -> dict[str, dict[str, str | int]]:
    """The container's resources: the spec's requests/limits with ``nvidia.com/gpu`` set to ``gpus``."""
    requests = dict(spec.predictor.resources.get("requests", {}))
    limits = dict(spec.predictor.resources.get("limits", {}))
    requests[GPU_RESOURCE] = str(gpus)
    limits[GPU_RESOURCE] = str(gpus)
    return {"requests": requests, "limits": limits}


def build_probes(spec: ClefDecisionSpec) -> dict[str, dict[str, Any]]:
    """Startup and readiness probes on the model endpoint, which answers 200 only after warm-up."""
    http_get = {"path": f"/v1/models/{spec.model.name}", "port": PREDICTOR_PORT, "scheme": "HTTP"}
    budget = spec.predictor.startupProbe
    return {
        "startupProbe": {
            "httpGet": dict(http_get),
            "periodSeconds": budget.periodSeconds,
            "failureThreshold": budget.failureThreshold,
            "timeoutSeconds": 5,
        },
        "readinessProbe": {
            "httpGet": dict(http_get),
            "periodSeconds": READINESS_PERIOD_SECONDS,
            "failureThreshold": 3,
            "timeoutSeconds": 5,
        },
    }


def build_env(spec: ClefDecisionSpec) -> list[dict[str, str]]:
    """The container's environment: the model's storage URI and the compile-cache directories."""
    return [
        {"name": "STORAGE_URI", "value": spec.model.storageUri},
        *({"name": name, "value": value} for name, value in COMPILE_CACHE_ENV.items()),
    ]


def build_volumes(spec: ClefDecisionSpec) -> list[dict[str, Any]]:
    """The pod's volumes: a memory-backed /dev/shm and the compile cache (the spec's volume source)."""
    return [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.predictor.shmSize}},
        {"name": COMPILE_CACHE_VOLUME, **copy.deepcopy(spec.predictor.compileCache)},
    ]


def build_pod_security_context(spec: ClefDecisionSpec) -> dict[str, Any] | None:
    """The pod's securityContext: the predictor image's group as fsGroup, so the compile cache is writable.

    The kubelet gives the volumes it manages (emptyDir, claims whose volume plugin supports it; never
    hostPath) group ``PREDICTOR_GID`` with group write, and adds that group to every container's process.
    ``OnRootMismatch`` skips the recursive ownership change when the volume's root already matches, which
    keeps a large shared cache from being walked at every start. None in Knative mode: Knative Serving
    rejects a pod securityContext unless its ``kubernetes.podspec-securitycontext`` feature is enabled.
    """
    if spec.deploymentMode == "Knative":
        return None
    return {"fsGroup": PREDICTOR_GID, "fsGroupChangePolicy": "OnRootMismatch"}


def build_predictor_container(spec: ClefDecisionSpec, gpus: int) -> dict[str, Any]:
    """The predictor container (named as KServe expects, so its storage initializer fills /mnt/models)."""
    container: dict[str, Any] = {
        "name": KSERVE_CONTAINER_NAME,
        "image": spec.image(),
        "command": ["python", "-m", "predictor"],
        "args": build_predictor_args(spec, gpus),
        "env": build_env(spec),
        "ports": [{"containerPort": PREDICTOR_PORT, "name": "http", "protocol": "TCP"}],
        "resources": build_resources(spec, gpus),
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": COMPILE_CACHE_VOLUME, "mountPath": COMPILE_CACHE_DIR},
        ],
        **build_probes(spec),
    }
    if spec.predictor.imagePullPolicy:
        container["imagePullPolicy"] = spec.predictor.imagePullPolicy
    return container


def build_inferenceservice(
    *, decision: str, namespace: str, pool: NodePool, spec: ClefDecisionSpec
) -> dict[str, Any]:
    """The InferenceService serving the model on one pool (not yet adopted by its ClefDecision)."""
    gpus = spec.gpus_for(pool.name)
    replicas = spec.replicas_for(pool.name)
    body: dict[str, Any] = {
        "apiVersion": KSERVE_API_VERSION,
        "kind": "InferenceService",
        "metadata": {
            "name": inferenceservice_name(decision, pool.name),
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "clef-predictor",
                "app.kubernetes.io/instance": decision,
                "app.kubernetes.io/part-of": "clef-serving",
                "app.kubernetes.io/managed-by": MANAGED_BY,
                DECISION_LABEL: label_value(decision),
                POOL_LABEL: label_value(pool.name),
            },
            "annotations": {
                KSERVE_DEPLOYMENT_MODE_ANNOTATION: spec.deploymentMode,
                POOL_ANNOTATION: pool.name,
            },
        },
        "spec": {
            "predictor": {
                "minReplicas": replicas,
                "maxReplicas": replicas,
                "nodeSelector": {pool.label_key: pool.name},
                "tolerations": [dict(toleration) for toleration in spec.tolerations],
                "containers": [build_predictor_container(spec, gpus)],
                "volumes": build_volumes(spec),
            }
        },
    }
    if not body["spec"]["predictor"]["tolerations"]:
        del body["spec"]["predictor"]["tolerations"]
    security_context = build_pod_security_context(spec)
    if security_context is not None:
        body["spec"]["predictor"]["securityContext"] = security_context
    return body


def spec_hash(body: Mapping[str, Any]) -> str:
    """A short hash of what the operator manages in a child: spec, labels, annotations (minus the hash)."""
    metadata = body.get("metadata", {})
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k != SPEC_HASH_ANNOTATION}
    managed = {
        "spec": body.get("spec"),
        "labels": metadata.get("labels") or {},
        "annotations": annotations,
        "ownerReferences": metadata.get("ownerReferences") or [],
    }
    return hashlib.sha256(json.dumps(managed, sort_keys=True).encode()).hexdigest()[:16]


def stamp_spec_hash(body: dict[str, Any]) -> dict[str, Any]:
    """Record the body's spec hash in its annotations (in place) and return the body."""
    body["metadata"].setdefault("annotations", {})[SPEC_HASH_ANNOTATION] = spec_hash(body)
    return body


def build_update_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch turning ``current`` into ``desired`` for managed fields; guarded by resourceVersion.

    The whole ``spec`` is replaced (KServe's mutating webhook re-applies its defaults on update);
    labels and annotations are merged so that keys added by others survive.
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
        {"op": "add", "path": "/spec", "value": desired["spec"]},
    ]
    return ops
