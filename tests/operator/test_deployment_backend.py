"""The deployment backend's pure builders: the InferenceService's pod in a Deployment, its Service and autoscaler
(a HorizontalPodAutoscaler or a KEDA ScaledObject), the release at /mnt/models without KServe, readiness from the
Deployment's status, and what only KServe does; and a reconciliation's KEDA discovery."""

from __future__ import annotations

import re
from typing import Any

import pytest

from clef_contract.predictor import MODEL_DIR
from clef_operator import deployment_backend as w
from clef_operator.constants import DECISION_LABEL, PREDICTOR_LABEL
from clef_operator.kserve_backend import Placement, build_inferenceservice, build_update_patch
from clef_operator.kube import ApiError
from clef_operator.pass_state import Policy
from clef_operator.pools import GpuNode, NodePool
from clef_operator.reconcile import reconcile, resolve_backend
from clef_operator.resources import SCALED_OBJECTS, Resource
from clef_operator.spec import InvalidSpecError, parse_spec

POOL = NodePool("h100-pool", "cloud.google.com/gke-nodepool", ())


def _spec(uri: str = "hf://cloudflare/clef-flash-fp8", **extra: Any) -> Any:
    return parse_spec({"model": {"storageUri": uri, "name": "clef-flash"}, **extra})


def _deployment(spec: Any, name: str | None = None, **options: Any) -> dict[str, Any]:
    return w.build_deployment(Placement(decision="clef", namespace="ml", pool=POOL, spec=spec, name=name), **options)


def test_the_pod_is_the_inferenceservices_plus_the_release_kserve_would_mount() -> None:
    spec = _spec(
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        priorityClassName="serving",
        predictor={"envFrom": [{"secretRef": {"name": "hf-token"}}]},
    )
    isvc = build_inferenceservice(Placement(decision="clef", namespace="ml", pool=POOL, spec=spec))
    predictor = isvc["spec"]["predictor"]
    deployment = _deployment(spec, storage_initializer_image="registry.local/fetch:1")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (isvc_container,) = predictor["containers"]
    model_mount = {"name": w.MODEL_VOLUME, "mountPath": MODEL_DIR, "readOnly": True}
    assert container == {**isvc_container, "volumeMounts": [*isvc_container["volumeMounts"], model_mount]}
    for field in ("nodeSelector", "affinity", "tolerations", "priorityClassName", "securityContext"):
        assert pod[field] == predictor[field], field
    assert pod["volumes"] == [*predictor["volumes"], {"name": w.MODEL_VOLUME, "emptyDir": {}}]
    (fetcher,) = pod["initContainers"]
    assert fetcher["image"] == "registry.local/fetch:1"
    assert fetcher["args"] == ["hf://cloudflare/clef-flash-fp8", MODEL_DIR]
    assert fetcher["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # no surge pod waiting for a GPU
    assert deployment["spec"]["replicas"] == 1


def test_a_pvc_release_is_mounted_read_only_without_a_fetcher() -> None:
    pod = _deployment(_spec("pvc://clef-models/releases/clef-flash-fp8/"))["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert pod["volumes"][-1] == {
        "name": w.MODEL_VOLUME,
        "persistentVolumeClaim": {"claimName": "clef-models", "readOnly": True},
    }
    assert pod["containers"][0]["volumeMounts"][-1] == {
        "name": w.MODEL_VOLUME,
        "mountPath": MODEL_DIR,
        "readOnly": True,
        "subPath": "releases/clef-flash-fp8",
    }


def test_labels_selector_and_service() -> None:
    deployment = _deployment(_spec(), name="clef-h100-pool")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {DECISION_LABEL: "clef", PREDICTOR_LABEL: "clef-h100-pool"}
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert template_labels.items() >= selector.items()
    assert template_labels.items() >= deployment["metadata"]["labels"].items()  # the NetworkPolicy's selector
    assert deployment["metadata"]["annotations"]["clef-serving.io/pool"] == "h100-pool"
    service = w.build_service(deployment)
    assert service["metadata"] == deployment["metadata"]
    assert service["spec"] == {
        "selector": selector,
        "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
    }


def test_fixed_replicas_have_no_autoscaler() -> None:
    spec = _spec(replicas=3)
    deployment = _deployment(spec)
    assert deployment["spec"]["replicas"] == 3
    assert w.build_autoscaler(spec, POOL, deployment) is None


def test_autoscaling_gets_a_horizontal_pod_autoscaler_that_owns_the_replicas() -> None:
    spec = _spec(autoscaling={"minReplicas": 1, "maxReplicas": 4, "scaleMetric": "memory", "scaleTarget": 70})
    deployment = _deployment(spec, name="clef-h100-pool")
    assert "replicas" not in deployment["spec"]
    hpa = w.build_autoscaler(spec, POOL, deployment)
    assert hpa is not None and hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"] == {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "clef-h100-pool"},
        "minReplicas": 1,
        "maxReplicas": 4,
        "metrics": [
            {
                "type": "Resource",
                "resource": {"name": "memory", "target": {"type": "Utilization", "averageUtilization": 70}},
            }
        ],
        "behavior": {"scaleUp": {"stabilizationWindowSeconds": 60}, "scaleDown": {"stabilizationWindowSeconds": 600}},
    }
    default = w.build_autoscaler(_spec(autoscaling={"maxReplicas": 2}), POOL, deployment)
    assert default is not None and default["spec"]["metrics"][0]["resource"] == {
        "name": "cpu",
        "target": {"type": "Utilization", "averageUtilization": w.DEFAULT_UTILIZATION},
    }


