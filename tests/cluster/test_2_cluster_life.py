"""Cluster life on the real control plane: nodes that join, go and come back, an operator killed or stopped,
hand edits, deletions. Each scenario has its own namespace and its own pools, named under a label key of its
own (``spec.nodePools.labelKey``), so no scenario disturbs another or the README's ClefDecision."""

from __future__ import annotations

import copy
import json
import random
import time
from functools import partial
from typing import Any

import pytest
import yaml

from clef_cluster.faults import crash_pod
from clef_cluster.nodes import GpuPool
from tests.cluster.helpers import cluster_picture, condition, is_ready, pod_ready, pods_of, pool_status
from tests.cluster.kube import DELETE_WAIT, Kube, Operator
from tests.polling import eventually

pytestmark = pytest.mark.cluster

LABEL_KEY = "pools.example.com/name"


def hopper(name: str) -> GpuPool:
    """An H100 pool under this module's label key."""
    return GpuPool(name, LABEL_KEY, "NVIDIA-H100-80GB-HBM3", "hopper", (9, 0), 8, 1, "p5.48xlarge")


def decision(name: str, pools: list[str], metadata: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """A ClefDecision serving FP8 on the named pools of this module's label key (``metadata`` added to its own)."""
    return {
        "apiVersion": "clef-serving.io/v1alpha1",
        "kind": "ClefDecision",
        "metadata": {"name": name, "namespace": name, **(metadata or {})},
        "spec": {
            "model": {"storageUri": "hf://cloudflare/clef-flash-fp8", "name": "clef-flash"},
            "nodePools": {"labelKey": LABEL_KEY, "include": pools},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "predictor": {"resources": {"requests": {"cpu": "1", "memory": "4Gi"}}},
            **spec,
        },
    }


def start(kube: Kube, name: str, pools: list[str], metadata: dict[str, Any] | None = None, **spec: Any) -> None:
    """Create the scenario's namespace and ClefDecision."""
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    kube.apply(decision(name, pools, metadata, **spec))


def get_decision(kube: Kube, name: str) -> dict[str, Any] | None:
    return kube.get("clefdecision", name, name)


def wait_serving(kube: Kube, name: str, pool: str, replicas: int = 1, timeout: float = 120) -> dict[str, Any]:
    """Wait until at least ``replicas`` predictor pods of the pool run, all Ready on the pool's nodes, and the
    ClefDecision is Ready; a timeout shows the namespace's objects and the nodes."""
    isvc = f"{name}-{pool}"

    def served() -> bool:
        pods = pods_of(kube, isvc, name)
        nodes = {n["metadata"]["name"] for n in kube.get("nodes", selector=f"{LABEL_KEY}={pool}")}
        on_pool = len(pods) >= replicas and all(pod_ready(p) and p["spec"].get("nodeName") in nodes for p in pods)
        return on_pool and is_ready(get_decision(kube, name))

    what = f"{isvc}'s pods (at least {replicas}) to be Ready on {pool}'s nodes and {name} to be Ready"
    try:
        eventually(served, what, timeout=timeout)
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}\n{cluster_picture(kube, name, name)}")
    return pool_status(get_decision(kube, name))[pool]


def serving_pool(
    kube: Kube,
    nodes_to_remove: list[str],
    name: str,
    pool_name: str,
    metadata: dict[str, Any] | None = None,
    **spec: Any,
) -> GpuPool:
    """One Hopper node in a pool of its own, and a ClefDecision ``name`` (in a namespace of that name) serving it
    with ``spec``'s fields; returns once the pool's predictor runs Ready on the node. The node is removed after the
    test."""
    pool = hopper(pool_name)
    kube.apply(pool.node(0))
    nodes_to_remove.append(pool.node_name(0))
    start(kube, name, [pool_name], metadata, **spec)
    wait_serving(kube, name, pool_name)
    return pool


def remove_nodes(kube: Kube, *names: str) -> None:
    kube.run("delete", "node", *names, "--ignore-not-found", "--wait=true")


@pytest.fixture
def nodes_to_remove(kube: Kube) -> Any:
    """Nodes a scenario added; deleted after it."""
    added: list[str] = []
    yield added
    if added:
        remove_nodes(kube, *added)


