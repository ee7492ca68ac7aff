"""The deployment backend on a real control plane WITHOUT KServe: a cluster of its own (no KServe controller, no
KServe CRD), the chart installed with its default values (``operator.defaultBackend: auto``), the README's
ClefDecision applied. The operator finds no InferenceService resource in API discovery and serves every eligible
pool with a Deployment and a Service, whose pods the real scheduler places on the pool's capable nodes. With KEDA's
ScaledObject CRD installed (no KEDA controller), ``autoscaling.keda`` gets a ScaledObject per autoscaled pool that
the real API server validates against KEDA's schema."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from clef_cluster.cluster import wait_established
from tests.cluster.helpers import (
    DECISION_LABEL,
    FP8_POOLS,
    POOL_NODES,
    TOO_OLD_POOLS,
    apply_readme_decision,
    is_ready,
    pod_ready,
)
from tests.cluster.helpers import pool_status as pools_of
from tests.cluster.kube import (
    README_NS,
    REPO,
    Kube,
    Operator,
    cluster_for,
    install_chart,
    operator_for,
)
from tests.deploy.chart import load_yaml_objects
from tests.polling import eventually

pytestmark = pytest.mark.cluster

NS = README_NS
REPLICAS = {"h100-pool": 2}  # the example's poolOverrides; every other pool runs 1
PREDICTOR_LABEL = "clef-serving.io/predictor"
ISVC_CRD = "inferenceservices.serving.kserve.io"
# KEDA v2.17.2's ScaledObject CRD (tests/data/keda-crds/README.md).
KEDA_CRD = REPO / "tests" / "data" / "keda-crds" / "keda.sh_scaledobjects.yaml"


@pytest.fixture(scope="module")
def bare_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """A cluster of its own without KServe (controller and CRDs) and without the real node (its pool would get a
    share of the README's ClefDecision, whose requests do not fit its 2 CPUs), kubectl/helm as its admin."""
    with cluster_for(tmp_path_factory, "cluster-without-kserve", with_kserve=False, with_node=False) as running:
        yield Kube(running)


@pytest.fixture(scope="module")
def bare_operator(bare_kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """The chart installed with its default values, and the operator running with its ServiceAccount's token."""
    install_chart(bare_kube)
    with operator_for(bare_kube, tmp_path_factory.mktemp("operator-without-kserve")) as running:
        yield running


@pytest.fixture(scope="module")
def served(bare_kube: Kube, bare_operator: Operator) -> dict[str, Any]:
    """The README's ClefDecision applied with kubectl into ml-serving, Ready."""
    return apply_readme_decision(bare_kube)


SCALED_OBJECTS = "scaledobjects.keda.sh"


def install_keda_crd(kube: Kube) -> None:
    """KEDA's ScaledObject CRD installed (again: no change) and established. KEDA's controller is not run."""
    kube.run("apply", "--server-side", "-f", str(KEDA_CRD))
    wait_established(kube.cluster, load_yaml_objects(KEDA_CRD))


def owned(kube: Kube, kind: str) -> dict[str, dict[str, Any]]:
    """The README ClefDecision's objects of ``kind``, by name."""
    return {o["metadata"]["name"]: o for o in kube.get(kind, namespace=NS, selector=f"{DECISION_LABEL}=clef-flash")}


# Seconds of watching after a repair in which a wrong write (a second object, a refused create per pass) would show.
SETTLE = 15.0


def create_refusals(kube: Kube, resource: str) -> float:
    """POSTs of ``resource`` the API server answered 409 (its own request counter, all clients)."""
    metrics = kube.run("get", "--raw", "/metrics").stdout
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("apiserver_request_total{")
        and f'resource="{resource}"' in line
        and 'verb="POST"' in line
        and 'code="409"' in line
    )


def edited_decision_labels_are_put_back(kube: Kube, operator: Operator, kinds: dict[str, str]) -> None:
    """The decision label of an autoscaled pool's ``kinds`` (kubectl's name: the API server's resource) edited by
    hand is put back on the same objects, with at most one refused create each, and the pool keeps Serving."""
    pool = sorted(FP8_POOLS - set(REPLICAS))[0]
    name = f"clef-flash-{pool}"
    uids = {kind: kube.get(kind, name, NS)["metadata"]["uid"] for kind in kinds}
    refusals = {kind: create_refusals(kube, resource) for kind, resource in kinds.items()}
    for kind in kinds:
        kube.run("label", kind, name, f"--namespace={NS}", f"{DECISION_LABEL}=someone-else", "--overwrite")
    # These objects are not watched: a change to the pool's Deployment (a foreign annotation, not drift) brings
    # the next pass at once instead of at the periodic resync.
    kube.run(
        "annotate", "deployment", name, f"--namespace={NS}", f"example.com/touched={time.time_ns()}", "--overwrite"
    )
    for kind in kinds:
        eventually(
            lambda kind=kind: kube.get(kind, name, NS)["metadata"]["labels"].get(DECISION_LABEL) == "clef-flash",
            f"the decision label of the {kind} {name} to be put back",
            timeout=60,
        )
    time.sleep(SETTLE)
    for kind, resource in kinds.items():
        same_name = [o["metadata"]["uid"] for o in kube.get(kind, namespace=NS) if o["metadata"]["name"] == name]
        assert same_name == [uids[kind]], f"the {kind} was replaced or duplicated"
        # One refused create finds the object; after the repair the list by label finds it again.
        assert create_refusals(kube, resource) - refusals[kind] <= 1, kind
    assert pools_of(kube.get("clefdecision", "clef-flash", NS))[pool]["state"] == "Serving"
    assert "Traceback" not in operator.log_text()


def test_the_cluster_has_no_kserve(bare_kube: Kube) -> None:
    assert bare_kube.get("crd", ISVC_CRD) is None
    resources = bare_kube.run("api-resources", "--api-group=serving.kserve.io", "-o", "name").stdout
    assert resources.strip() == ""
    assert not [p for p in bare_kube.cluster.processes if p.name.startswith("kserve")]


def test_the_decision_is_ready_on_the_deployment_backend(bare_kube: Kube, served: dict[str, Any]) -> None:
    assert served["status"]["backend"] == "deployment"
    pools = pools_of(served)
    assert set(pools) == FP8_POOLS | TOO_OLD_POOLS
    for name in FP8_POOLS:
        entry = pools[name]
        assert entry["state"] == "Serving" and entry["ready"] is True, entry
        assert entry["deployment"] == f"clef-flash-{name}" and "inferenceService" not in entry
        assert entry["url"] == f"http://clef-flash-{name}.{NS}.svc"
    for name in TOO_OLD_POOLS:
        assert pools[name]["state"] == "Ineligible" and pools[name]["reason"] == "ComputeCapabilityTooLow"
    assert served["status"]["poolsReady"] == "4/4"
    ready = next(c for c in served["status"]["conditions"] if c["type"] == "PredictorsReady")
    assert ready["message"] == "4/4 Deployments ready"


def test_a_deployment_and_a_service_per_eligible_pool_owned_by_the_decision(
    bare_kube: Kube, served: dict[str, Any]
) -> None:
    expected = {f"clef-flash-{pool}" for pool in FP8_POOLS}
    deployments, services = owned(bare_kube, "deployments"), owned(bare_kube, "services")
    assert set(deployments) == set(services) == expected
    for obj in [*deployments.values(), *services.values()]:
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["uid"] == served["metadata"]["uid"] and owner["controller"] is True
    for name, service in services.items():
        assert service["spec"]["selector"] == {DECISION_LABEL: "clef-flash", PREDICTOR_LABEL: name}
        assert service["spec"]["ports"][0]["port"] == 80 and service["spec"]["ports"][0]["targetPort"] == "http"
    assert owned(bare_kube, "horizontalpodautoscalers") == {}  # fixed replica counts: no autoscaler


@pytest.mark.parametrize("pool", sorted(FP8_POOLS))
def test_the_scheduler_runs_the_predictor_on_the_pool_nodes_only(
    bare_kube: Kube, served: dict[str, Any], pool: str
) -> None:
    name = f"clef-flash-{pool}"
    replicas = REPLICAS.get(pool, 1)
    deployment = bare_kube.get("deployment", name, NS)
    assert deployment["status"].get("availableReplicas") == replicas, deployment["status"]
    pods = bare_kube.get("pods", namespace=NS, selector=f"{PREDICTOR_LABEL}={name}")
    assert len(pods) == replicas
    for pod in pods:
        assert pod_ready(pod), pod["status"]
        assert pod["spec"]["nodeName"] in POOL_NODES[pool]
        (container,) = pod["spec"]["containers"]
        assert container["name"] == "kserve-container"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/mnt/models"]["subPath"] == "clef-flash-fp8" and mounts["/mnt/models"]["readOnly"] is True


def test_nothing_runs_on_the_too_old_pools(bare_kube: Kube, served: dict[str, Any]) -> None:
    too_old = set().union(*(POOL_NODES[name] for name in TOO_OLD_POOLS))
    assert not [p for p in bare_kube.get("pods", namespace=NS) if p["spec"].get("nodeName") in too_old]


def test_the_api_server_keeps_what_the_operator_wrote(
    bare_kube: Kube, bare_operator: Operator, served: dict[str, Any]
) -> None:
    """Nothing the API server defaults or normalizes looks like drift: no Deployment was rewritten after its
    creation, and no Service is written over 10 s of steady state."""
    for name, deployment in owned(bare_kube, "deployments").items():
        assert deployment["metadata"]["generation"] == 1, (name, deployment["metadata"])
    before = {name: s["metadata"]["resourceVersion"] for name, s in owned(bare_kube, "services").items()}
    time.sleep(10)
    assert {name: s["metadata"]["resourceVersion"] for name, s in owned(bare_kube, "services").items()} == before
    assert "Traceback" not in bare_operator.log_text()


def test_autoscaling_adds_a_horizontal_pod_autoscaler(
    bare_kube: Kube, bare_operator: Operator, served: dict[str, Any]
) -> None:
    bare_kube.run(
        "patch",
        "clefdecision",
        "clef-flash",
        f"--namespace={NS}",
        "--type=merge",
        "-p",
        '{"spec": {"autoscaling": {"minReplicas": 1, "maxReplicas": 3, "scaleMetric": "cpu", "scaleTarget": 75}}}',
    )
    autoscaled = {f"clef-flash-{pool}" for pool in FP8_POOLS - set(REPLICAS)}  # h100-pool's override stays fixed
    hpas = eventually(
        lambda: (found := owned(bare_kube, "horizontalpodautoscalers")) and set(found) == autoscaled and found,
        "a HorizontalPodAutoscaler per autoscaled pool",
    )
    for name, hpa in hpas.items():
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 3)
        assert hpa["spec"]["metrics"][0]["resource"]["target"] == {"type": "Utilization", "averageUtilization": 75}
    eventually(lambda: is_ready(bare_kube.get("clefdecision", "clef-flash", NS)), "the ClefDecision still Ready")