def test_an_autoscaler_update_leaves_the_replicas_to_it() -> None:
    spec = _spec(autoscaling={"minReplicas": 1, "maxReplicas": 4})
    desired = _deployment(spec)
    live = {**desired, "metadata": {**desired["metadata"], "resourceVersion": "7"}}
    live["spec"] = {**desired["spec"], "replicas": 3}
    ops = build_update_patch(live, desired, whole_spec=False)
    assert {op["path"] for op in ops if op["path"].startswith("/spec")} == {
        "/spec/selector",
        "/spec/strategy",
        "/spec/template",
    }


KEDA = {"serverAddress": "http://prometheus.monitoring:9090", "metric": "clef_engine_in_flight", "target": "500m"}


def test_keda_autoscaling_gets_a_scaled_object_that_owns_the_replicas() -> None:
    spec = _spec(autoscaling={"minReplicas": 1, "maxReplicas": 4, "keda": KEDA})
    deployment = _deployment(spec, name="clef-h100-pool")
    assert "replicas" not in deployment["spec"]
    scaled = w.build_autoscaler(spec, POOL, deployment)
    assert scaled is not None and (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert scaled["metadata"] == deployment["metadata"]
    query = 'sum(clef_engine_in_flight{namespace="ml",pod=~"clef-h100-pool-[a-z0-9]+-[a-z0-9]+"})'
    assert scaled["spec"] == {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "clef-h100-pool"},
        "minReplicaCount": 1,
        "maxReplicaCount": 4,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": w.build_behavior(spec.autoscaling)}},
        "triggers": [
            {
                "type": "prometheus",
                "metricType": "AverageValue",
                "metadata": {"serverAddress": KEDA["serverAddress"], "query": query, "threshold": "0.5"},
            }
        ],
    }
    default = w.build_autoscaler(
        _spec(autoscaling={"maxReplicas": 2, "keda": {"serverAddress": "http://p"}}), POOL, deployment
    )
    assert default is not None and default["spec"]["triggers"][0]["metadata"]["threshold"] == "4"
    assert default["spec"]["triggers"][0]["metadata"]["query"].startswith("sum(clef_queue_depth{")