def test_node_joins_before_gfd_labels_it(kube: Kube, operator: Operator, nodes_to_remove: list[str]) -> None:
    pool = hopper("late")
    kube.apply(pool.node(0, gfd=False))
    nodes_to_remove.append(pool.node_name(0))
    start(kube, "life-late", ["late"])
    entry = eventually(lambda: pool_status(get_decision(kube, "life-late")).get("late"), "the pool's status")
    assert entry["reason"] == "MissingGPULabels" and entry["state"] == "Ineligible", entry
    assert kube.get("inferenceservices", namespace="life-late") == []
    kube.run("label", "node", pool.node_name(0), *[f"{k}={v}" for k, v in pool.gfd_labels().items()])
    entry = wait_serving(kube, "life-late", "late")
    assert entry["reason"] == "Eligible" and entry["gpu"]["computeCapability"] == "9.0"
    # A second node joins the serving pool before GFD labels it: the pool keeps serving, nothing is rewritten.
    isvc = kube.get("inferenceservice", "life-late-late", "life-late")
    kube.apply(pool.node(1, gfd=False))
    nodes_to_remove.append(pool.node_name(1))
    eventually(
        lambda: (e := pool_status(get_decision(kube, "life-late")).get("late")) and e["nodes"] == 2 and e,
        "the unlabelled node in the pool's status",
    )
    assert pool_status(get_decision(kube, "life-late"))["late"]["state"] == "Serving"
    kube.run("label", "node", pool.node_name(1), *[f"{k}={v}" for k, v in pool.gfd_labels().items()])
    entry = eventually(
        lambda: (
            (e := pool_status(get_decision(kube, "life-late")).get("late"))
            and e["message"] == "compute capability 9.0 meets the required 8.9"
            and e
        ),
        "the labelled node to be read",
    )
    assert entry["state"] == "Serving" and entry["nodes"] == 2, entry
    after = kube.get("inferenceservice", "life-late-late", "life-late")
    assert after["metadata"]["uid"] == isvc["metadata"]["uid"], "the InferenceService was recreated"
    assert after["metadata"]["generation"] == isvc["metadata"]["generation"], "its spec was rewritten"


def test_node_replaced_keeps_the_predictor(kube: Kube, operator: Operator, nodes_to_remove: list[str]) -> None:
    pool = hopper("replaced")
    kube.apply(pool.node(0))
    nodes_to_remove.extend([pool.node_name(0), pool.node_name(1)])
    start(kube, "life-replaced", ["replaced"])
    wait_serving(kube, "life-replaced", "replaced")
    isvc = kube.get("inferenceservice", "life-replaced-replaced", "life-replaced")
    remove_nodes(kube, pool.node_name(0))
    degraded = eventually(
        lambda: (
            (e := pool_status(get_decision(kube, "life-replaced")).get("replaced")) and e["state"] == "Degraded" and e
        ),
        "the pool to be Degraded",
    )
    assert degraded["reason"] == "NoNodes" and degraded["inferenceService"] == "life-replaced-replaced", degraded
    assert degraded["removalAt"] > degraded["degradedSince"], degraded
    # The replacement joins before GPU Feature Discovery labels it: still Degraded, then serving once labelled.
    kube.apply(pool.node(1, gfd=False))
    eventually(
        lambda: (
            (pool_status(get_decision(kube, "life-replaced")).get("replaced") or {}).get("reason") == "MissingGPULabels"
        ),
        "the unlabelled replacement to be read",
    )
    assert pool_status(get_decision(kube, "life-replaced"))["replaced"]["state"] == "Degraded"
    kube.run("label", "node", pool.node_name(1), *[f"{k}={v}" for k, v in pool.gfd_labels().items()])
    entry = wait_serving(kube, "life-replaced", "replaced")
    assert entry["state"] == "Serving" and entry["reason"] == "Eligible", entry
    assert "removalAt" not in entry and "degradedSince" not in entry, entry
    reasons = {e["reason"] for e in kube.get("events", namespace="life-replaced")}
    assert "PoolDegraded" in reasons and "InferenceServiceDeleted" not in reasons, reasons
    after = kube.get("inferenceservice", "life-replaced-replaced", "life-replaced")
    assert after["metadata"]["uid"] == isvc["metadata"]["uid"], "the InferenceService was recreated"
    assert after["metadata"]["generation"] == isvc["metadata"]["generation"], "its spec was rewritten"
    (pod,) = pods_of(kube, "life-replaced-replaced", "life-replaced")
    assert pod["spec"]["nodeName"] == pool.node_name(1)


