"""Spec validation (errors name fields) and the status/conditions builder."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from clef_operator import status as s
from clef_operator.__main__ import build_parser
from clef_operator.constants import DEPLOYMENT_BACKEND, KSERVE_BACKEND
from clef_operator.crd import STATUS_SCHEMA
from clef_operator.pools import GpuInfo, GpuNode, NodePool, PoolDecision, group_into_pools, pool_labels_carried
from clef_operator.spec import InvalidSpecError, check_host_path, parse_duration, parse_spec
from tests.crd_schema import to_json_schema

MODEL = {"storageUri": "s3://bucket/clef-flash-fp8"}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"model": {"storageUri": "http://x"}}, "spec.model.storageUri"),
        ({}, "spec.model"),
        ({"model": MODEL, "quantization": "int8"}, "spec.quantization"),
        ({"model": MODEL, "minComputeCapability": "8.0"}, "at least 8.9"),
        ({"model": MODEL, "gpusPerReplica": 0}, "spec.gpusPerReplica"),
        ({"model": MODEL, "predictor": {"extraArgs": ["--dp=2"]}}, "--dp is set by the operator"),
        ({"model": MODEL, "nodePools": {"include": ["a"], "exclude": ["a"]}}, "both include and exclude"),
        ({"model": MODEL, "poolOverrides": [{"name": "a"}, {"name": "a"}]}, "more than once"),
        ({"model": MODEL, "predictor": {"resources": {"claims": {}}}}, "spec.predictor.resources"),
        (
            {"model": MODEL, "predictor": {"resources": {"requests": {"cpu": "lots"}}}},
            "spec.predictor.resources.requests.cpu: Value error, 'lots' is not a Kubernetes quantity",
        ),
        ({"model": MODEL, "predictor": {"shmSize": "big"}}, "spec.predictor.shmSize"),
        ({"model": MODEL, "predictor": {"extraArgs": ["--host=127.0.0.1"]}}, "--host is set by the operator"),
        ({"model": MODEL, "nodePools": {"removalGracePeriod": "ten minutes"}}, "spec.nodePools.removalGracePeriod"),
        ({"model": MODEL, "nodePools": {"declared": [{"name": "k", "computeCapability": "9.0"}]}}, "needs a labelKey"),
        (
            {"model": {"storageUri": "s3://a", "variants": [{"quantization": "fp8", "storageUri": "s3://b"}]}},
            "exactly one of storageUri and variants",
        ),
        (
            {"model": {"variants": [{"quantization": "nvfp4", "storageUri": "s3://b", "minComputeCapability": "9.0"}]}},
            "at least 10.0 for nvfp4",
        ),
        ({"model": MODEL, "autoscaling": {"minReplicas": 3, "maxReplicas": 2}}, "minReplicas may not exceed"),
        (
            {"model": MODEL, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}},
            "set by the operator",
        ),
        ({"model": MODEL, "typo": True}, "spec.typo"),
    ],
)
def test_invalid_specs_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpecError, match=field.replace(".", r"\.")):
        parse_spec(spec)


@pytest.mark.parametrize(
    ("cache", "message"),
    [
        ({}, "must name exactly one volume source"),
        ({"emptyDir": {}, "hostPath": {"path": "/x"}}, "found 2: emptyDir, hostPath"),
        (
            {"name": "c", "emptyDir": {}},
            (
                "name is set by the operator (the volume is always named compile-cache); "
                "give only the volume source, e.g. {persistentVolumeClaim: {claimName: ...}}"
            ),
        ),
        ({"configMap": {"name": "c"}}, "'configMap' is not a writable Kubernetes volume source"),
        ({"hostPath": "/var/cache/clef"}, "hostPath must be an object"),
    ],
)
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
    return {
        "status": {
            "url": "http://x",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "Loading"}],
        }
    }


def _ready(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def test_ready_only_when_every_eligible_pool_is_ready() -> None:
    pools = [
        s.build_pool_status(_decision("a", True), state=s.SERVING, isvc_name="clef-a", isvc=_isvc(True)),
        s.build_pool_status(_decision("b", True), state=s.SERVING, isvc_name="clef-b", isvc=_isvc(False)),
        s.build_pool_status(_decision("c", False), state=s.INELIGIBLE, isvc_name=None, isvc=None),
    ]
    status = s.build_status(generation=3, pools=pools, now="t1")
    assert _ready(status)["status"] == "False" and status["poolsReady"] == "1/2"
    assert status["observedGeneration"] == 3
    pools[1] = s.build_pool_status(_decision("b", True), state=s.SERVING, isvc_name="clef-b", isvc=_isvc(True))
    later = s.build_status(generation=3, pools=pools, previous=status, now="t2")
    assert _ready(later)["status"] == "True" and _ready(later)["lastTransitionTime"] == "t2"
    unchanged = s.build_status(generation=3, pools=pools, previous=later, now="t3")
    assert _ready(unchanged)["lastTransitionTime"] == "t2"
    assert pools[2]["gpu"]["computeCapability"] == "9.0" and "inferenceService" not in pools[2]


def test_no_pools_kserve_missing_and_invalid() -> None:
    assert _ready(s.build_status(generation=1, pools=[], now="t"))["reason"] == "NoGPUNodePools"
    only_bad = [s.build_pool_status(_decision("c", False), state=s.INELIGIBLE, isvc_name=None, isvc=None)]
    assert _ready(s.build_status(generation=1, pools=only_bad, now="t"))["reason"] == "NoEligiblePools"
    good = [s.build_pool_status(_decision("a", True), state=s.PENDING, isvc_name=None, isvc=None)]
    missing = s.build_status(generation=1, pools=good, kserve_installed=False, now="t")
    assert _ready(missing)["reason"] == s.KSERVE_NOT_INSTALLED
    invalid = s.build_status(generation=1, pools=[], invalid_spec="spec.x: bad", now="t")
    assert _ready(invalid)["reason"] == s.INVALID_SPEC and "spec.x" in _ready(invalid)["message"]


def test_duration_and_host_path_policy() -> None:
    assert parse_duration("10m") == 600 and parse_duration("1h30m5s") == 5405
    cache = {"hostPath": {"path": "/var/cache/clef/run", "type": "DirectoryOrCreate"}}
    spec = parse_spec({"model": MODEL, "predictor": {"compileCache": cache}})
    with pytest.raises(InvalidSpecError, match="hostPath compile caches are disabled"):
        check_host_path(spec, ())
    check_host_path(spec, ("/var/cache/clef",))
    for path in ("/var/cache/clef-other", "/var/cache/clef/../../../etc", "relative"):
        bad = parse_spec({"model": MODEL, "predictor": {"compileCache": {"hostPath": {"path": path}}}})
        with pytest.raises(InvalidSpecError, match=r"spec\.predictor\.compileCache\.hostPath\.path"):
            check_host_path(bad, ("/var/cache/clef",))


def test_variants_best_first() -> None:
    spec = parse_spec(
        {
            "model": {
                "variants": [
                    {"quantization": "bf16", "storageUri": "s3://m/bf16"},
                    {"quantization": "fp8", "storageUri": "s3://m/fp8"},
                    {"quantization": "nvfp4", "storageUri": "s3://m/nvfp4"},
                ]
            }
        }
    )
    assert [spec.best_variant(cc).quantization for cc in [(8, 0), (8, 9), (9, 0), (10, 0), (12, 0)]] == [
        "bf16",
        "fp8",
        "fp8",
        "nvfp4",
        "nvfp4",
    ]
    assert spec.min_capability == (8, 0)
    fp8_only = parse_spec({"model": MODEL})
    assert fp8_only.best_variant((8, 6)) is None and fp8_only.best_variant((10, 0)).quantization == "fp8"


def test_no_pools_message_names_the_label_key_the_nodes_lack() -> None:
    """Nodes that carry a well-known pool label but not spec.nodePools.labelKey: the message names the key they
    lack and the ones they carry, not "no pool label"."""
    nodes = [
        GpuNode("gpu-a", {"karpenter.sh/nodepool": "h100", "nvidia.com/gpu.present": "true"}, 8),
        GpuNode("gpu-b", {"nvidia.com/gpu.present": "true"}, 8),
    ]
    pools, unpooled = group_into_pools(nodes, "example.com/pool")
    assert pools == [] and unpooled == ["gpu-a", "gpu-b"]
    status = s.build_status(
        generation=1,
        pools=[],
        unpooled=unpooled,
        label_key="example.com/pool",
        other_pool_labels=pool_labels_carried(nodes),
        now="t",
    )
    ready = _ready(status)
    assert ready["reason"] == "NoGPUNodePools"
    assert ready["message"] == (
        "no GPU node pools found (2 GPU nodes carry no example.com/pool label, the key spec.nodePools.labelKey "
        "names: gpu-a, gpu-b; they carry karpenter.sh/nodepool: set spec.nodePools.labelKey to that key, or label "
        "the nodes with example.com/pool)"
    )
    without_key = s.build_status(generation=1, pools=[], unpooled=["gpu-b"], now="t")
    assert _ready(without_key)["message"] == "no GPU node pools found (1 GPU nodes carry no pool label: gpu-b)"


def test_cli_defaults() -> None:
    args = build_parser().parse_args([])
    assert (args.namespace, args.liveness_port, args.peering, args.standalone) == ([], 8080, "clef-operator", False)
    args = build_parser().parse_args(["-n", "a", "--namespace", "b", "--standalone"])
    assert args.namespace == ["a", "b"] and args.standalone
    with pytest.raises(SystemExit):
        build_parser().parse_args(["-n", "a", "--all-namespaces"])
    assert build_parser().parse_args([]).allow_host_path_prefix == []
    assert build_parser().parse_args([]).peering_lifetime == 20
    assert build_parser().parse_args(["--allow-host-path-prefix", "/var/cache/clef"]).allow_host_path_prefix == [
        "/var/cache/clef"
    ]


def test_kopf_watches_and_calls_are_bounded() -> None:
    import kopf

    from clef_operator import handlers

    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings, memo=kopf.Memo())
    assert (settings.watching.server_timeout, settings.watching.client_timeout) == (300, 330)
    assert settings.watching.connect_timeout == settings.networking.connect_timeout == 30
    assert settings.networking.request_timeout == 60
    assert settings.peering.lifetime == 20  # kopf's 60 s kept a killed operator's restart paused ~56 s


def _deployment(ready: bool) -> dict[str, Any]:
    available = 1 if ready else 0
    return {
        "metadata": {"name": "clef-a", "namespace": "ml", "generation": 2},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 2, "updatedReplicas": 1, "availableReplicas": available},
    }


def _every_pool_entry() -> list[dict[str, Any]]:
    """A status.pools[] entry of every state, both backends, ready and not, with every optional field set."""
    entries = [
        s.build_pool_status(_decision("a", True), state=state, isvc_name="clef-a", isvc=_isvc(ready))
        for state in (s.SERVING, s.DEGRADED)
        for ready in (True, False)
    ]
    entries += [
        s.build_pool_status(
            _decision("a", True),
            state=state,
            isvc_name="clef-a",
            isvc=_deployment(ready),
            backend=DEPLOYMENT_BACKEND,
            degraded_since="2026-12-06T05:00:00Z",
            removal_at="2026-12-06T05:10:00Z",
        )
        for state in (s.SERVING, s.DEGRADED)
        for ready in (True, False)
    ]
    entries.append(s.build_pool_status(_decision("p", True), state=s.PENDING, isvc_name=None, isvc=None))
    entries.append(s.build_pool_status(_decision("i", False), state=s.INELIGIBLE, isvc_name=None, isvc=None))
    entries.append(
        s.build_pool_status(_decision("f", True), state=s.FAILED, isvc_name="clef-f", isvc=None, message="refused")
    )
    entries.append(
        s.build_pool_status(
            _decision("c", True),
            state=s.CONFLICT,
            isvc_name="clef-c",
            isvc=None,
            message="held by another",
            predictor_reason=s.NAME_COLLISION,
        )
    )
    return entries


def test_every_status_the_builders_write_is_in_the_crds_status_schema() -> None:
    """The CRD's status schema (clef_operator.crd, hand-written beside the builders) keeps every field and value
    the builders write: the API server would prune an unknown field silently, and refuse an unknown enum value."""
    validator = jsonschema.Draft202012Validator(to_json_schema(STATUS_SCHEMA))
    entries = _every_pool_entry()
    assert {entry["state"] for entry in entries} == set(s.POOL_STATES)
    statuses = [
        s.build_status(generation=1, pools=entries, now="2026-12-06T05:00:00Z", backend=backend)
        for backend in (KSERVE_BACKEND, DEPLOYMENT_BACKEND)
    ]
    statuses += [
        s.build_status(generation=1, pools=[], kserve_installed=False, now="2026-12-06T05:00:00Z"),
        s.build_status(generation=1, pools=[], invalid_spec="spec.x: bad", now="2026-12-06T05:00:00Z"),
        s.build_status(generation=1, pools=entries[:1], missing=["gone"], now="2026-12-06T05:00:00Z"),
    ]
    for status in statuses:
        problems = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(status)]
        assert problems == [], problems
