"""Pure builders: InferenceService names, the predictor container contract, probes, patches."""

from __future__ import annotations

import re
from typing import Any

import kopf
import pytest

from clef_operator import builders as b
from clef_operator.constants import SPEC_HASH_ANNOTATION
from clef_operator.pools import NodePool
from clef_operator.spec import parse_spec

POOL = NodePool("h100-pool", "cloud.google.com/gke-nodepool", ())


def _spec(**extra: Any) -> Any:
    return parse_spec({"model": {"storageUri": "hf://cloudflare/clef-flash-fp8", "name": "clef-flash"}, **extra})


def _isvc(**extra: Any) -> dict[str, Any]:
    return b.build_inferenceservice(decision="clef", namespace="ml", pool=POOL, spec=_spec(**extra))


@pytest.mark.parametrize(("decision", "pool"), [
    ("clef", "h100-pool"), ("Clef", "Pool_With.Dots"), ("1st", "p"), ("x" * 60, "y" * 60), ("clef", "---"),
])
def test_names_are_short_dns_labels(decision: str, pool: str) -> None:
    name = b.inferenceservice_name(decision, pool)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= b.MAX_ISVC_NAME
    assert name == b.inferenceservice_name(decision, pool)


def test_plain_names_are_kept_and_long_ones_hashed() -> None:
    assert b.inferenceservice_name("clef", "h100-pool") == "clef-h100-pool"
    long_a = b.inferenceservice_name("clef", "p" * 60 + "a")
    long_b = b.inferenceservice_name("clef", "p" * 60 + "b")
    assert long_a != long_b and len(long_a) == b.MAX_ISVC_NAME
    assert b.inferenceservice_name("clef", "Pool-A") != b.inferenceservice_name("clef", "pool-a")


def test_predictor_contract() -> None:
    container = _isvc(gpusPerReplica=4, predictor={"maxModelLen": 4096, "extraArgs": ["--log-level=debug"]})[
        "spec"]["predictor"]["containers"][0]
    assert container["name"] == "kserve-container"
    assert container["command"] == ["python", "-m", "predictor"]
    assert container["args"] == [
        "--model-dir", "/mnt/models", "--model-name", "clef-flash", "--engine", "vllm", "--dp", "4",
        "--max-model-len", "4096", "--http_port", "8080", "--log-level=debug",
    ]
    assert container["env"] == [
        {"name": "STORAGE_URI", "value": "hf://cloudflare/clef-flash-fp8"},
        {"name": "VLLM_CACHE_ROOT", "value": "/var/cache/clef/vllm"},
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": "/var/cache/clef/inductor"},
        {"name": "TRITON_CACHE_DIR", "value": "/var/cache/clef/triton"},
        {"name": "TRITON_CACHE_AUTOTUNING", "value": "1"},
    ]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert container["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "compile-cache", "mountPath": "/var/cache/clef"},
    ]


