"""The operator against hand edits of what marks its objects, a long API-server outage and its own restart, on the
real control plane, run as the chart's defaults run it (peering on) with the chart's ServiceAccount token. Each
scenario has its own namespace and pool, named under the label key of the cluster-life scenarios. Runs before
test_3_helm, which uninstalls the chart."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from clef_cluster.processes import stop
from clef_operator.constants import DECISION_LABEL, PEERING_LIFETIME, POOL_ANNOTATION
from tests.cluster import test_2_cluster_life
from tests.cluster.helpers import pool_status
from tests.cluster.kube import Kube, Operator
from tests.cluster.test_2_cluster_life import get_decision, serving_pool, wait_serving
from tests.cluster.test_2b_operator_limits import isvc_create_refusals
from tests.polling import eventually

pytestmark = pytest.mark.cluster
nodes_to_remove = test_2_cluster_life.nodes_to_remove  # the fixture: nodes a scenario added, deleted after it

# Seconds of watching after a repair in which a wrong write would show up (the operator's second InferenceService
# came within 2 s of the edit, and its 409s up to 89 a minute).
SETTLE = 15.0
OUTAGE = 90.0  # seconds the API server is down
# The longest Kubernetes' own components may take to act again after the outage: each of their watches (client-go's
# reflector) waits up to 30 s, doubled by jitter, between failed attempts, and attempts keep failing while the API
# server's storage initialises. On a loaded 2-core machine the change made after the outage served 95 s after the API
# server answered again (the node's pods, marked not Ready during the outage, Ready again 65 s after it).
RECOVERY = 300.0
PEERING = "clef-operator"  # the chart's default peering object
# The longest a restarted operator may take to apply a change while a killed one's keep-alive is still live: the
# operator's peering lifetime (20 s) and its own start. With kopf's default lifetime (60 s) it took 60.1 s.
MAX_RESTART_WAIT = 35.0


def metadata(kube: Kube, name: str, namespace: str) -> dict[str, Any]:
    return kube.get("inferenceservice", name, namespace)["metadata"]


def only_isvc(kube: Kube, namespace: str) -> dict[str, Any]:
    """The namespace's one InferenceService (fails when there are more or none)."""
    items = kube.get("inferenceservices", namespace=namespace)
    assert len(items) == 1, [i["metadata"]["name"] for i in items]
    return items[0]


def test_edited_pool_annotation_is_put_back_on_the_same_inferenceservice(
    kube: Kube, operator: Operator, nodes_to_remove: list[str]
) -> None:
    ns = "edit-pool"
    serving_pool(kube, nodes_to_remove, ns, "annotated")
    name = f"{ns}-annotated"
    uid = metadata(kube, name, ns)["uid"]
    refusals = isvc_create_refusals(kube)
    kube.run("annotate", "inferenceservice", name, "-n", ns, f"{POOL_ANNOTATION}=elsewhere", "--overwrite")
    eventually(
        lambda: metadata(kube, name, ns)["annotations"][POOL_ANNOTATION] == "annotated",
        "the pool annotation to be put back",
        timeout=30,
    )
    time.sleep(SETTLE)
    assert only_isvc(kube, ns)["metadata"]["uid"] == uid, "the InferenceService was replaced"
    assert metadata(kube, name, ns)["annotations"][POOL_ANNOTATION] == "annotated"
    assert pool_status(get_decision(kube, ns))["annotated"]["state"] == "Serving"
    assert isvc_create_refusals(kube) == refusals