def test_a_pod_metric_gets_a_pods_metric_with_its_average_target_and_the_spec_windows() -> None:
    scaling = {
        "minReplicas": 1,
        "maxReplicas": 3,
        "podMetric": {"name": "clef_engine_in_flight", "target": "1500m"},
        "scaleUpStabilizationSeconds": 5,
        "scaleDownStabilizationSeconds": 0,
    }
    spec = _spec(autoscaling=scaling)
    deployment = _deployment(spec, name="clef-h100-pool")
    hpa = w.build_autoscaler(spec, POOL, deployment)
    assert hpa is not None and (hpa["apiVersion"], hpa["kind"]) == ("autoscaling/v2", "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "clef_engine_in_flight"},
                "target": {"type": "AverageValue", "averageValue": "1500m"},
            },
        }
    ]
    assert hpa["spec"]["behavior"] == {
        "scaleUp": {"stabilizationWindowSeconds": 5},
        "scaleDown": {"stabilizationWindowSeconds": 0},
    }
    default = w.build_autoscaler(_spec(autoscaling={"maxReplicas": 2, "podMetric": {}}), POOL, deployment)
    assert default is not None and default["spec"]["metrics"][0]["pods"] == {
        "metric": {"name": "clef_queue_depth"},
        "target": {"type": "AverageValue", "averageValue": "4"},
    }
    assert default["spec"]["behavior"] == {
        "scaleUp": {"stabilizationWindowSeconds": 60},
        "scaleDown": {"stabilizationWindowSeconds": 600},
    }


def test_the_windows_reach_the_hpa_that_keda_makes() -> None:
    spec = _spec(autoscaling={"maxReplicas": 2, "keda": KEDA, "scaleDownStabilizationSeconds": 120})
    scaled = w.build_autoscaler(spec, POOL, _deployment(spec))
    assert scaled is not None
    assert scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == {
        "scaleUp": {"stabilizationWindowSeconds": 60},
        "scaleDown": {"stabilizationWindowSeconds": 120},
    }


def test_the_predictor_pods_carry_the_prometheus_scrape_annotations() -> None:
    spec = _spec()
    want = {"prometheus.io/scrape": "true", "prometheus.io/port": "8080", "prometheus.io/path": "/metrics"}
    assert _deployment(spec)["spec"]["template"]["metadata"]["annotations"] == want
    isvc = build_inferenceservice(Placement(decision="clef", namespace="ml", pool=POOL, spec=spec))
    assert isvc["spec"]["predictor"]["annotations"] == want


@pytest.mark.parametrize(
    "scaling",
    [
        {"maxReplicas": 2, "podMetric": {}},
        {"maxReplicas": 2, "scaleUpStabilizationSeconds": 30},
        {"maxReplicas": 2, "scaleMetric": "concurrency", "scaleDownStabilizationSeconds": 30},
    ],
)
def test_the_kserve_backend_refuses_the_deployment_backends_scaling_naming_the_fields(scaling: Any) -> None:
    spec = _spec(autoscaling=scaling)  # backend left to the operator's default: refused when it picks kserve
    with pytest.raises(w.UnsupportedOnBackendError, match=r"autoscaling\.podMetric.*backend: deployment"):
        build_inferenceservice(Placement(decision="clef", namespace="ml", pool=POOL, spec=spec))
    with pytest.raises(InvalidSpecError, match=r"spec: .*autoscaling\.podMetric"):
        parse_spec({"model": {"storageUri": "hf://a/b"}, "backend": "kserve", "autoscaling": scaling})


def test_the_query_selects_the_deployments_pods_only() -> None:
    pattern = re.search(r'pod=~"([^"]+)"', w.deployment_pods_query("clef_queue_depth", "ml", "clef-a"))
    assert pattern is not None
    ours = ["clef-a-7d9c8b6f5d-x2x4k", "clef-a-5f6d7c8b9-bcdfg"]  # <deployment>-<template hash>-<suffix>
    others = ["clef-a-b-7d9c8b6f5d-x2x4k", "clef-ab-7d9c8b6f5d-x2x4k", "clef-a-7d9c8b6f5d", "x-clef-a-5f6d7c8b9-bcdfg"]
    assert [bool(re.fullmatch(pattern[1], pod)) for pod in ours + others] == [True] * 2 + [False] * 4


