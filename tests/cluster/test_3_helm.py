"""Helm life on the real control plane: an upgrade that rolls the predictors, and an uninstall that leaves
nothing behind (the garbage collector follows the ownerReferences). Runs last: it uninstalls the chart."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from tests.cluster.helpers import DECISION_LABEL, FP8_POOLS, is_ready, pod_ready, pods_of
from tests.cluster.kube import CHART, DELETE_WAIT, README_NS, RELEASE, SYSTEM_NS, Kube, Operator
from tests.polling import eventually

pytestmark = pytest.mark.cluster

NEW_TAG = "0.1.1-upgrade"


def none_left(kube: Kube, kind: str, namespace: str, selector: str | None = None) -> bool:
    """Whether no object of ``kind`` (matching ``selector``) is left in ``namespace``."""
    return kube.get(kind, namespace=namespace, selector=selector) == []


def test_helm_upgrade_with_a_new_predictor_image_rolls_the_predictors(
    kube: Kube, operator: Operator, readme_decision: dict[str, Any]
) -> None:
    kube.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        f"--namespace={SYSTEM_NS}",
        "--reuse-values",
        f"--set=predictor.image.tag={NEW_TAG}",
        "--wait",
        "--timeout=3m",
    )
    # The Deployment rolled its (kwok) pod; the operator process here is restarted the same way, with the
    # Deployment's new environment.
    operator.stop()
    operator.start()

    def rolled() -> bool:
        for pool in FP8_POOLS:
            pods = pods_of(kube, f"clef-flash-{pool}", README_NS)
            images = {c["image"] for p in pods for c in p["spec"]["containers"] if c["name"] == "kserve-container"}
            if not pods or images != {f"ghcr.io/clef-serving/clef-predictor:{NEW_TAG}"}:
                return False
            if not all(pod_ready(p) and p["metadata"].get("deletionTimestamp") is None for p in pods):
                return False
        return is_ready(kube.get("clefdecision", "clef-flash", README_NS))

    eventually(rolled, "every predictor pod to run the new image, Ready", timeout=180)


def test_helm_uninstall_leaves_no_orphans(kube: Kube, operator: Operator, readme_decision: dict[str, Any]) -> None:
    token = operator.kubeconfig()
    operator.stop()
    kube.helm("uninstall", RELEASE, f"--namespace={SYSTEM_NS}", "--wait", "--timeout=3m")
    instance = f"app.kubernetes.io/instance={RELEASE}"
    for kind in ("deployments", "replicasets", "pods", "serviceaccounts", "roles", "rolebindings"):
        eventually(partial(none_left, kube, kind, SYSTEM_NS, instance), f"no {kind} of the release left")
    for kind in ("clusterroles", "clusterrolebindings", "clusterkopfpeerings"):
        assert kube.get(kind, selector=instance) == [], kind
    # The ServiceAccount is gone, so its tokens are refused.
    refused = kube.run(f"--kubeconfig={token}", "get", "clefdecisions", "-A", check=False)
    assert refused.returncode != 0 and "Unauthorized" in refused.stderr, refused.stderr
    # Helm keeps CRDs (and so the ClefDecisions); deleting them removes every child through the garbage
    # collector, with no operator running.
    kube.run("delete", "clefdecisions", "--all", "--all-namespaces", "--wait=true", DELETE_WAIT)
    for kind in ("inferenceservices", "deployments", "pods"):
        eventually(partial(none_left, kube, kind, README_NS), f"no {kind} left in {README_NS}")
    # Every namespace's children (other tests' ClefDecisions too) go through the garbage collector: not at once.
    eventually(lambda: kube.get("inferenceservices", selector=DECISION_LABEL) == [], "no InferenceService left")