def test_pool_emptied_and_refilled(kube: Kube, operator: Operator, nodes_to_remove: list[str]) -> None:
    """Every node of a two-node pool goes (scaled to zero), later two new ones join: as on the emulator the pool is
    Degraded (NoNodes) with its InferenceService kept and unchanged, the ClefDecision is not Ready meanwhile, and
    with the new nodes the same InferenceService serves again, its pods rescheduled onto them."""
    pool = hopper("refill")
    first, second = [pool.node_name(i) for i in (0, 1)], [pool.node_name(i) for i in (2, 3)]
    kube.apply(*(pool.node(i) for i in (0, 1)))
    nodes_to_remove.extend([*first, *second])
    start(kube, "life-refill", ["refill"], poolOverrides=[{"name": "refill", "replicas": 2}])
    wait_serving(kube, "life-refill", "refill")
    isvc = kube.get("inferenceservice", "life-refill-refill", "life-refill")
    remove_nodes(kube, *first)
    degraded = eventually(
        lambda: (e := pool_status(get_decision(kube, "life-refill")).get("refill")) and e["state"] == "Degraded" and e,
        "the emptied pool to be Degraded",
    )
    assert degraded["reason"] == "NoNodes" and degraded["inferenceService"] == "life-refill-refill", degraded
    assert degraded["nodes"] == 0 and "removalAt" in degraded
    ready = condition(get_decision(kube, "life-refill"), "Ready")
    assert ready["status"] == "False" and ready["reason"] == "PoolsDegraded", ready
    kube.apply(*(pool.node(i) for i in (2, 3)))

    def serving_on_new_nodes() -> bool:
        pods = pods_of(kube, "life-refill-refill", "life-refill")
        placed = len(pods) == 2 and all(pod_ready(p) and p["spec"].get("nodeName") in second for p in pods)
        return placed and is_ready(get_decision(kube, "life-refill"))

    # The pods bound to the deleted nodes go through the pod garbage collector first (tens of seconds).
    eventually(serving_on_new_nodes, "two Ready pods on the new nodes and the ClefDecision Ready", timeout=180)
    entry = pool_status(get_decision(kube, "life-refill"))["refill"]
    assert entry["state"] == "Serving" and entry["nodes"] == 2 and "removalAt" not in entry
    after = kube.get("inferenceservice", "life-refill-refill", "life-refill")
    assert after["metadata"]["uid"] == isvc["metadata"]["uid"], "the InferenceService was recreated"
    assert after["metadata"]["generation"] == isvc["metadata"]["generation"], "its spec was rewritten"


def test_operator_killed_at_twenty_random_moments_converges(
    kube: Kube, operator: Operator, nodes_to_remove: list[str]
) -> None:
    """SIGKILL the operator at 20 random moments while nodes come and go and two ClefDecisions change: the same
    state as an operator never killed would reach, with no InferenceService duplicated, orphaned or left over."""
    rng = random.Random(20261130)
    ns = "life-kill"
    stay, shared, comes_and_goes = hopper("kill-0"), hopper("kill-1"), hopper("kill-2")
    kube.apply(stay.node(0), shared.node(0))
    nodes_to_remove.extend([stay.node_name(0), stay.node_name(1), shared.node_name(0), comes_and_goes.node_name(0)])
    operator.kill()
    try:
        killed_while_changing(kube, operator, rng, ns, stay, shared, comes_and_goes)
    finally:  # its ClefDecision serves every pool of the label key: later scenarios' pools too, if it stayed
        kube.run("delete", "namespace", ns, "--ignore-not-found", "--wait=true", DELETE_WAIT)