def test_hand_edited_decision_labels_of_a_service_and_an_autoscaler_are_put_back(
    bare_kube: Kube, bare_operator: Operator, served: dict[str, Any]
) -> None:
    kinds = {"service": "services", "horizontalpodautoscaler": "horizontalpodautoscalers"}
    edited_decision_labels_are_put_back(bare_kube, bare_operator, kinds)


def test_keda_autoscaling_fails_without_keda_then_replaces_the_autoscalers_with_scaled_objects(
    bare_kube: Kube, bare_operator: Operator, served: dict[str, Any]
) -> None:
    keda = {"serverAddress": "http://prometheus.monitoring:9090", "metric": "clef_engine_in_flight", "target": "2"}
    autoscaling = {"minReplicas": 1, "maxReplicas": 3, "scaleMetric": None, "scaleTarget": None, "keda": keda}
    bare_kube.run(
        "patch",
        "clefdecision",
        "clef-flash",
        f"--namespace={NS}",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"autoscaling": autoscaling}}),
    )
    autoscaled = {f"clef-flash-{pool}" for pool in FP8_POOLS - set(REPLICAS)}  # h100-pool's override stays fixed
    autoscaled_pools = FP8_POOLS - set(REPLICAS)

    def failed_naming_keda() -> dict[str, Any] | None:
        pools = pools_of(bare_kube.get("clefdecision", "clef-flash", NS))
        messages = [(pools.get(name) or {}).get("predictorMessage") or "" for name in autoscaled_pools]
        return pools if all("autoscaling.keda needs KEDA" in message for message in messages) else None

    pools = eventually(failed_naming_keda, "the KEDA-autoscaled pools Failed, naming KEDA (not installed)")
    assert all(pools[name]["state"] == "Failed" for name in autoscaled_pools)
    assert set(owned(bare_kube, "horizontalpodautoscalers")) == autoscaled  # left as they were
    install_keda_crd(bare_kube)
    scaled = eventually(
        lambda: (found := owned(bare_kube, SCALED_OBJECTS)) and set(found) == autoscaled and found,
        "a ScaledObject per autoscaled pool, accepted by the API server",
    )
    eventually(lambda: owned(bare_kube, "horizontalpodautoscalers") == {} or None, "no HorizontalPodAutoscaler left")
    for name, obj in scaled.items():
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["uid"] == served["metadata"]["uid"] and owner["controller"] is True
        assert obj["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        assert (obj["spec"]["minReplicaCount"], obj["spec"]["maxReplicaCount"]) == (1, 3)
        (trigger,) = obj["spec"]["triggers"]
        assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
        assert trigger["metadata"] == {
            "serverAddress": keda["serverAddress"],
            "query": f'sum(clef_engine_in_flight{{namespace="{NS}",pod=~"{name}-[a-z0-9]+-[a-z0-9]+"}})',
            "threshold": "2",
        }
    before = {name: o["metadata"]["resourceVersion"] for name, o in scaled.items()}
    time.sleep(5)  # nothing the API server defaults in a ScaledObject reads as drift
    assert {name: o["metadata"]["resourceVersion"] for name, o in owned(bare_kube, SCALED_OBJECTS).items()} == before
    eventually(lambda: is_ready(bare_kube.get("clefdecision", "clef-flash", NS)), "the ClefDecision still Ready")
    assert "Traceback" not in bare_operator.log_text()


def test_a_hand_edited_decision_label_of_a_scaled_object_is_put_back(
    bare_kube: Kube, bare_operator: Operator, served: dict[str, Any]
) -> None:
    edited_decision_labels_are_put_back(bare_kube, bare_operator, {SCALED_OBJECTS: "scaledobjects"})


def test_deleting_the_decision_removes_everything(bare_kube: Kube, served: dict[str, Any]) -> None:
    install_keda_crd(bare_kube)  # when run alone
    bare_kube.run("delete", "clefdecision", "clef-flash", f"--namespace={NS}", "--wait=true", "--timeout=60s")
    for kind in ("deployments", "services", "horizontalpodautoscalers", SCALED_OBJECTS, "replicasets", "pods"):
        eventually(partial(lambda kind: bare_kube.get(kind, namespace=NS) == [] or None, kind), f"no {kind} left")
