"""Objects and reads shared by the real-cluster tests."""

from __future__ import annotations

from typing import Any

import pytest

from clef_cluster.nodes import GPU_POOLS
from clef_cluster.storage import namespace_with_claims
from tests.cluster.kube import EXAMPLE, README_NS, Kube
from tests.polling import eventually

DECISION_LABEL = "clef-serving.io/decision"
ISVC_LABEL = "serving.kserve.io/inferenceservice"
FP8_POOLS = {"h200-pool", "h100-pool", "l4-pool", "b200-pool"}  # compute capability >= 8.9
TOO_OLD_POOLS = {"a100-pool", "t4-pool"}
POOL_NODES = {pool.name: {pool.node_name(i) for i in range(pool.nodes)} for pool in GPU_POOLS}


def namespace(kube: Kube, name: str) -> None:
    """Create a namespace with the claims the README's ClefDecision mounts (bound to static volumes)."""
    kube.apply(*namespace_with_claims(name))


def apply_readme_decision(kube: Kube) -> dict[str, Any]:
    """The README's ClefDecision applied with kubectl into its namespace, waited for until Ready."""
    namespace(kube, README_NS)
    kube.run("apply", f"--namespace={README_NS}", "-f", str(EXAMPLE))
    try:
        return eventually(
            lambda: (d := kube.get("clefdecision", "clef-flash", README_NS)) and is_ready(d) and d,
            "the README's ClefDecision to be Ready",
            timeout=180,
        )
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}\n{cluster_picture(kube, README_NS, 'clef-flash')}")


def cluster_picture(kube: Kube, namespace: str, decision: str) -> str:
    """What a wait for a ClefDecision to serve failed on: the decision's status, the namespace's InferenceServices,
    Deployments, ReplicaSets, pods (with their Ready condition) and events, and the nodes (Ready, taints); what
    kubectl said instead where a read failed."""
    ready = '{.status.conditions[?(@.type=="Ready")].status}'
    pods = (
        f'{{range .items[*]}}{{.metadata.name}} on {{.spec.nodeName}}: {{.status.phase}}, Ready {ready}{{"\\n"}}{{end}}'
    )
    nodes = f'{{range .items[*]}}{{.metadata.name}}: Ready {ready}, taints {{.spec.taints[*].key}}{{"\\n"}}{{end}}'
    shown = [
        (done := kube.run(*args, check=False)).stdout or done.stderr
        for args in (
            ("get", "clefdecision", decision, f"--namespace={namespace}", "-o", "jsonpath={.status}"),
            ("get", "inferenceservices", f"--namespace={namespace}", "-o", "wide"),  # none without KServe
            ("get", "deployments,replicasets", f"--namespace={namespace}", "-o", "wide"),
            ("get", "pods", f"--namespace={namespace}", "-o", f"jsonpath={pods}"),
            ("get", "events", f"--namespace={namespace}", "--sort-by=.lastTimestamp"),
            ("get", "nodes", "-o", f"jsonpath={nodes}"),
        )
    ]
    return "\n".join(shown)


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    """The condition ``kind`` of an object's status ({} when absent)."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), {})


def is_ready(obj: dict[str, Any] | None) -> bool:
    """Whether the object's Ready condition is True."""
    return condition(obj, "Ready").get("status") == "True"


def pool_status(decision: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """status.pools by pool name."""
    return {p["name"]: p for p in ((decision or {}).get("status") or {}).get("pools", [])}


def pods_of(kube: Kube, isvc: str, namespace: str) -> list[dict[str, Any]]:
    """The pods KServe's Deployment runs for an InferenceService."""
    return kube.get("pods", namespace=namespace, selector=f"{ISVC_LABEL}={isvc}")


def pod_ready(pod: dict[str, Any]) -> bool:
    """Running with the Ready condition True (as kwok reports once the pod is bound to its node)."""
    return pod["status"].get("phase") == "Running" and is_ready(pod)
