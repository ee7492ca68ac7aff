"""The cases both validations (the CRD schema with its defaults and CEL rules, as a real API server applies them,
and the operator's model) must agree on, naming the same field (tests/cluster/test_2b_operator_limits.py)."""

from __future__ import annotations

from typing import Any

from clef_operator.spec import InvalidSpecError, parse_spec

BASE: dict[str, Any] = {"model": {"storageUri": "hf://cloudflare/clef-flash-fp8"}}
VALID: list[dict[str, Any]] = [
    {},
    {"quantization": "bf16", "minComputeCapability": "8.0"},
    {"quantization": "nvfp4", "minComputeCapability": "10.0"},
    {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    {"nodePools": {"include": ["a"], "exclude": ["b"]}, "poolOverrides": [{"name": "a", "replicas": 2}]},
    {
        "predictor": {
            "extraArgs": ["--gpu-memory-utilization=0.9"],
            "maxModelLen": 4096,
            "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
            "compileCache": {"persistentVolumeClaim": {"claimName": "c"}},
        }
    },
    {
        "model": {
            "variants": [
                {"quantization": "fp8", "storageUri": "s3://m/fp8"},
                {"quantization": "bf16", "storageUri": "s3://m/bf16"},
            ]
        }
    },
    {"autoscaling": {"minReplicas": 1, "maxReplicas": 3, "keda": {"serverAddress": "http://prom:9090"}}},
    {"nodePools": {"labelKey": "pool", "declared": [{"name": "p", "computeCapability": "9.0"}]}},
    {"backend": "deployment"},
    {
        "backend": "deployment",
        "autoscaling": {
            "maxReplicas": 2,
            "podMetric": {"name": "clef_engine_in_flight", "target": "2"},
            "scaleUpStabilizationSeconds": 5,
            "scaleDownStabilizationSeconds": 30,
        },
    },
]
# (spec fields over BASE, the field both must name)
INVALID: list[tuple[dict[str, Any], str]] = [
    ({"predictor": {"maxModelLen": "8192"}}, "maxModelLen"),
    ({"replicas": "2"}, "replicas"),
    ({"allowUnverifiedPools": "true"}, "allowUnverifiedPools"),
    ({"minComputeCapability": "8.10"}, "minComputeCapability"),
    ({"minComputeCapability": "8.6"}, "minComputeCapability"),  # fp8 needs 8.9
    ({"quantization": "nvfp4", "minComputeCapability": "9.0"}, "minComputeCapability"),
    ({"tolerations": [{"key": "k", "operator": "Bogus"}]}, "tolerations"),
    ({"tolerations": [{"key": "k", "effect": "Sometimes"}]}, "tolerations"),
    ({"nodePools": {"include": ["a"], "exclude": ["a"]}}, "nodePools"),
    ({"nodePools": {"exclude": ["a"]}, "poolOverrides": [{"name": "a", "replicas": 2}]}, "poolOverrides"),
    ({"poolOverrides": [{"name": "a"}, {"name": "a"}]}, "poolOverrides"),
    ({"predictor": {"extraArgs": ["--max-model-len=5"]}}, "extraArgs"),
    ({"predictor": {"extraArgs": ["--x"] * 65}}, "extraArgs"),
    ({"predictor": {"env": [{"value": "1"}]}}, "env"),
    ({"predictor": {"env": [{"name": "A", "value": "v" * 8193}]}}, "env"),
    ({"predictor": {"compileCache": {"emptyDir": {}, "hostPath": {"path": "/x"}}}}, "compileCache"),
    ({"predictor": {"compileCache": {"configMap": {"name": "c"}}}}, "compileCache"),
    ({"predictor": {"compileCache": {"name": "c"}}}, "compileCache"),
    ({"model": {"storageUri": "ftp://x"}}, "storageUri"),
    ({"model": {"storageUri": "s3://x", "variants": [{"quantization": "fp8", "storageUri": "s3://y"}]}}, "model"),
    (
        {
            "model": {
                "variants": [
                    {"quantization": "fp8", "storageUri": "s3://a"},
                    {"quantization": "fp8", "storageUri": "s3://b"},
                ]
            }
        },
        "variants",
    ),
    (
        {"model": {"variants": [{"quantization": "nvfp4", "storageUri": "s3://a", "minComputeCapability": "9.0"}]}},
        "variants",
    ),
    ({"autoscaling": {"minReplicas": 4, "maxReplicas": 3}}, "autoscaling"),
    ({"autoscaling": {"maxReplicas": 3, "scaleMetric": "rps", "keda": {"serverAddress": "http://p"}}}, "autoscaling"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}}, "affinity"),
    ({"replicas": 0}, "replicas"),
    ({"nodePools": {"declared": [{"name": "p", "computeCapability": "9.0"}]}}, "nodePools"),
    ({"nodePools": {"removalGracePeriod": "10 minutes"}}, "removalGracePeriod"),
    ({"deploymentMode": "Serverless"}, "deploymentMode"),
    ({"backend": "knative"}, "spec.backend"),
    ({"backend": "kserve", "autoscaling": {"maxReplicas": 2, "podMetric": {}}}, "autoscaling"),
    ({"autoscaling": {"maxReplicas": 2, "podMetric": {}, "keda": {"serverAddress": "http://p"}}}, "autoscaling"),
    ({"autoscaling": {"maxReplicas": 2, "podMetric": {"name": "clef_ready"}}}, "podMetric"),
    ({"autoscaling": {"maxReplicas": 2, "scaleDownStabilizationSeconds": 3601}}, "scaleDownStabilizationSeconds"),
]


def operator_errors(spec: dict[str, Any]) -> str:
    """The operator's refusal of ``spec`` (its model's message), or "" when it accepts it."""
    try:
        parse_spec(spec)
    except InvalidSpecError as exc:
        return str(exc)
    return ""