def test_edited_decision_label_is_put_back_without_a_409_storm(
    kube: Kube, operator: Operator, nodes_to_remove: list[str]
) -> None:
    ns = "edit-label"
    serving_pool(kube, nodes_to_remove, ns, "labelled")
    name = f"{ns}-labelled"
    uid = metadata(kube, name, ns)["uid"]
    refusals = isvc_create_refusals(kube)
    kube.run("label", "inferenceservice", name, "-n", ns, f"{DECISION_LABEL}=someone-else", "--overwrite")
    eventually(
        lambda: metadata(kube, name, ns)["labels"][DECISION_LABEL] == ns,
        "the decision label to be put back",
        timeout=30,
    )
    time.sleep(SETTLE)
    assert only_isvc(kube, ns)["metadata"]["uid"] == uid, "the InferenceService was replaced"
    assert pool_status(get_decision(kube, ns))["labelled"]["state"] == "Serving"
    # One refused create finds the object; after the repair the list by label finds it again.
    assert isvc_create_refusals(kube) - refusals <= 1
    # Later hand edits of the same object are still put back.
    edit = {"spec": {"predictor": {"minReplicas": 3, "maxReplicas": 3}}}
    kube.run("patch", "inferenceservice", name, "-n", ns, "--type=merge", "-p", json.dumps(edit))

    def reverted() -> bool:
        predictor = kube.get("inferenceservice", name, ns)["spec"]["predictor"]
        return predictor.get("minReplicas") == 1 and predictor.get("maxReplicas") == 1

    eventually(reverted, "a later hand edit to be reverted", timeout=30)


def test_a_90_s_api_server_outage_with_peering_on_is_survived(
    kube: Kube, operator: Operator, nodes_to_remove: list[str]
) -> None:
    ns = "outage"
    serving_pool(kube, nodes_to_remove, ns, "outage")
    assert f"--peering={PEERING}" in operator.container()["args"], "the chart's defaults run with peering"
    logged = len(operator.log_text())
    stop(kube.cluster.process("kube-apiserver"))
    try:
        time.sleep(OUTAGE)
    finally:
        kube.cluster.restart("kube-apiserver")
    eventually(
        lambda: kube.run("get", "--raw", "/readyz", check=False).returncode == 0,
        "the API server to answer again",
        timeout=120,
    )
    time.sleep(SETTLE)  # the keep-alive's retries ended the operator seconds after the API server came back
    assert operator.process is not None and operator.process.poll() is None, operator.log_text()[logged:][-3000:]
    kube.run("patch", "clefdecision", ns, "-n", ns, "--type=merge", "-p", '{"spec": {"replicas": 2}}')
    eventually(
        lambda: kube.get("inferenceservice", f"{ns}-outage", ns)["spec"]["predictor"].get("minReplicas") == 2,
        "a change made after the outage to be applied",
        timeout=60,
    )
    assert "has failed" not in operator.log_text()[logged:]
    # The change served: KServe, the controllers, the scheduler and the node acted on it, so the cluster is whole
    # again for the scenarios after this one.
    wait_serving(kube, ns, "outage", replicas=2, timeout=RECOVERY)


def peers(kube: Kube) -> dict[str, Any]:
    """The keep-alives in the chart's peering object, by peer."""
    return (kube.get("clusterkopfpeering", PEERING) or {}).get("status") or {}


def test_a_killed_operators_restart_waits_at_most_the_peering_lifetime(
    kube: Kube, operator: Operator, nodes_to_remove: list[str]
) -> None:
    """A killed operator leaves its keep-alive in the peering object; a restarted one of lower priority pauses until
    it expires (kopf's default lifetime, 60 s, kept it waiting ~56 s). The time from the restart to a change
    applied is measured."""
    ns = "restart-wait"
    serving_pool(kube, nodes_to_remove, ns, "rewait")
    high = 2**40  # above any random priority (at most 2**31 - 1)
    try:
        operator.kill()
        operator.start(f"--priority={high}")
        eventually(
            lambda: any(peer.get("priority") == high for peer in peers(kube).values()),
            "the high-priority operator's keep-alive",
            timeout=60,
        )
        operator.kill()  # its keep-alive stays, fresh
        started = time.monotonic()
        operator.start("--priority=1")
        kube.run("patch", "clefdecision", ns, "-n", ns, "--type=merge", "-p", '{"spec": {"replicas": 2}}')
        eventually(
            lambda: kube.get("inferenceservice", f"{ns}-rewait", ns)["spec"]["predictor"].get("minReplicas") == 2,
            "the restarted operator to apply a change",
            timeout=120,
        )
        waited = time.monotonic() - started
        print(f"restarted operator applied a change {waited:.1f} s after it started (lifetime {PEERING_LIFETIME} s)")
        assert waited < MAX_RESTART_WAIT, waited
    finally:
        operator.stop()
        operator.start()