def killed_while_changing(
    kube: Kube, operator: Operator, rng: random.Random, ns: str, stay: GpuPool, shared: GpuPool, comes_and_goes: GpuPool
) -> None:
    """The kill scenario's body: its ClefDecisions, changes and kills, and the state they converge to."""
    # Every pool of the label key (an included pool without nodes would keep the ClefDecision from being Ready).
    start(kube, ns, [], nodePools={"labelKey": LABEL_KEY, "removalGracePeriod": "2s"})
    kube.apply(decision("life-kill-other", [shared.name], metadata={"namespace": ns}))
    patch = partial(kube.run, "patch", "clefdecision", ns, "-n", ns, "--type=merge", "-p")
    changes = [
        lambda: kube.apply(comes_and_goes.node(0)),
        lambda: patch('{"spec": {"predictor": {"maxModelLen": 4096}}}'),
        lambda: remove_nodes(kube, comes_and_goes.node_name(0)),
        lambda: patch('{"spec": {"gpusPerReplica": 2}}'),
        lambda: kube.apply(stay.node(1, gfd=False)),
    ]
    for kill in range(20):
        if kill % 4 == 0 and changes:
            changes.pop(0)()
        operator.start()
        time.sleep(rng.uniform(0.5, 4.0))
        operator.kill()
    operator.start()
    expected = {f"{ns}-{stay.name}", f"{ns}-{shared.name}", f"life-kill-other-{shared.name}"}

    def converged() -> dict[str, Any] | None:
        isvcs = {i["metadata"]["name"]: i for i in kube.get("inferenceservices", namespace=ns)}
        entries = pool_status(get_decision(kube, ns))
        done = set(isvcs) == expected and set(entries) == {stay.name, shared.name}
        return isvcs if done and entries[stay.name]["nodes"] == 2 else None

    isvcs = eventually(converged, "the InferenceServices and pools of the final specs", timeout=120)
    for pool in (stay.name, shared.name):
        wait_serving(kube, ns, pool)
        (container,) = isvcs[f"{ns}-{pool}"]["spec"]["predictor"]["containers"]
        assert "--max-model-len=4096" in container["args"], container["args"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] in (2, "2"), container["resources"]
    owners = sorted(
        (ref["name"], bool(ref.get("controller"))) for i in isvcs.values() for ref in i["metadata"]["ownerReferences"]
    )
    assert owners == [(ns, True), (ns, True), ("life-kill-other", True)], owners  # no duplicates, no orphans
    assert not get_decision(kube, ns)["metadata"].get("finalizers")
    # The state reached is the operator's own: one more restart changes no InferenceService's spec.
    generations = {name: isvc["metadata"]["generation"] for name, isvc in isvcs.items()}
    operator.kill()
    operator.start()
    time.sleep(10)  # the restarted operator's first pass (a few seconds) would rewrite a drifted spec meanwhile
    after = {i["metadata"]["name"]: i["metadata"]["generation"] for i in kube.get("inferenceservices", namespace=ns)}
    assert after == generations


def test_hand_edit_is_reverted(kube: Kube, operator: Operator, nodes_to_remove: list[str]) -> None:
    serving_pool(kube, nodes_to_remove, "life-edit", "edited")
    name = "life-edit-edited"
    before = kube.get("inferenceservice", name, "life-edit")
    container = copy.deepcopy(before["spec"]["predictor"]["containers"][0])
    container["args"].append("--max-num-seqs=1")
    edit = {
        "metadata": {"labels": {"team": "ml"}},
        "spec": {"predictor": {"minReplicas": 3, "maxReplicas": 3, "containers": [container]}},
    }
    kube.run("patch", "inferenceservice", name, "-n", "life-edit", "--type=merge", "-p", json.dumps(edit))

    def reverted() -> dict[str, Any] | None:
        now = kube.get("inferenceservice", name, "life-edit")
        return now if now["spec"] == before["spec"] else None

    after = eventually(reverted, "the operator to revert the hand edit")
    assert after["metadata"]["labels"]["team"] == "ml", "what others add to metadata stays"
    eventually(
        lambda: (
            len(pods_of(kube, name, "life-edit")) == 1
            and kube.get("deployment", f"{name}-predictor", "life-edit")["spec"]["replicas"] == 1
        ),
        "KServe's Deployment back at 1 replica",
    )


def test_a_crashing_predictor_makes_the_decision_not_ready(
    kube: Kube, operator: Operator, nodes_to_remove: list[str]
) -> None:
    serving_pool(kube, nodes_to_remove, "life-crash", "crash")
    (pod,) = pods_of(kube, "life-crash-crash", "life-crash")
    crash_pod(kube.cluster, "life-crash", pod["metadata"]["name"])

    def not_ready() -> dict[str, Any] | None:
        decision = get_decision(kube, "life-crash")
        ready = condition(decision, "Ready")
        return ready if ready.get("status") == "False" else None

    ready = eventually(not_ready, "the ClefDecision to stop being Ready")
    assert ready["reason"] == "PredictorsNotReady" and "life-crash-crash" in ready["message"], ready
    assert pool_status(get_decision(kube, "life-crash"))["crash"]["ready"] is False
    # kwok no longer runs that pod, so nothing would confirm a graceful deletion: delete it at once.
    kube.run("delete", "pod", pod["metadata"]["name"], "-n", "life-crash", "--grace-period=0", "--force")
    wait_serving(kube, "life-crash", "crash")