def test_probes_wait_for_warm_up() -> None:
    container = _isvc()["spec"]["predictor"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/v1/models/clef-flash", "port": 8080, "scheme": "HTTP"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60
    custom = _isvc(predictor={"startupProbe": {"periodSeconds": 20, "failureThreshold": 270}})
    assert custom["spec"]["predictor"]["containers"][0]["startupProbe"]["failureThreshold"] == 270


def test_pod_placement_and_shm() -> None:
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    predictor = _isvc(tolerations=[toleration], replicas=3, predictor={"shmSize": "32Gi"})["spec"]["predictor"]
    assert predictor["nodeSelector"] == {"cloud.google.com/gke-nodepool": "h100-pool"}
    assert predictor["tolerations"] == [toleration]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (3, 3)
    assert predictor["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}},
        {"name": "compile-cache", "emptyDir": {}},
    ]
    assert "tolerations" not in _isvc()["spec"]["predictor"]


def test_pod_security_context_makes_volumes_writable_by_the_predictor() -> None:
    # The image's group (docker/predictor.Dockerfile) owns the volumes Kubernetes can manage, so the
    # compile cache on a fresh emptyDir or claim is writable by the non-root predictor.
    predictor = _isvc()["spec"]["predictor"]
    assert predictor["securityContext"] == {"fsGroup": 10001, "fsGroupChangePolicy": "OnRootMismatch"}
    # Knative Serving rejects a pod securityContext unless its podspec-securitycontext feature is on.
    assert "securityContext" not in _isvc(deploymentMode="Knative")["spec"]["predictor"]


@pytest.mark.parametrize("source", [
    {"persistentVolumeClaim": {"claimName": "clef-compile-cache"}},
    {"hostPath": {"path": "/var/cache/clef", "type": "DirectoryOrCreate"}},
    {"emptyDir": {"sizeLimit": "20Gi"}},
])
def test_compile_cache_volume_is_the_specs_source(source: dict[str, Any]) -> None:
    spec = _spec(predictor={"compileCache": source})
    predictor = b.build_inferenceservice(decision="clef", namespace="ml", pool=POOL, spec=spec)["spec"]["predictor"]
    assert predictor["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
        {"name": "compile-cache", **source},
    ]
    predictor["volumes"][1][next(iter(source))]["changed"] = True  # the body is a copy, not the spec's dict
    assert spec.predictor.compileCache == source


def test_pool_overrides_and_metadata() -> None:
    body = _isvc(poolOverrides=[{"name": "h100-pool", "replicas": 2, "gpusPerReplica": 8}],
                 deploymentMode="Knative", predictor={"resources": {"requests": {"cpu": "8"}}})
    predictor = body["spec"]["predictor"]
    assert predictor["minReplicas"] == 2 and "8" in predictor["containers"][0]["args"]
    assert predictor["containers"][0]["resources"]["requests"] == {"cpu": "8", "nvidia.com/gpu": "8"}
    assert body["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Knative"
    assert body["metadata"]["labels"]["clef-serving.io/decision"] == "clef"
    assert body["apiVersion"] == "serving.kserve.io/v1beta1" and body["kind"] == "InferenceService"


def test_adopted_by_its_clefdecision() -> None:
    body = _isvc()
    owner = {"apiVersion": "clef-serving.io/v1alpha1", "kind": "ClefDecision",
             "metadata": {"name": "clef", "namespace": "ml", "uid": "u-1"}}
    kopf.adopt(body, owner=owner)  # type: ignore[arg-type]
    (ref,) = body["metadata"]["ownerReferences"]
    assert ref == {"apiVersion": "clef-serving.io/v1alpha1", "kind": "ClefDecision", "name": "clef",
                   "uid": "u-1", "controller": True, "blockOwnerDeletion": True}


def test_spec_hash_tracks_managed_fields_only() -> None:
    def stamped(**extra: Any) -> str:
        return b.stamp_spec_hash(_isvc(**extra))["metadata"]["annotations"][SPEC_HASH_ANNOTATION]

    assert stamped() == stamped()
    assert stamped(predictor={"maxModelLen": 2048}) != stamped()
    assert stamped(predictor={"compileCache": {"persistentVolumeClaim": {"claimName": "cache"}}}) != stamped()


def test_update_patch_is_guarded_and_keeps_foreign_metadata() -> None:
    desired = b.stamp_spec_hash(_isvc(predictor={"maxModelLen": 2048}))
    current = {"metadata": {"resourceVersion": "7", "labels": {"team": "ml"}, "annotations": {"note": "x"}},
               "spec": {"predictor": {"old": True}}}
    ops = b.build_update_patch(current, desired)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    by_path = {op["path"]: op["value"] for op in ops[1:]}
    assert by_path["/spec"] == desired["spec"]
    assert by_path["/metadata/labels"]["team"] == "ml"
    assert by_path["/metadata/annotations"]["note"] == "x"


def test_args_parse_with_the_predictors_own_parser() -> None:
    cli = pytest.importorskip("predictor.cli", reason="the predictor's dependencies (kserve) are not installed")
    container = _isvc(gpusPerReplica=2, predictor={"maxModelLen": 4096})["spec"]["predictor"]["containers"][0]
    assert container["command"][-2:] == ["-m", "predictor"]
    args = cli.build_parser().parse_args(container["args"])
    assert (str(args.model_dir), args.model_name, args.engine, args.dp, args.max_model_len, args.http_port) == (
        "/mnt/models", "clef-flash", "vllm", 2, 4096, 8080)
