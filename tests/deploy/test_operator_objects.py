"""The InferenceServices the operator builds, validated against KServe's InferenceService CRD schema."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from clef_operator.kserve_backend import Placement, build_inferenceservice
from clef_operator.pools import GpuNode, NodePool
from clef_operator.spec import parse_spec
from tests import crd_schema
from tests.deploy.chart import REPO, load_yaml_objects

POOL_KEY = "cloud.google.com/gke-nodepool"
POOL = NodePool(
    name="h100-pool", label_key=POOL_KEY, nodes=(GpuNode(name="h100-a", labels={POOL_KEY: "h100-pool"}, gpus=8),)
)
(EXAMPLE,) = load_yaml_objects(REPO / "manifests" / "examples" / "clefdecision.yaml")
SPECS: dict[str, dict[str, Any]] = {
    "minimal": {"model": {"storageUri": "hf://cloudflare/clef-flash-fp8"}},
    "example": EXAMPLE["spec"],
    "every-field": {
        "model": {"storageUri": "s3://models/clef-flash-bf16", "name": "clef-bf16"},
        "quantization": "bf16",
        "minComputeCapability": "8.0",
        "allowUnverifiedPools": True,
        "nodePools": {"labelKey": POOL_KEY, "include": ["h100-pool"]},
        "replicas": 3,
        "gpusPerReplica": 2,
        "poolOverrides": [{"name": "h100-pool", "replicas": 2, "gpusPerReplica": 4}],
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute", "tolerationSeconds": 300},
        ],
        "predictor": {
            "image": "registry.example.com/clef/clef-predictor:0.1.0",
            "imagePullPolicy": "Always",
            "resources": {"requests": {"cpu": "8", "memory": "48Gi"}, "limits": {"cpu": 16, "memory": "64Gi"}},
            "maxModelLen": 4096,
            "extraArgs": ["--log-level=debug"],
            "shmSize": "32Gi",
            "startupProbe": {"periodSeconds": 15, "failureThreshold": 240},
            "compileCache": {"persistentVolumeClaim": {"claimName": "clef-compile-cache"}},
        },
        "deploymentMode": "Knative",
    },
    "controls": {
        "model": {
            "variants": [
                {"quantization": "nvfp4", "storageUri": "s3://m/nvfp4"},
                {"quantization": "fp8", "storageUri": "s3://m/fp8"},
            ]
        },
        "nodePools": {
            "removalGracePeriod": "15m",
            "declared": [{"name": "karp-b200", "labelKey": "karpenter.sh/nodepool", "computeCapability": "10.0"}],
        },
        "poolOverrides": [{"name": "h100-pool", "minReplicas": 2, "maxReplicas": 6}],
        "autoscaling": {
            "minReplicas": 1,
            "maxReplicas": 4,
            "keda": {
                "metric": "clef_engine_in_flight",
                "target": "8",
                "serverAddress": "http://prometheus.monitoring:9090",
            },
        },
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 50,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app": "x"}},
                        },
                    }
                ]
            }
        },
        "serviceAccountName": "clef-reader",
        "imagePullSecrets": [{"name": "regcred"}],
        "priorityClassName": "serving-critical",
        "predictor": {
            "env": [
                {"name": "HF_HUB_OFFLINE", "value": "1"},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            ],
            "envFrom": [{"secretRef": {"name": "s3-credentials"}}],
            "apiKeySecret": {"name": "clef-keys"},
        },
    },
    "host-path-cache": {
        "model": {"storageUri": "pvc://clef-models/clef-flash-fp8"},
        "predictor": {"compileCache": {"hostPath": {"path": "/var/cache/clef", "type": "DirectoryOrCreate"}}},
    },
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_built_inferenceservices_match_kserve_crd(
    name: str, kserve_crds: dict[str, dict[str, Any]], clef_crd: dict[str, Any]
) -> None:
    owner = {
        "apiVersion": "clef-serving.io/v1alpha1",
        "kind": "ClefDecision",
        "metadata": {"name": "clef", "namespace": "ml", "uid": "0b7c6e1e-0000-4000-8000-000000000001"},
        "spec": SPECS[name],
    }
    crd_schema.validate(owner, clef_crd)  # the spec itself is a valid ClefDecision
    isvc = build_inferenceservice(Placement(decision="clef", namespace="ml", pool=POOL, spec=parse_spec(SPECS[name])))
    # Standard mode carries the pod securityContext (fsGroup), so the schema check covers it too.
    assert ("securityContext" in isvc["spec"]["predictor"]) == (SPECS[name].get("deploymentMode") != "Knative")
    kopf.adopt(isvc, owner=owner)
    crd_schema.validate(isvc, kserve_crds["InferenceService"])


def test_schema_check_catches_a_misplaced_field(kserve_crds: dict[str, dict[str, Any]]) -> None:
    isvc = build_inferenceservice(
        Placement(decision="clef", namespace="ml", pool=POOL, spec=parse_spec(SPECS["minimal"]))
    )
    isvc["spec"]["predictor"]["containers"][0]["shmSize"] = "16Gi"
    with pytest.raises(AssertionError, match="'shmSize' was unexpected"):
        crd_schema.validate(isvc, kserve_crds["InferenceService"])
