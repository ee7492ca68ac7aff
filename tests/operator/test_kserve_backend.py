"""Pure builders: InferenceService names, the predictor container contract, probes, patches."""

from __future__ import annotations

import copy
import re
from typing import Any

import kopf
import pytest

from clef_operator import kserve_backend as b
from clef_operator.pools import NodePool
from clef_operator.spec import parse_spec

POOL = NodePool("h100-pool", "cloud.google.com/gke-nodepool", ())


def _spec(**extra: Any) -> Any:
    return parse_spec({"model": {"storageUri": "hf://cloudflare/clef-flash-fp8", "name": "clef-flash"}, **extra})


def _isvc(**extra: Any) -> dict[str, Any]:
    return b.build_inferenceservice(b.Placement(decision="clef", namespace="ml", pool=POOL, spec=_spec(**extra)))


@pytest.mark.parametrize(
    ("decision", "pool"),
    [
        ("clef", "h100-pool"),
        ("Clef", "Pool_With.Dots"),
        ("1st", "p"),
        ("x" * 60, "y" * 60),
        ("clef", "---"),
    ],
)
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
    container = _isvc(gpusPerReplica=4, predictor={"maxModelLen": 4096, "extraArgs": ["--log-level=debug"]})["spec"][
        "predictor"
    ]["containers"][0]
    assert container["name"] == "kserve-container"
    assert container["command"] == ["python", "-m", "predictor"]
    assert container["args"] == [
        "--model-dir=/mnt/models",
        "--model-name=clef-flash",
        "--engine=auto",
        "--dp=4",
        "--max-model-len=4096",
        "--http_port=8080",
        "--host=0.0.0.0",
        "--shutdown-delay=5",
        "--drain-timeout=20",
        "--log-level=debug",
    ]
    assert container["env"] == [
        {"name": "VLLM_CACHE_ROOT", "value": "/var/cache/clef/vllm"},
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": "/var/cache/clef/inductor"},
        {"name": "TRITON_CACHE_DIR", "value": "/var/cache/clef/triton"},
        {"name": "TRITON_CACHE_AUTOTUNING", "value": "1"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
        {"name": "STORAGE_URI", "value": "hf://cloudflare/clef-flash-fp8"},
    ]
    # Limits equal to the requests where the spec sets none: KServe's defaulter would add 1 CPU / 2Gi.
    assert container["resources"] == {
        "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "4"},
        "limits": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "4"},
    }
    assert container["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "compile-cache", "mountPath": "/var/cache/clef"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "home", "mountPath": "/home/clef"},
    ]


