"""Spec validation (errors name fields) and the status/conditions builder."""

from __future__ import annotations

from typing import Any

import pytest

from clef_operator import status as s
from clef_operator.__main__ import build_parser
from clef_operator.pools import GpuInfo, NodePool, PoolDecision
from clef_operator.spec import InvalidSpecError, parse_spec

MODEL = {"storageUri": "s3://bucket/clef-flash-fp8"}


@pytest.mark.parametrize(("spec", "field"), [
    ({"model": {"storageUri": "http://x"}}, "spec.model.storageUri"),
    ({}, "spec.model"),
    ({"model": MODEL, "quantization": "int8"}, "spec.quantization"),
    ({"model": MODEL, "minComputeCapability": "8.0"}, "at least 8.9"),
    ({"model": MODEL, "gpusPerReplica": 0}, "spec.gpusPerReplica"),
    ({"model": MODEL, "predictor": {"extraArgs": ["--dp=2"]}}, "--dp is set by the operator"),
    ({"model": MODEL, "nodePools": {"include": ["a"], "exclude": ["a"]}}, "both include and exclude"),
    ({"model": MODEL, "poolOverrides": [{"name": "a"}, {"name": "a"}]}, "more than once"),
    ({"model": MODEL, "predictor": {"resources": {"claims": {}}}}, "spec.predictor.resources"),
    ({"model": MODEL, "typo": True}, "spec.typo"),
])
def test_invalid_specs_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpecError, match=field.replace(".", r"\.")):
        parse_spec(spec)


@pytest.mark.parametrize(("cache", "message"), [
    ({}, "must name exactly one volume source"),
    ({"emptyDir": {}, "hostPath": {"path": "/x"}}, "found 2: emptyDir, hostPath"),
    ({"name": "c", "emptyDir": {}}, ("name is set by the operator (the volume is always named compile-cache); "
                                    "give only the volume source, e.g. {persistentVolumeClaim: {claimName: ...}}")),
    ({"configMap": {"name": "c"}}, "'configMap' is not a writable Kubernetes volume source"),
    ({"hostPath": "/var/cache/clef"}, "hostPath must be an object"),
])
def test_compile_cache_must_be_one_writable_volume_source(cache: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec({"model": MODEL, "predictor": {"compileCache": cache}})
    assert str(caught.value).startswith("spec.predictor.compileCache: ") and message in str(caught.value)


def test_defaults_and_bf16_on_ampere() -> None:
    spec = parse_spec({"model": MODEL})
    assert (spec.quantization, spec.minComputeCapability, spec.deploymentMode) == ("fp8", "8.9", "Standard")
    assert spec.model.name == "clef-flash" and spec.predictor.maxModelLen == 8192
    assert spec.predictor.compileCache == {"emptyDir": {}}
    assert parse_spec({"model": MODEL, "quantization": "bf16", "minComputeCapability": "8.0"}).min_capability == (8, 0)


def test_predictor_image_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEF_PREDICTOR_IMAGE", "registry.example.com/clef-predictor:1")
    assert parse_spec({"model": MODEL}).image() == "registry.example.com/clef-predictor:1"
    assert parse_spec({"model": MODEL, "predictor": {"image": "mine:2"}}).image() == "mine:2"


def _decision(name: str, eligible: bool) -> PoolDecision:
    gpu = GpuInfo(product="NVIDIA-H100-80GB-HBM3", family="hopper", capability=(9, 0), gpus_per_node=8)
    reason = "Eligible" if eligible else "ComputeCapabilityTooLow"
    return PoolDecision(NodePool(name, "cloud.google.com/gke-nodepool", ()), eligible, reason, "why", gpu)


def _isvc(ready: bool) -> dict[str, Any]:
    return {"status": {"url": "http://x", "conditions": [
        {"type": "Ready", "status": "True" if ready else "False", "reason": "Loading"}]}}


def _ready(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def test_ready_only_when_every_eligible_pool_is_ready() -> None:
    pools = [
        s.build_pool_status(_decision("a", True), isvc_name="clef-a", isvc=_isvc(True)),
        s.build_pool_status(_decision("b", True), isvc_name="clef-b", isvc=_isvc(False)),
        s.build_pool_status(_decision("c", False), isvc_name=None, isvc=None),
    ]
    status = s.build_status(generation=3, pools=pools, now="t1")
    assert _ready(status)["status"] == "False" and status["poolsReady"] == "1/2"
    assert status["observedGeneration"] == 3
    pools[1] = s.build_pool_status(_decision("b", True), isvc_name="clef-b", isvc=_isvc(True))
    later = s.build_status(generation=3, pools=pools, previous=status, now="t2")
    assert _ready(later)["status"] == "True" and _ready(later)["lastTransitionTime"] == "t2"
    unchanged = s.build_status(generation=3, pools=pools, previous=later, now="t3")
    assert _ready(unchanged)["lastTransitionTime"] == "t2"
    assert pools[2]["gpu"]["computeCapability"] == "9.0" and "inferenceService" not in pools[2]


def test_no_pools_kserve_missing_and_invalid() -> None:
    assert _ready(s.build_status(generation=1, pools=[], now="t"))["reason"] == "NoGPUNodePools"
    only_bad = [s.build_pool_status(_decision("c", False), isvc_name=None, isvc=None)]
    assert _ready(s.build_status(generation=1, pools=only_bad, now="t"))["reason"] == "NoEligiblePools"
    good = [s.build_pool_status(_decision("a", True), isvc_name=None, isvc=None)]
    missing = s.build_status(generation=1, pools=good, kserve_installed=False, now="t")
    assert _ready(missing)["reason"] == s.KSERVE_NOT_INSTALLED
    invalid = s.build_status(generation=1, pools=[], invalid_spec="spec.x: bad", now="t")
    assert _ready(invalid)["reason"] == s.INVALID_SPEC and "spec.x" in _ready(invalid)["message"]


def test_cli_defaults() -> None:
    args = build_parser().parse_args([])
    assert (args.namespace, args.liveness_port, args.peering, args.standalone) == ([], 8080, "clef-operator", False)
    args = build_parser().parse_args(["-n", "a", "--namespace", "b", "--standalone"])
    assert args.namespace == ["a", "b"] and args.standalone
    with pytest.raises(SystemExit):
        build_parser().parse_args(["-n", "a", "--all-namespaces"])
