"""Pure builders of the deployment backend's objects: a Deployment, a Service and, when autoscaling asks for it, a
HorizontalPodAutoscaler (on cpu or memory, or with ``autoscaling.podMetric`` on the predictor's own gauge per pod;
or, with ``autoscaling.keda``, a KEDA ScaledObject) per eligible pool, for clusters without KServe.

The pod is the InferenceService's (``kserve_backend.build_pod_spec``: the contract's one predictor container, its
volumes, the pool's node selector and capability affinity). What KServe adds to an InferenceService's pod is
done here instead: the release is put at ``/mnt/models`` (a ``pvc://`` claim mounted read-only; ``hf://``,
``s3://`` and ``gs://`` fetched by KServe's storage-initializer image as an init container), the Service
in front of the pods, and the autoscaler.
"""

from __future__ import annotations

import copy
from typing import Any

from kubernetes.utils import parse_quantity

from clef_contract.container import CONTAINER_NAME, container_security_context
from clef_contract.predictor import MODEL_DIR, scrape_annotations
from clef_operator.constants import DECISION_LABEL, PREDICTOR_LABEL
from clef_operator.kserve_backend import (
    REPLACE_WITHOUT_SURGE,
    Placement,
    UnsupportedOnBackendError,
    build_pod_spec,
    pool_annotations,
    predictor_labels,
)
from clef_operator.pools import NodePool
from clef_operator.resources import DEPLOYMENTS, HORIZONTAL_POD_AUTOSCALERS, SCALED_OBJECTS, SERVICES
from clef_operator.spec import (
    DEFAULT_SCALE_DOWN_WINDOW_S,
    DEFAULT_SCALE_UP_WINDOW_S,
    Autoscaling,
    ClefDecisionSpec,
    Keda,
    Variant,
)

# KServe's storage initializer, the image that fetches hf://, s3:// and gs:// releases for KServe's own pods.
DEFAULT_STORAGE_INITIALIZER_IMAGE = "kserve/storage-initializer:v0.20.0"
STORAGE_INITIALIZER = "storage-initializer"
MODEL_VOLUME = "model"
SERVICE_PORT = 80  # the port of KServe's own predictor Services
DEFAULT_UTILIZATION = 80  # percent: KServe's default target for its HorizontalPodAutoscalers
FETCHED_SCHEMES = ("hf://", "s3://", "gs://")


def autoscaled(spec: ClefDecisionSpec, pool: NodePool) -> bool:
    """Whether the pool's replicas move between a minimum and a maximum (so an autoscaler owns them)."""
    low, high = spec.replicas_for(pool.name)
    return low != high