def test_container_is_restricted_and_read_only() -> None:
    """What the Pod Security Standard `restricted` checks, with writable volumes where the predictor writes."""
    container = _isvc()["spec"]["predictor"]["containers"][0]
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_probes_wait_for_warm_up_and_liveness_checks_the_process() -> None:
    container = _isvc()["spec"]["predictor"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/v1/models/clef-flash", "port": 8080, "scheme": "HTTP"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": 8080, "scheme": "HTTP"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60
    custom = _isvc(predictor={"startupProbe": {"periodSeconds": 20, "failureThreshold": 270}})
    assert custom["spec"]["predictor"]["containers"][0]["startupProbe"]["failureThreshold"] == 270


def test_api_keys_come_from_the_named_secret() -> None:
    predictor = _isvc(predictor={"apiKeySecret": {"name": "clef-keys"}})["spec"]["predictor"]
    container = predictor["containers"][0]
    assert "--api-key-file=/etc/clef/api-keys/keys" in container["args"]
    assert {"name": "api-keys", "mountPath": "/etc/clef/api-keys", "readOnly": True} in container["volumeMounts"]
    assert {
        "name": "api-keys",
        "secret": {"secretName": "clef-keys", "items": [{"key": "keys", "path": "keys"}], "defaultMode": 0o440},
    } in predictor["volumes"]
    assert not any(arg.startswith("--api-key-file") for arg in _isvc()["spec"]["predictor"]["containers"][0]["args"])


def test_pod_placement_and_shm() -> None:
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    predictor = _isvc(tolerations=[toleration], replicas=3, predictor={"shmSize": "32Gi"})["spec"]["predictor"]
    assert predictor["nodeSelector"] == {"cloud.google.com/gke-nodepool": "h100-pool"}
    assert predictor["tolerations"] == [toleration]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (3, 3)
    assert predictor["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}},
        {"name": "compile-cache", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "home", "emptyDir": {"sizeLimit": "1Gi"}},
    ]
    assert "tolerations" not in _isvc()["spec"]["predictor"]


def test_pod_security_context_makes_volumes_writable_by_the_predictor() -> None:
    # The image's group (docker/predictor.Dockerfile) owns the volumes Kubernetes can manage, so the
    # compile cache on a fresh emptyDir or claim is writable by the non-root predictor.
    predictor = _isvc()["spec"]["predictor"]
    assert predictor["securityContext"] == {
        "fsGroup": 10001,
        "fsGroupChangePolicy": "OnRootMismatch",
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # Knative Serving rejects a pod securityContext unless its podspec-securitycontext feature is on.
    assert "securityContext" not in _isvc(deploymentMode="Knative")["spec"]["predictor"]


@pytest.mark.parametrize(
    "source",
    [
        {"persistentVolumeClaim": {"claimName": "clef-compile-cache"}},
        {"hostPath": {"path": "/var/cache/clef", "type": "DirectoryOrCreate"}},
        {"emptyDir": {"sizeLimit": "20Gi"}},
    ],
)
def test_compile_cache_volume_is_the_specs_source(source: dict[str, Any]) -> None:
    spec = _spec(predictor={"compileCache": source})
    isvc = b.build_inferenceservice(b.Placement(decision="clef", namespace="ml", pool=POOL, spec=spec))
    predictor = isvc["spec"]["predictor"]
    assert predictor["volumes"][:2] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
        {"name": "compile-cache", **source},
    ]
    predictor["volumes"][1][next(iter(source))]["changed"] = True  # the body is a copy, not the spec's dict
    assert spec.predictor.compileCache == source


def test_pool_overrides_and_metadata() -> None:
    body = _isvc(
        poolOverrides=[{"name": "h100-pool", "replicas": 2, "gpusPerReplica": 8}],
        deploymentMode="Knative",
        predictor={"resources": {"requests": {"cpu": "8"}}},
    )
    predictor = body["spec"]["predictor"]
    assert predictor["minReplicas"] == 2 and "--dp=8" in predictor["containers"][0]["args"]
    assert predictor["containers"][0]["resources"]["requests"] == {"cpu": "8", "nvidia.com/gpu": "8"}
    assert body["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Knative"
    assert body["metadata"]["labels"]["clef-serving.io/decision"] == "clef"
    assert body["apiVersion"] == "serving.kserve.io/v1beta1" and body["kind"] == "InferenceService"


def test_adopted_by_its_clefdecision() -> None:
    body = _isvc()
    owner = {
        "apiVersion": "clef-serving.io/v1alpha1",
        "kind": "ClefDecision",
        "metadata": {"name": "clef", "namespace": "ml", "uid": "u-1"},
    }
    kopf.adopt(body, owner=owner)  # type: ignore[arg-type]
    (ref,) = body["metadata"]["ownerReferences"]
    assert ref == {
        "apiVersion": "clef-serving.io/v1alpha1",
        "kind": "ClefDecision",
        "name": "clef",
        "uid": "u-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_drift_is_judged_on_managed_fields_only() -> None:
    desired = _isvc()
    live = copy.deepcopy(desired)
    # What others add (KServe's defaults, foreign labels, status) is not drift.
    live["spec"]["predictor"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] = "1Gi"
    live["spec"]["predictor"]["timeout"] = 60
    live["metadata"]["labels"]["team"] = "ml"
    live["status"] = {"url": "http://x"}
    assert not b.drifted(live, desired)
    for edit in (
        lambda o: o["spec"]["predictor"].update(minReplicas=7),
        lambda o: o["spec"]["predictor"]["containers"][0]["args"].append("--debug"),
        lambda o: o["spec"]["predictor"]["containers"][0]["env"].pop(),
        lambda o: o["metadata"]["labels"].pop("clef-serving.io/pool"),
        lambda o: o["spec"]["predictor"].pop("affinity"),
    ):
        changed = copy.deepcopy(live)
        edit(changed)
        assert b.drifted(changed, desired)


def test_names_are_unique_per_label_key_and_sticky() -> None:
    gke, karpenter = ("cloud.google.com/gke-nodepool", "gpu"), ("karpenter.sh/nodepool", "gpu")
    names = b.assign_names("clef", [karpenter, gke], {}, None)
    assert names[gke] == "clef-gpu" and names[karpenter].startswith("clef-gpu-") and len(set(names.values())) == 2
    # A pool keeps the name it has, whichever pools appear later.
    kept = b.assign_names("clef", [gke, karpenter], {karpenter: "clef-gpu"}, None)
    assert kept[karpenter] == "clef-gpu" and kept[gke] != "clef-gpu"


def test_capability_affinity_admits_exactly_the_capable_nodes() -> None:
    def admitted(affinity: dict[str, Any], major: int, minor: int) -> bool:
        labels = {"nvidia.com/gpu.compute.major": major, "nvidia.com/gpu.compute.minor": minor}
        terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        ops = {"Gt": lambda v, x: int(v) > int(x[0]), "In": lambda v, x: str(v) in x}
        return any(all(ops[e["operator"]](labels[e["key"]], e["values"]) for e in t["matchExpressions"]) for t in terms)

    fp8 = b.capability_affinity((8, 9))
    assert [admitted(fp8, *cc) for cc in [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]] == [
        False,
        False,
        True,
        True,
        True,
        True,
    ]
    nvfp4 = b.capability_affinity((10, 0))
    assert [admitted(nvfp4, *cc) for cc in [(9, 0), (10, 0), (12, 0)]] == [False, True, True]


def test_controls_reach_the_predictor() -> None:
    body = _isvc(
        autoscaling={"minReplicas": 1, "maxReplicas": 4, "scaleMetric": "concurrency", "scaleTarget": 8},
        serviceAccountName="clef-reader",
        imagePullSecrets=[{"name": "regcred"}],
        priorityClassName="serving",
        affinity={"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        predictor={
            "env": [{"name": "HF_HUB_OFFLINE", "value": "0"}],
            "envFrom": [{"secretRef": {"name": "s3-credentials"}}],
        },
    )
    predictor = body["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (1, 4)
    assert (predictor["scaleMetric"], predictor["scaleTarget"]) == ("concurrency", 8)
    assert predictor["serviceAccountName"] == "clef-reader"
    assert predictor["imagePullSecrets"] == [{"name": "regcred"}]
    assert predictor["priorityClassName"] == "serving"
    assert set(predictor["affinity"]) == {"podAntiAffinity", "nodeAffinity"}
    container = predictor["containers"][0]
    offline = [item for item in container["env"] if item["name"] == "HF_HUB_OFFLINE"]
    assert offline == [{"name": "HF_HUB_OFFLINE", "value": "0"}]  # the user's value replaces the default, once
    assert {"name": "TRANSFORMERS_OFFLINE", "value": "1"} in container["env"]
    assert container["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]


def test_keda_scales_on_the_predictors_own_metric() -> None:
    body = _isvc(
        autoscaling={
            "minReplicas": 1,
            "maxReplicas": 8,
            "keda": {"metric": "clef_queue_depth", "target": "4", "serverAddress": "http://prometheus.monitoring:9090"},
        }
    )
    assert body["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "keda"
    (metric,) = body["spec"]["predictor"]["autoScaling"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["query"].startswith("sum(clef_queue_depth{")
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "4"}


def test_update_patch_is_guarded_and_keeps_foreign_metadata() -> None:
    desired = _isvc(predictor={"maxModelLen": 2048})
    current = {
        "metadata": {"resourceVersion": "7", "labels": {"team": "ml"}, "annotations": {"note": "x"}},
        "spec": {"predictor": {"old": True}},
    }
    ops = b.build_update_patch(current, desired)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    by_path = {op["path"]: op["value"] for op in ops[1:]}
    assert by_path["/spec"] == desired["spec"]
    assert by_path["/metadata/labels"]["team"] == "ml"
    assert by_path["/metadata/annotations"]["note"] == "x"


def test_args_parse_with_the_predictors_own_parser() -> None:
    from predictor import cli

    container = _isvc(gpusPerReplica=2, predictor={"maxModelLen": 4096})["spec"]["predictor"]["containers"][0]
    assert container["command"][-2:] == ["-m", "predictor"]
    args = cli.build_parser().parse_args(container["args"])
    assert (
        str(args.model_dir),
        args.model_name,
        args.engine,
        args.data_parallel_size,
        args.max_model_len,
        args.http_port,
    ) == ("/mnt/models", "clef-flash", "auto", 2, 4096, 8080)
    assert args.host == "0.0.0.0"
    # SIGTERM's delay and drain fit Kubernetes' default grace period of 30 s (a ServingRuntime cannot raise it).
    assert args.shutdown_delay + args.drain_timeout < 30
    keyed = _isvc(predictor={"apiKeySecret": {"name": "clef-keys"}})["spec"]["predictor"]["containers"][0]
    assert str(cli.build_parser().parse_args(keyed["args"]).api_key_file) == "/etc/clef/api-keys/keys"


def test_standard_mode_replaces_pods_without_surge() -> None:
    # A surge pod would need GPUs that a full pool does not have, and the rollout would never end; a rolling
    # update with maxUnavailable 1 would make a one-replica Deployment Available (KServe: Ready) with no pod ready.
    predictor = _isvc()["spec"]["predictor"]
    assert predictor["deploymentStrategy"] == {"type": "Recreate"}
    # Knative makes revisions, not Deployments: KServe's deploymentStrategy is for Standard mode only.
    assert "deploymentStrategy" not in _isvc(deploymentMode="Knative")["spec"]["predictor"]
