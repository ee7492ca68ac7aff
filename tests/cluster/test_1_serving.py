"""The README's path on a real API server: helm install, kubectl apply of the ClefDecision, KServe's
Deployments, pods placed by the real scheduler, and the ClefDecision Ready with per-pool status."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.helpers import (
    DECISION_LABEL,
    FP8_POOLS,
    POOL_NODES,
    TOO_OLD_POOLS,
    is_ready,
    pod_ready,
    pods_of,
    pool_status,
)
from tests.cluster.kube import OPERATOR_DEPLOYMENT, README_NS, REPO, SYSTEM_NS, Kube
from tests.polling import eventually

pytestmark = pytest.mark.cluster

NS = README_NS
REPLICAS = {"h100-pool": 2}  # the example's poolOverrides; every other pool runs 1


@pytest.fixture
def served(readme_decision: dict[str, Any], kube: Kube) -> dict[str, Any]:
    """The README's ClefDecision as it is now (Ready)."""
    return kube.get("clefdecision", "clef-flash", NS)


def test_chart_objects_are_accepted(kube: Kube, installed_chart: dict[str, Any]) -> None:
    crd = kube.get("crd", "clefdecisions.clef-serving.io")
    assert any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])
    assert kube.get("clusterkopfpeering", "clef-operator") is not None
    assert kube.get("clusterrole", "clef-serving-operator-cluster") is not None
    deployment = kube.get("deployment", OPERATOR_DEPLOYMENT, SYSTEM_NS)
    assert deployment["status"].get("readyReplicas") == 1, deployment["status"]
    (pod,) = kube.get("pods", namespace=SYSTEM_NS, selector="app.kubernetes.io/component=operator")
    assert pod["spec"]["nodeName"] == "system-pool-0" and pod_ready(pod)


def test_plain_manifests_match_the_helm_release(kube: Kube, installed_chart: dict[str, Any]) -> None:
    """manifests/ is the chart rendered: on top of the Helm release, kubectl finds nothing to change but the
    namespace (manifests/00-namespace.yaml, not part of the chart: it adds Pod Security's restricted level)."""
    chart_files = sorted(str(p) for p in (REPO / "manifests").glob("*.yaml") if p.name != "00-namespace.yaml")
    diff = kube.run("diff", *[f"--filename={f}" for f in chart_files], check=False)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    kube.run("apply", "-f", str(REPO / "manifests"))
    labels = kube.get("namespace", SYSTEM_NS)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # The operator's pod template passes the restricted level that the namespace now enforces.
    kube.run("rollout", "restart", f"deployment/{OPERATOR_DEPLOYMENT}", f"--namespace={SYSTEM_NS}")
    kube.run("rollout", "status", f"deployment/{OPERATOR_DEPLOYMENT}", f"--namespace={SYSTEM_NS}", "--timeout=90s")


def test_every_eligible_pool_serves_and_the_decision_is_ready(kube: Kube, served: dict[str, Any]) -> None:
    pools = pool_status(served)
    assert set(pools) == FP8_POOLS | TOO_OLD_POOLS
    for name in FP8_POOLS:
        assert pools[name]["state"] == "Serving" and pools[name]["ready"] is True, pools[name]
        assert pools[name]["inferenceService"] == f"clef-flash-{name}"
    assert served["status"]["poolsReady"] == "4/4"


@pytest.mark.parametrize("name", sorted(TOO_OLD_POOLS))
def test_too_old_pools_get_nothing_and_say_why(kube: Kube, served: dict[str, Any], name: str) -> None:
    entry = pool_status(served)[name]
    assert entry["state"] == "Ineligible" and entry["reason"] == "ComputeCapabilityTooLow", entry
    assert "below the required 8.9" in entry["message"]
    assert "inferenceService" not in entry
    nodes = POOL_NODES[name]
    assert not [p for p in kube.get("pods", namespace=NS) if p["spec"].get("nodeName") in nodes]


def test_one_inferenceservice_per_eligible_pool_owned_by_the_decision(kube: Kube, served: dict[str, Any]) -> None:
    isvcs = {
        i["metadata"]["name"]: i
        for i in kube.get("inferenceservices", namespace=NS, selector=f"{DECISION_LABEL}=clef-flash")
    }
    assert set(isvcs) == {f"clef-flash-{pool}" for pool in FP8_POOLS}
    for isvc in isvcs.values():
        (owner,) = isvc["metadata"]["ownerReferences"]
        assert owner["uid"] == served["metadata"]["uid"] and owner["controller"] is True
        assert is_ready(isvc), isvc["status"]


@pytest.mark.parametrize("pool", sorted(FP8_POOLS))
def test_kserve_runs_the_predictor_on_the_pool_nodes_only(kube: Kube, served: dict[str, Any], pool: str) -> None:
    isvc = f"clef-flash-{pool}"
    replicas = REPLICAS.get(pool, 1)
    assert kube.get("deployment", f"{isvc}-predictor", NS) is not None, f"KServe made no Deployment for {isvc}"
    # KServe calls an InferenceService Ready once its Deployment is Available (here: 1 of 2 replicas for the
    # 2-replica pool), so the last replica may still be starting when the ClefDecision turns Ready.
    eventually(
        lambda: kube.get("deployment", f"{isvc}-predictor", NS)["status"].get("readyReplicas") == replicas,
        f"{replicas} ready replicas of {isvc}",
    )
    pods = pods_of(kube, isvc, NS)
    assert len(pods) == replicas
    for pod in pods:
        assert pod_ready(pod), pod["status"]
        assert pod["spec"]["nodeName"] in POOL_NODES[pool]
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "kserve-container"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