def model_source(
    variant: Variant, storage_initializer_image: str
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The release at /mnt/models: (pod volume, the predictor's mount, init containers)."""
    uri = variant.storageUri
    if uri.startswith("pvc://"):
        claim, _, sub_path = uri.removeprefix("pvc://").partition("/")
        volume = {"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        mount = {"name": MODEL_VOLUME, "mountPath": MODEL_DIR, "readOnly": True}
        if sub_path.strip("/"):
            mount["subPath"] = sub_path.strip("/")
        return volume, mount, []
    if not uri.startswith(FETCHED_SCHEMES):
        raise UnsupportedOnBackendError(
            f"{uri.split('://', 1)[0]}:// releases are mounted by KServe (its modelcar): use spec.backend: kserve, "
            "or a pvc://, hf://, s3:// or gs:// release with the deployment backend"
        )
    fetcher = {
        "name": STORAGE_INITIALIZER,
        "image": storage_initializer_image,
        "args": [uri, MODEL_DIR],
        "volumeMounts": [{"name": MODEL_VOLUME, "mountPath": MODEL_DIR}],
        "securityContext": container_security_context(read_only_root=False),
    }
    return (
        {"name": MODEL_VOLUME, "emptyDir": {}},
        {"name": MODEL_VOLUME, "mountPath": MODEL_DIR, "readOnly": True},
        [fetcher],
    )


def _metadata(name: str, namespace: str, decision: str, pool: NodePool, variant: Variant) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": predictor_labels(decision, pool),
        "annotations": pool_annotations(pool, variant),
    }


def build_deployment(
    placement: Placement, storage_initializer_image: str = DEFAULT_STORAGE_INITIALIZER_IMAGE
) -> dict[str, Any]:
    """The Deployment running the pool's predictor pods (``replicas`` left to the autoscaler when autoscaled)."""
    decision, namespace, pool, spec = placement.decision, placement.namespace, placement.pool, placement.spec
    chosen = placement.release
    deployment_name = placement.object_name
    volume, mount, init_containers = model_source(chosen, storage_initializer_image)
    if init_containers and spec.predictor.envFrom:
        init_containers[0]["envFrom"] = copy.deepcopy(spec.predictor.envFrom)  # e.g. the bucket's credentials
    pod = build_pod_spec(placement, security_context=True)
    (container,) = (c for c in pod["containers"] if c["name"] == CONTAINER_NAME)
    container["volumeMounts"].append(mount)
    pod["volumes"].append(volume)
    if init_containers:
        pod["initContainers"] = init_containers
    selector = {DECISION_LABEL: predictor_labels(decision, pool)[DECISION_LABEL], PREDICTOR_LABEL: deployment_name}
    deployment_spec: dict[str, Any] = {
        "selector": {"matchLabels": selector},
        "strategy": copy.deepcopy(REPLACE_WITHOUT_SURGE),
        "template": {
            "metadata": {
                "labels": {**predictor_labels(decision, pool), **selector},
                "annotations": scrape_annotations(),
            },
            "spec": pod,
        },
    }
    if not autoscaled(spec, pool):
        deployment_spec["replicas"] = spec.replicas_for(pool.name)[0]
    return {
        "apiVersion": DEPLOYMENTS.api_version,
        "kind": DEPLOYMENTS.kind,
        "metadata": _metadata(deployment_name, namespace, decision, pool, chosen),
        "spec": deployment_spec,
    }


def build_service(deployment: dict[str, Any]) -> dict[str, Any]:
    """The Service in front of a Deployment's predictor pods: port 80 to the container's ``http`` port."""
    return {
        "apiVersion": SERVICES.api_version,
        "kind": SERVICES.kind,
        "metadata": copy.deepcopy(deployment["metadata"]),
        "spec": {
            "selector": dict(deployment["spec"]["selector"]["matchLabels"]),
            "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_autoscaler(spec: ClefDecisionSpec, pool: NodePool, deployment: dict[str, Any]) -> dict[str, Any] | None:
    """The autoscaler of an autoscaled pool's Deployment (None for a fixed replica count): a KEDA ScaledObject
    with ``autoscaling.keda``, else a HorizontalPodAutoscaler.

    The HorizontalPodAutoscaler scales on the predictor's own gauge per pod with ``autoscaling.podMetric`` (a
    ``Pods`` metric, read through the custom metrics API), else on the pods' CPU or memory utilization
    (``scaleMetric``, default cpu) toward ``scaleTarget`` percent (default 80), as KServe's Standard mode does.
    Either autoscaler gets the spec's stabilization windows (:func:`build_behavior`).
    """
    if not autoscaled(spec, pool):
        return None
    scaling = spec.autoscaling
    low, high = spec.replicas_for(pool.name)
    if scaling is not None and scaling.keda is not None:
        if low < 1:
            raise UnsupportedOnBackendError(
                "autoscaling.keda scales on the predictor's own metrics, which no pod reports at 0 replicas: "
                "set minReplicas to 1 or more"
            )
        return build_scaled_object(scaling.keda, low, high, deployment, build_behavior(scaling))
    if scaling is not None and scaling.podMetric is not None:
        if low < 1:
            raise UnsupportedOnBackendError(
                "autoscaling.podMetric scales on the predictor's own metric, which no pod reports at 0 replicas: "
                "set minReplicas to 1 or more"
            )
        metric: dict[str, Any] = {
            "type": "Pods",
            "pods": {
                "metric": {"name": scaling.podMetric.name},
                "target": {"type": "AverageValue", "averageValue": scaling.podMetric.target},
            },
        }
    else:
        resource = (scaling.scaleMetric if scaling else None) or "cpu"
        if resource not in ("cpu", "memory"):
            raise UnsupportedOnBackendError(
                f"scaleMetric {resource} needs Knative (the kserve backend in Knative mode); the deployment "
                "backend's HorizontalPodAutoscaler scales on cpu or memory, with autoscaling.podMetric on the "
                "predictor's own metric, or with autoscaling.keda through KEDA"
            )
        if low < 1:
            raise UnsupportedOnBackendError(
                "the deployment backend's HorizontalPodAutoscaler keeps at least 1 replica: set minReplicas to 1 "
                "or more"
            )
        target = (scaling.scaleTarget if scaling else None) or DEFAULT_UTILIZATION
        metric = {
            "type": "Resource",
            "resource": {"name": resource, "target": {"type": "Utilization", "averageUtilization": target}},
        }
    return {
        "apiVersion": HORIZONTAL_POD_AUTOSCALERS.api_version,
        "kind": HORIZONTAL_POD_AUTOSCALERS.kind,
        "metadata": copy.deepcopy(deployment["metadata"]),
        "spec": {
            "scaleTargetRef": _scale_target(deployment),
            "minReplicas": low,
            "maxReplicas": high,
            "metrics": [metric],
            "behavior": build_behavior(scaling),
        },
    }


def build_behavior(scaling: Autoscaling | None) -> dict[str, Any]:
    """The autoscaling/v2 ``behavior``: the spec's stabilization windows (else the defaults for a model that
    takes about a minute to warm up: 60 s up, 600 s down), the HorizontalPodAutoscaler's own policies."""
    up = scaling.scaleUpStabilizationSeconds if scaling else None
    down = scaling.scaleDownStabilizationSeconds if scaling else None
    return {
        "scaleUp": {"stabilizationWindowSeconds": DEFAULT_SCALE_UP_WINDOW_S if up is None else up},
        "scaleDown": {"stabilizationWindowSeconds": DEFAULT_SCALE_DOWN_WINDOW_S if down is None else down},
    }


def _scale_target(deployment: dict[str, Any]) -> dict[str, str]:
    return {"apiVersion": DEPLOYMENTS.api_version, "kind": DEPLOYMENTS.kind, "name": deployment["metadata"]["name"]}


def deployment_pods_query(metric: str, namespace: str, deployment_name: str) -> str:
    """PromQL: the sum of ``metric`` over the Deployment's pods, whose names are ``<deployment>-<template
    hash>-<suffix>`` (two dash-free parts, so another pool's Deployment named ``<deployment>-<more>`` never
    matches)."""
    return f'sum({metric}{{namespace="{namespace}",pod=~"{deployment_name}-[a-z0-9]+-[a-z0-9]+"}})'


def build_scaled_object(
    keda: Keda, low: int, high: int, deployment: dict[str, Any], behavior: dict[str, Any]
) -> dict[str, Any]:
    """The KEDA ScaledObject of a Deployment: one Prometheus trigger on the sum of the predictor's own gauge over
    its pods, KEDA keeping that sum per replica near ``keda.target`` (the AverageValue metric type, the target
    type the kserve backend gives KServe for the same trigger); ``behavior`` goes to the HorizontalPodAutoscaler
    KEDA makes."""
    meta = deployment["metadata"]
    threshold = format(parse_quantity(keda.target).normalize(), "f")  # KEDA reads a plain decimal
    return {
        "apiVersion": SCALED_OBJECTS.api_version,
        "kind": SCALED_OBJECTS.kind,
        "metadata": copy.deepcopy(meta),
        "spec": {
            "scaleTargetRef": _scale_target(deployment),
            "minReplicaCount": low,
            "maxReplicaCount": high,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior}},
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": keda.serverAddress,
                        "query": deployment_pods_query(keda.metric, meta["namespace"], meta["name"]),
                        "threshold": threshold,
                    },
                }
            ],
        },
    }


def deployment_ready(deployment: dict[str, Any] | None) -> tuple[bool, str]:
    """Whether a Deployment has rolled out its current spec with every wanted replica available, else why not."""
    if deployment is None:
        return False, "not created yet"
    meta, status = deployment.get("metadata") or {}, deployment.get("status") or {}
    if status.get("observedGeneration", 0) < meta.get("generation", 0):
        return False, "the Deployment controller has not seen the current spec yet"
    wanted = (deployment.get("spec") or {}).get("replicas", 1)
    updated = status.get("updatedReplicas", 0)
    if updated < wanted:
        return False, f"rolling out: {updated}/{wanted} replicas run the current spec"
    available = status.get("availableReplicas", 0)
    if available < wanted:
        return False, f"{available}/{wanted} replicas available"
    return True, ""


def service_url(name: str, namespace: str) -> str:
    """The in-cluster URL of a pool's Service."""
    return f"http://{name}.{namespace}.svc"
