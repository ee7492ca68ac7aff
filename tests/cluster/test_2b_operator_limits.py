"""The operator's limits on the real control plane: one validation shared with the API server, objects within the
API server's limits, adoption of a child that lost its owner reference, a taken name said once, quiet at steady
state, and a watch broken by an API server restart. Each scenario has its own namespace and pools, named under
the label key of the cluster-life scenarios. Runs before test_3_helm, which uninstalls the chart."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from clef_operator.diffbase import DIGEST_PREFIX
from tests.cluster import test_2_cluster_life
from tests.cluster.helpers import pool_status
from tests.cluster.kube import DELETE_WAIT, Kube, Operator
from tests.cluster.test_2_cluster_life import decision, get_decision, hopper, serving_pool, start, wait_serving
from tests.cluster.validation_cases import BASE, INVALID, VALID, operator_errors
from tests.operator.test_size_limits import LAST_HANDLED, largest_spec
from tests.polling import eventually

pytestmark = pytest.mark.cluster
nodes_to_remove = test_2_cluster_life.nodes_to_remove  # the fixture: nodes a scenario added, deleted after it

AGREE_NS = "limits-agree"


def dry_run_create(kube: Kube, spec: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """A server-side dry-run create of a ClefDecision with ``spec``: the object as stored, or the refusal."""
    body = {
        "apiVersion": "clef-serving.io/v1alpha1",
        "kind": "ClefDecision",
        "metadata": {"name": "agree", "namespace": AGREE_NS},
        "spec": spec,
    }
    done = kube.run("create", "--dry-run=server", "-o", "json", "-f", "-", stdin=yaml.safe_dump(body), check=False)
    return (json.loads(done.stdout), "") if done.returncode == 0 else (None, done.stderr)


@pytest.fixture(scope="module")
def agree_namespace(kube: Kube, installed_chart: dict[str, Any]) -> str:
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGREE_NS}})
    return AGREE_NS


@pytest.mark.parametrize("fields", VALID, ids=[str(i) for i in range(len(VALID))])
def test_api_server_and_operator_both_accept(kube: Kube, agree_namespace: str, fields: dict[str, Any]) -> None:
    spec = {**BASE, **fields}
    stored, refusal = dry_run_create(kube, spec)
    assert stored is not None, refusal
    assert operator_errors(spec) == ""
    assert operator_errors(stored["spec"]) == "", "the operator refuses the spec as the API server defaults it"


@pytest.mark.parametrize(("fields", "field"), INVALID, ids=[f"{i}-{c[1]}" for i, c in enumerate(INVALID)])
def test_api_server_and_operator_both_refuse_naming_the_field(
    kube: Kube, agree_namespace: str, fields: dict[str, Any], field: str
) -> None:
    spec = {**BASE, **fields}
    stored, refusal = dry_run_create(kube, spec)
    from_operator = operator_errors(spec)
    assert stored is None, "the API server accepts it"
    # Refused by validation ("is invalid") or, for a key the schema does not declare, by kubectl's strict field
    # validation ("unknown field"; without it the API server prunes the key and minProperties refuses the rest).
    assert ("is invalid" in refusal or "unknown field" in refusal) and field in refusal, refusal
    assert field in from_operator, from_operator or "the operator accepts it"


def test_300_kb_of_extra_args_is_refused_by_the_api_server(kube: Kube, installed_chart: dict[str, Any]) -> None:
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "limits-huge"}})
    for extra_args in (["--a=" + "x" * 300_000], ["--a=" + "x" * 2000] * 150):
        body = decision("limits-huge", ["huge"], predictor={"extraArgs": extra_args})
        done = kube.run("create", "-f", "-", stdin=yaml.safe_dump(body), check=False)
        assert done.returncode != 0 and "is invalid" in done.stderr, done.stderr[:500]
        assert "spec.predictor.extraArgs" in done.stderr, done.stderr[:500]
    assert kube.get("clefdecisions", namespace="limits-huge") == []


def test_largest_accepted_spec_yields_an_inferenceservice_the_api_server_accepts(
    kube: Kube, operator: Operator, nodes_to_remove: list[str]
) -> None:
    pool = hopper("large")
    kube.apply(pool.node(0))
    nodes_to_remove.append(pool.node_name(0))
    largest = {key: value for key, value in largest_spec().items() if key != "model"}
    assert len(json.dumps(largest)) > 256 * 1024  # kopf's stock diff base could not be stored in an annotation
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "limits-large"}})
    # kubectl create: a client-side `kubectl apply` would copy the whole object into its own last-applied
    # annotation, which the API server refuses over 256 KiB (`kubectl apply --server-side` stores none).
    kube.run("create", "-f", "-", stdin=yaml.safe_dump(decision("limits-large", ["large"], **largest)))
    name = "limits-large-large"
    isvc = eventually(lambda: kube.get("inferenceservice", name, "limits-large"), f"{name} to be created")
    assert [ref["name"] for ref in isvc["metadata"]["ownerReferences"]] == ["limits-large"]
    extra_args = largest["predictor"]["extraArgs"]
    assert json.dumps(isvc["spec"]).count(extra_args[0]) == len(extra_args)
    annotations = eventually(
        lambda: (
            (found := get_decision(kube, "limits-large")["metadata"].get("annotations") or {})
            and LAST_HANDLED in found
            and found
        ),
        "kopf's diff base to be stored",
    )
    stored = annotations[LAST_HANDLED]
    assert stored.startswith(DIGEST_PREFIX) and len(stored) == len(DIGEST_PREFIX) + 64, stored
    assert len(json.dumps(annotations)) < 1024, annotations
    kube.run(
        "patch", "clefdecision", "limits-large", "-n", "limits-large", "--type=merge", "-p", '{"spec": {"replicas": 2}}'
    )
    eventually(
        lambda: kube.get("inferenceservice", name, "limits-large")["spec"]["predictor"].get("minReplicas") == 2,
        "a later spec change to be applied",
    )
    changed = eventually(
        lambda: (now := get_decision(kube, "limits-large")["metadata"]["annotations"][LAST_HANDLED]) != stored and now,
        "kopf's diff base to follow the change",
    )
    assert changed.startswith(DIGEST_PREFIX), changed


def owners(kube: Kube, name: str, namespace: str) -> list[tuple[str, bool]]:
    isvc = kube.get("inferenceservice", name, namespace) or {}
    return [(ref["name"], bool(ref.get("controller"))) for ref in isvc.get("metadata", {}).get("ownerReferences") or []]


def test_stripped_owner_reference_is_restored_and_the_child_is_collected(
    kube: Kube, operator: Operator, nodes_to_remove: list[str]
) -> None:
    serving_pool(kube, nodes_to_remove, "limits-adopt", "adopt")
    name = "limits-adopt-adopt"
    kube.run(
        "patch",
        "inferenceservice",
        name,
        "-n",
        "limits-adopt",
        "--type=json",
        "-p",
        '[{"op": "remove", "path": "/metadata/ownerReferences"}]',
    )
    assert eventually(lambda: owners(kube, name, "limits-adopt"), "the owner reference to be restored", timeout=10) == [
        ("limits-adopt", True)
    ]
    assert pool_status(get_decision(kube, "limits-adopt"))["adopt"]["state"] == "Serving"
    kube.run("delete", "clefdecision", "limits-adopt", "-n", "limits-adopt", "--wait=true", DELETE_WAIT)
    gone = ("inferenceservices", "deployments", "pods")
    eventually(
        lambda: all(kube.get(kind, namespace="limits-adopt") == [] for kind in gone),
        "the garbage collector to remove the InferenceService, its Deployment and its pods",
    )


def isvc_create_refusals(kube: Kube) -> float:
    """POSTs of InferenceServices the API server answered 409 (its own request counter, all clients)."""
    metrics = kube.run("get", "--raw", "/metrics").stdout
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("apiserver_request_total{")
        and 'resource="inferenceservices"' in line
        and 'verb="POST"' in line
        and 'code="409"' in line
    )


def name_taken_events(kube: Kube, namespace: str) -> list[tuple[str, int, str]]:
    return [
        (e["metadata"]["name"], e.get("count") or 1, e["message"])
        for e in kube.get("events", namespace=namespace)
        if e.get("reason") == "NameTaken"
    ]


def test_taken_name_is_said_once_and_freed_by_the_holders_deletion(
    kube: Kube, operator: Operator, nodes_to_remove: list[str]
) -> None:
    ns = "limits-taken"
    taken, other = hopper("taken"), hopper("taken-more")
    kube.apply(taken.node(0))
    nodes_to_remove.append(taken.node_name(0))
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    holder = f"{ns}-taken"
    kube.apply(
        {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": {"name": holder, "namespace": ns},
            "spec": {"predictor": {"containers": [{"name": "kserve-container", "image": "example.com/other:1"}]}},
        }
    )
    kube.apply(decision(ns, ["taken", "taken-more"]))

    def state(pool: str) -> str | None:
        return pool_status(get_decision(kube, ns)).get(pool, {}).get("state")

    eventually(lambda: state("taken") == "Conflict", "the pool to say Conflict")
    entry = pool_status(get_decision(kube, ns))["taken"]
    assert entry["predictorReason"] == "NameTaken", entry
    assert "not owned by this ClefDecision" in entry["predictorMessage"], entry
    # One Warning for the pool and one for the Ready condition it turns False.
    warned = eventually(lambda: len(events := name_taken_events(kube, ns)) == 2 and events, "two NameTaken Events")
    refusals = isvc_create_refusals(kube)
    for index in range(6):  # each node changes what the ClefDecision's status says: a pass per node
        kube.apply(other.node(index))
        nodes_to_remove.append(other.node_name(index))
        eventually(
            lambda count=index + 1: pool_status(get_decision(kube, ns)).get("taken-more", {}).get("nodes") == count,
            f"{index + 1} node(s) in the other pool's status",
        )
    assert state("taken") == "Conflict"
    assert isvc_create_refusals(kube) - refusals <= 1, "a POST per node event"
    assert name_taken_events(kube, ns) == warned, "said again"
    assert len([e for e in warned if e[2].startswith("node pool taken:")]) == 1, warned
    # Not kubectl's --wait: it waits for the name to disappear, and the operator takes the freed name at once; when
    # it does before kubectl's watch starts, that watch never sees the holder's deletion.
    kube.run("delete", "inferenceservice", holder, "-n", ns, "--wait=false")
    eventually(
        lambda: owners(kube, holder, ns) == [(ns, True)], "the freed name to be taken by the operator", timeout=120
    )


def snapshot(kube: Kube, namespace: str) -> dict[str, str]:
    """resourceVersion of every ClefDecision, InferenceService and Event about a ClefDecision in the namespace
    (the Events of KServe's Deployments and their pods are the controllers', not the operator's)."""
    objects = [("clefdecisions", o) for o in kube.get("clefdecisions", namespace=namespace)]
    objects += [("inferenceservices", o) for o in kube.get("inferenceservices", namespace=namespace)]
    objects += [
        ("events", e)
        for e in kube.get("events", namespace=namespace)
        if e["involvedObject"].get("kind") == "ClefDecision"
    ]
    return {f"{kind}/{o['metadata']['name']}": o["metadata"]["resourceVersion"] for kind, o in objects}


def test_no_writes_at_steady_state(kube: Kube, operator: Operator, nodes_to_remove: list[str]) -> None:
    ns = "limits-quiet"
    pools = [hopper("quiet-a"), hopper("quiet-b")]
    for pool in pools:
        kube.apply(pool.node(0))
        nodes_to_remove.append(pool.node_name(0))
    start(kube, ns, [p.name for p in pools])
    for pool in pools:
        wait_serving(kube, ns, pool.name)
    last = {"seen": snapshot(kube, ns)}

    def settled() -> bool:
        time.sleep(2)
        now = snapshot(kube, ns)
        same, last["seen"] = now == last["seen"], now
        return same

    eventually(settled, "two seconds without a write", timeout=60)
    before = last["seen"]
    time.sleep(10)
    # A node event the operator sees (its labels unchanged for the pools): a pass, and nothing to write.
    kube.run("annotate", "node", pools[0].node_name(0), "example.com/touched=1", "--overwrite")
    time.sleep(10)
    assert snapshot(kube, ns) == before


def test_spec_change_after_an_api_server_restart_is_applied(
    kube: Kube, operator: Operator, nodes_to_remove: list[str]
) -> None:
    ns = "limits-restart"
    serving_pool(kube, nodes_to_remove, ns, "restart")
    kube.cluster.restart("kube-apiserver")
    eventually(
        lambda: kube.run("get", "--raw", "/readyz", check=False).returncode == 0,
        "the API server to answer again",
        timeout=120,
    )
    kube.run("patch", "clefdecision", ns, "-n", ns, "--type=merge", "-p", '{"spec": {"replicas": 2}}')
    eventually(
        lambda: kube.get("inferenceservice", f"{ns}-restart", ns)["spec"]["predictor"].get("minReplicas") == 2,
        "the change to be applied after the restart",
        timeout=30,
    )
    assert operator.process is not None and operator.process.poll() is None, "the operator exited"