@pytest.mark.parametrize(
    ("spec", "found"),
    [
        (_spec("oci://registry/clef:1"), "oci:// releases are mounted by KServe"),
        (_spec(autoscaling={"maxReplicas": 2, "scaleMetric": "concurrency"}), "scaleMetric concurrency needs Knative"),
        (_spec(autoscaling={"minReplicas": 0, "maxReplicas": 2}), "keeps at least 1 replica"),
        (
            _spec(autoscaling={"minReplicas": 0, "maxReplicas": 2, "keda": {"serverAddress": "http://prom:9090"}}),
            "no pod reports at 0 replicas",
        ),
        (_spec(autoscaling={"minReplicas": 0, "maxReplicas": 2, "podMetric": {}}), "no pod reports at 0 replicas"),
    ],
)
def test_what_only_kserve_does_is_refused_saying_so(spec: Any, found: str) -> None:
    with pytest.raises(w.UnsupportedOnBackendError, match=found):
        w.build_autoscaler(spec, POOL, _deployment(spec))


@pytest.mark.parametrize(
    ("deployment", "ready", "why"),
    [
        (None, False, "not created yet"),
        ({"metadata": {"generation": 2}, "spec": {"replicas": 1}, "status": {"observedGeneration": 1}}, False, "seen"),
        (
            {
                "metadata": {"generation": 2},
                "spec": {"replicas": 2},
                "status": {"observedGeneration": 2, "updatedReplicas": 1},
            },
            False,
            "rolling out: 1/2",
        ),
        (
            {
                "metadata": {"generation": 2},
                "spec": {"replicas": 2},
                "status": {"observedGeneration": 2, "updatedReplicas": 2, "availableReplicas": 1},
            },
            False,
            "1/2 replicas available",
        ),
        (
            {
                "metadata": {"generation": 2},
                "spec": {"replicas": 2},
                "status": {"observedGeneration": 2, "updatedReplicas": 2, "availableReplicas": 2},
            },
            True,
            "",
        ),
    ],
)
def test_readiness_is_every_wanted_replica_available_on_the_current_spec(
    deployment: dict[str, Any] | None, ready: bool, why: str
) -> None:
    found_ready, found_why = w.deployment_ready(deployment)
    assert found_ready is ready and why in found_why


class Discovery:
    """The one call resolve_backend makes: whether InferenceServices are served (or a failure)."""

    def __init__(self, answer: bool | Exception) -> None:
        self.answer = answer
        self.calls = 0

    async def served(self, resource: Any) -> bool:
        self.calls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("fields", "default", "previous", "served", "chosen"),
    [
        ({"backend": "deployment"}, "kserve", {"backend": "kserve"}, True, "deployment"),  # the spec's word
        ({}, "deployment", {"backend": "kserve"}, True, "deployment"),  # then the operator's default
        ({}, "auto", {"backend": "deployment"}, True, "deployment"),  # then the one it already has
        ({}, "auto", {}, True, "kserve"),  # then discovery
        ({}, "auto", {}, False, "deployment"),
    ],
)
async def test_backend_resolution(
    fields: dict[str, Any], default: str, previous: dict[str, Any], served: bool, chosen: str
) -> None:
    discovery = Discovery(served)
    policy = Policy(default_backend=default)
    assert await resolve_backend(_spec(**fields), policy, previous, discovery) == chosen  # type: ignore[arg-type]
    assert discovery.calls == (1 if not fields and default == "auto" and not previous else 0)


async def test_a_failed_discovery_decides_nothing() -> None:
    discovery = Discovery(ApiError("discovering /apis/serving.kserve.io/v1beta1", 503, "unavailable"))
    with pytest.raises(ApiError):
        await resolve_backend(_spec(), Policy(), {}, discovery)  # type: ignore[arg-type]