def test_a_pod_marked_not_ready_by_the_node_controller_is_ready_again(
    kube: Kube, operator: Operator, nodes_to_remove: list[str]
) -> None:
    """What kube-controller-manager writes when a node's heartbeats stop reaching it (an API-server outage longer
    than the node grace period): the pod's Ready condition False. The node reports the same pod Ready again at its
    next status sync, as a kubelet does, and the decision is Ready with it."""
    serving_pool(kube, nodes_to_remove, "life-unready", "unready")
    (pod,) = pods_of(kube, "life-unready-unready", "life-unready")
    name = pod["metadata"]["name"]
    marked = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "NodeNotReady"}]}}
    written = kube.run(
        "patch", "pod", name, "-n", "life-unready", "--subresource=status", "-p", json.dumps(marked), "-o", "json"
    )
    assert not is_ready(json.loads(written.stdout)), "the pod was not marked not Ready"
    eventually(lambda: pod_ready(kube.get("pod", name, "life-unready")), "the pod to be Ready again", timeout=60)
    wait_serving(kube, "life-unready", "unready")
    (again,) = pods_of(kube, "life-unready-unready", "life-unready")
    assert again["metadata"]["uid"] == pod["metadata"]["uid"], "the same pod is Ready again, not a new one"


def test_decision_deleted_while_the_operator_is_down(
    kube: Kube, operator: Operator, nodes_to_remove: list[str]
) -> None:
    # The finalizer an older operator (with a per-object resync timer) added: kopf drops it, nothing needs it.
    legacy = {"finalizers": ["kopf.zalando.org/KopfFinalizerMarker"]}
    serving_pool(kube, nodes_to_remove, "life-down", "orphan", metadata=legacy)
    eventually(
        lambda: not get_decision(kube, "life-down")["metadata"].get("finalizers"), "the old finalizer to be dropped"
    )
    operator.stop()
    try:
        kube.run("delete", "clefdecision", "life-down", "-n", "life-down", "--wait=true", DELETE_WAIT)
        gone = ("inferenceservices", "deployments", "replicasets", "pods")
        eventually(
            lambda: all(kube.get(kind, namespace="life-down") == [] for kind in gone),
            "the garbage collector to remove the InferenceService, its Deployment and its pods",
        )
    finally:
        operator.start()


def test_namespace_deletion_removes_everything(kube: Kube, operator: Operator, nodes_to_remove: list[str]) -> None:
    pool = serving_pool(kube, nodes_to_remove, "life-nsdel", "nsdel")
    kube.run("delete", "namespace", "life-nsdel", "--wait=true", "--timeout=90s")
    assert kube.get("namespace", "life-nsdel") is None
    left = [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in kube.get("pods")
        if p["spec"].get("nodeName") == pool.node_name(0)
    ]
    assert left == [], f"pods left on the deleted namespace's node: {left}"
    assert "Traceback" not in operator.log_text()


def test_invalid_decisions_are_refused_by_the_api_server(kube: Kube, installed_chart: dict[str, Any]) -> None:
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "life-invalid"}})
    cases: list[tuple[dict[str, Any], str]] = [
        ({"quantization": "int8"}, "spec.quantization"),
        ({"quantization": "fp8", "minComputeCapability": "8.0"}, "spec"),
        ({"replicas": -1}, "spec.replicas"),
        ({"predictor": {"resources": {"requests": {"cpu": "lots"}}}}, "spec.predictor.resources.requests"),
        ({"nodePools": {"include": ["a"], "exclude": ["a"]}}, "spec.nodePools"),
    ]
    for extra, field in cases:
        body = decision("life-invalid", ["a"], **extra)
        done = kube.run("create", "-f", "-", stdin=yaml.safe_dump(body), check=False)
        assert done.returncode != 0, f"{extra} was accepted"
        assert "is invalid" in done.stderr and field in done.stderr, (extra, done.stderr)
    assert kube.get("clefdecisions", namespace="life-invalid") == []