class Api:
    """An in-memory API server for one reconciliation: objects by (plural, name), the calls made, and whether
    KEDA's ScaledObjects are served (or the discovery failure)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.keda: bool | Exception = True

    async def served(self, resource: Resource) -> bool:
        assert resource == SCALED_OBJECTS
        self.calls.append(("served", resource.plural))
        if isinstance(self.keda, Exception):
            raise self.keda
        return self.keda

    async def list_labelled(self, resource: Resource, namespace: str, label: str) -> list[dict[str, Any]]:
        return [obj for (plural, _), obj in self.objects.items() if plural == resource.plural]

    async def create(self, resource: Resource, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", resource.plural))
        self.objects[(resource.plural, body["metadata"]["name"])] = body
        return body

    async def patch(self, resource: Resource, namespace: str, name: str, ops: Any) -> dict[str, Any]:
        self.calls.append(("patch", resource.plural))
        return self.objects[(resource.plural, name)]

    async def delete(self, resource: Resource, namespace: str, name: str) -> None:
        self.calls.append(("delete", resource.plural))
        del self.objects[(resource.plural, name)]


H100_NODE = GpuNode(
    "gpu-1",
    {
        POOL.label_key: POOL.name,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
    },
    1,
)


async def _pass(api: Api, autoscaling: dict[str, Any]) -> Any:
    body = {
        "metadata": {"name": "clef", "namespace": "ml", "uid": "u-1", "generation": 1},
        "spec": {
            "backend": "deployment",
            "model": {"storageUri": "hf://cloudflare/clef-flash-fp8"},
            "autoscaling": autoscaling,
        },
    }

    def adopt(obj: dict[str, Any]) -> None:
        obj["metadata"]["ownerReferences"] = [
            {"uid": "u-1", "kind": "ClefDecision", "name": "clef", "controller": True}
        ]

    api.calls.clear()
    return await reconcile(body, nodes=[H100_NODE], api=api, adopt=adopt)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("keda", "message"),
    [
        (False, "autoscaling.keda needs KEDA: the API server does not serve keda.sh/v1alpha1 ScaledObjects"),
        (ApiError("discovering /apis/keda.sh/v1alpha1", 503, "unavailable"), "503 unavailable"),
    ],
)
async def test_without_keda_the_pool_fails_and_its_serving_objects_stay(keda: bool | Exception, message: str) -> None:
    api = Api()
    await _pass(api, {"maxReplicas": 3})
    serving = dict(api.objects)
    assert {plural for plural, _ in serving} == {"deployments", "services", "horizontalpodautoscalers"}
    api.keda = keda
    outcome = await _pass(api, {"maxReplicas": 3, "keda": KEDA})
    (entry,) = outcome.status["pools"]
    assert entry["state"] == "Failed" and message in entry["predictorMessage"]
    assert outcome.failed  # retried with backoff: installing KEDA later heals the pool
    assert api.objects == serving and api.calls == [("served", "scaledobjects")]  # nothing written or deleted
    if keda is False:
        assert [e.reason for e in outcome.events if e.type == "Warning"] == ["KedaNotInstalled"]


async def test_switching_autoscalers_removes_the_old_one_before_creating_the_new() -> None:
    api = Api()
    await _pass(api, {"maxReplicas": 3})
    outcome = await _pass(api, {"maxReplicas": 3, "keda": KEDA})
    assert not outcome.failed and outcome.status["pools"][0]["state"] == "Serving"
    assert api.calls == [
        ("served", "scaledobjects"),
        ("delete", "horizontalpodautoscalers"),
        ("create", "scaledobjects"),
    ]
    await _pass(api, {"maxReplicas": 3})
    assert api.calls == [("delete", "scaledobjects"), ("create", "horizontalpodautoscalers")]
    assert {plural for plural, _ in api.objects} == {"deployments", "services", "horizontalpodautoscalers"}
