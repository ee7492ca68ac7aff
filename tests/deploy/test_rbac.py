"""The chart's RBAC against the API calls the operator really makes.

The real operator (kopf, with peering as the chart deploys it) runs a short scenario against the
cluster emulator of tests/operator: pools appear and vanish, a ClefDecision is created, changed and
deleted, an InferenceService turns Ready. Every request it sends is mapped to the RBAC
(apiGroup, resource, verb) it needs; each must be allowed by the rules the chart renders for that
scoping (a ClusterRole, or Roles in the watched namespaces), and the chart must grant nothing the
operator never uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import kmock
import kopf
import pytest
import pytest_asyncio

from clef_operator.constants import DECISION_LABEL
from tests.crd_schema import clef_crd
from tests.deploy.chart import CHART, load_yaml_objects, render_chart
from tests.operator.emulator import ClusterEmulator, rbac_triples
from tests.operator.harness import (
    DECISIONS,
    ISVCS,
    KSERVE_CRD,
    NODES,
    EmulatedCluster,
    documented_rbac,
    fast_settings,
    gpu_node,
    write_kubeconfig,
)
from tests.polling import eventually_async

NS = "ml"
H100 = dict(product="NVIDIA-H100-80GB-HBM3", family="hopper", major=9, minor=0)
A100 = dict(product="NVIDIA-A100-SXM4-80GB", family="ampere", major=8, minor=0)
# Needed without a request of the operator's own: setting blockOwnerDeletion on the children's
# ownerReferences (kopf.adopt) needs `update` on the owner's finalizers where the API server runs
# the OwnerReferencesPermissionEnforcement admission plugin (e.g. OpenShift).
GRANTED_FOR_ADMISSION = {("clef-serving.io", "clefdecisions/finalizers", "update")}

Grant = tuple[str, str, str]
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("namespace_paths")]


@pytest_asyncio.fixture
async def emulator(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ClusterEmulator]:
    """The emulator with built-in kinds, KServe's and our CRDs (kopf's peering ones included)."""
    async with ClusterEmulator() as emu, kmock.Server(emu):
        emu.resources.load_bundled()
        emu.add_crd(clef_crd())
        emu.add_crd(KSERVE_CRD)
        for crd in load_yaml_objects(CHART / "crds" / "kopf-peering.yaml"):
            emu.add_crd(crd)
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", str(emu.url).rstrip("/"))))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("CLEF_RETRY_BASE_SECONDS", "0.2")
        yield emu


def peering_path(obj: dict[str, Any]) -> str:
    """The API path of a kopf peering object's collection."""
    if obj["kind"] == "ClusterKopfPeering":
        return "/apis/kopf.dev/v1/clusterkopfpeerings"
    return f"/apis/kopf.dev/v1/namespaces/{obj['metadata']['namespace']}/kopfpeerings"


@contextlib.asynccontextmanager
async def operator_as_deployed(args: list[str]) -> AsyncIterator[None]:
    """Run the operator in this event loop with the scoping and peering of the chart's container args."""
    import clef_operator.handlers  # noqa: F401  (registers the handlers in kopf's default registry)
    from clef_operator.__main__ import build_parser

    options = build_parser().parse_args([arg for arg in args if not arg.startswith("--liveness-port")])
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            clusterwide=not options.namespace,
            namespaces=options.namespace,
            standalone=options.standalone,
            peering_name=None if options.standalone else options.peering,
            priority=100,
            settings=fast_settings(),
            memo=kopf.Memo(),
            stop_flag=stop,
            ready_flag=ready,
        )
    )
    await asyncio.wait_for(ready.wait(), timeout=10)
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=15)


async def run_scenario(cluster: EmulatedCluster) -> None:
    """Pools appear and vanish; a ClefDecision is created, served, changed, then deleted; then the same for one
    served by the deployment backend."""
    decisions = DECISIONS.format(ns=NS)
    isvcs = ISVCS.format(ns=NS)

    async def isvc_names() -> list[str]:
        return sorted(item["metadata"]["name"] for item in await cluster.items(isvcs))

    async def is_(expected: list[str]) -> bool:
        return await isvc_names() == expected

    async def all_updated() -> bool:
        items = await cluster.items(isvcs)
        return len(items) == 2 and all(
            "--max-model-len=4096" in i["spec"]["predictor"]["containers"][0]["args"] for i in items
        )

    async def ready() -> bool:
        status = (await cluster.get(f"{decisions}/clef")).get("status") or {}
        return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))

    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    await cluster.create(NODES, gpu_node("a100-a", "a100-pool", **A100))
    await cluster.create(
        decisions,
        {
            "apiVersion": "clef-serving.io/v1alpha1",
            "kind": "ClefDecision",
            "metadata": {"name": "clef", "namespace": NS},
            "spec": {
                "model": {"storageUri": "hf://cloudflare/clef-flash-fp8"},
                "nodePools": {"removalGracePeriod": "1s"},
            },
        },
    )
    await eventually_async(lambda: is_(["clef-h100-pool"]))
    # A name held by someone else: the operator reads who holds it, and takes it once it is freed.
    await cluster.create(
        isvcs,
        {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": {"name": "clef-b200-pool", "namespace": NS},
            "spec": {},
        },
    )
    await cluster.create(NODES, gpu_node("b200-a", "b200-pool", product="NVIDIA-B200", major=10, minor=0))

    async def conflict_reported() -> bool:
        status = (await cluster.get(f"{decisions}/clef")).get("status") or {}
        return any(pool.get("state") == "Conflict" for pool in status.get("pools", []))

    await eventually_async(conflict_reported)
    await cluster.delete(f"{isvcs}/clef-b200-pool")
    await eventually_async(lambda: _owned(cluster, f"{isvcs}/clef-b200-pool"))
    await cluster.delete(f"{NODES}/b200-a")
    await eventually_async(lambda: is_(["clef-h100-pool"]))
    await cluster.create(NODES, gpu_node("l4-a", "l4-pool", product="NVIDIA-L4", major=8, minor=9, gpus=4))
    await eventually_async(lambda: is_(["clef-h100-pool", "clef-l4-pool"]))
    for name in ("clef-h100-pool", "clef-l4-pool"):
        await cluster.merge(
            f"{isvcs}/{name}/status",
            {
                "status": {
                    "url": f"http://{name}.{NS}.example.com",
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                }
            },
        )
    await eventually_async(ready)
    await cluster.merge(f"{decisions}/clef", {"spec": {"predictor": {"maxModelLen": 4096}}})
    await eventually_async(all_updated)
    await cluster.delete(f"{NODES}/l4-a")
    await eventually_async(lambda: is_(["clef-h100-pool"]))
    await cluster.delete(f"{decisions}/clef")
    await eventually_async(lambda: is_([]))
    await run_deployment_backend_scenario(cluster)


async def run_deployment_backend_scenario(cluster: EmulatedCluster) -> None:
    """The deployment backend: a name held by someone else's Deployment, then a Deployment, Service and
    HorizontalPodAutoscaler created, repaired and changed, KEDA installed and the autoscaler replaced by a
    ScaledObject, which is changed and dropped, the pool's objects removed."""
    decisions = DECISIONS.format(ns=NS)
    paths = {
        "Deployment": f"/apis/apps/v1/namespaces/{NS}/deployments",
        "Service": f"/api/v1/namespaces/{NS}/services",
        "HorizontalPodAutoscaler": f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers",
    }

    scaled_objects = f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects"

    async def objects(kind: str) -> dict[str, dict[str, Any]]:
        return {item["metadata"]["name"]: item for item in await cluster.items(paths.get(kind, scaled_objects))}

    async def holds(kind: str, check: Any = lambda obj: True) -> bool:
        found = (await objects(kind)).get("dep-h100-pool")
        return found is not None and bool(found["metadata"].get("ownerReferences")) and check(found)

    def labelled(obj: dict[str, Any]) -> bool:
        return bool(obj["metadata"]["labels"].get(DECISION_LABEL) == "dep")

    async def gone(kind: str) -> bool:
        return "dep-h100-pool" not in await objects(kind)

    selector = {"matchLabels": {"app": "someone-else"}}
    await cluster.create(
        paths["Deployment"],
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "dep-h100-pool", "namespace": NS},
            "spec": {"selector": selector, "template": {"metadata": {"labels": selector["matchLabels"]}}},
        },
    )
    await cluster.create(
        decisions,
        {
            "apiVersion": "clef-serving.io/v1alpha1",
            "kind": "ClefDecision",
            "metadata": {"name": "dep", "namespace": NS},
            "spec": {
                "model": {"storageUri": "hf://cloudflare/clef-flash-fp8"},
                "backend": "deployment",
                "autoscaling": {"minReplicas": 1, "maxReplicas": 2},
                "nodePools": {"removalGracePeriod": "1s", "include": ["h100-pool"]},
            },
        },
    )

    async def conflict_reported() -> bool:
        status = (await cluster.get(f"{decisions}/dep")).get("status") or {}
        return any(pool.get("state") == "Conflict" for pool in status.get("pools", []))

    await eventually_async(conflict_reported)
    await cluster.delete(f"{paths['Deployment']}/dep-h100-pool")
    for kind in paths:
        await eventually_async(lambda kind=kind: holds(kind))
    await cluster.merge(f"{paths['Service']}/dep-h100-pool", {"spec": {"ports": [{"name": "x", "port": 1}]}})
    # A hand-edited decision label hides a companion from the list by that label: its create is refused, and
    # the holder read (`get`) and repaired.
    for kind in ("Service", "HorizontalPodAutoscaler"):
        await cluster.merge(f"{paths[kind]}/dep-h100-pool", {"metadata": {"labels": {DECISION_LABEL: "x"}}})
    await cluster.merge(f"{decisions}/dep", {"spec": {"autoscaling": {"maxReplicas": 3}}})
    await eventually_async(lambda: holds("HorizontalPodAutoscaler", lambda obj: obj["spec"]["maxReplicas"] == 3))
    await eventually_async(lambda: holds("Service", lambda obj: obj["spec"]["ports"][0]["port"] == 80))
    for kind in ("Service", "HorizontalPodAutoscaler"):
        await eventually_async(lambda kind=kind: holds(kind, labelled))
    await cluster.install_keda()
    keda = {"serverAddress": "http://prometheus:9090", "target": "4"}
    await cluster.merge(f"{decisions}/dep", {"spec": {"autoscaling": {"keda": keda}}})
    await eventually_async(lambda: holds("ScaledObject"))
    await eventually_async(lambda: gone("HorizontalPodAutoscaler"))
    await cluster.merge(f"{scaled_objects}/dep-h100-pool", {"metadata": {"labels": {DECISION_LABEL: "x"}}})
    await cluster.merge(f"{decisions}/dep", {"spec": {"autoscaling": {"keda": {"target": "8"}}}})

    def threshold(obj: dict[str, Any]) -> bool:
        return bool(obj["spec"]["triggers"][0]["metadata"]["threshold"] == "8")

    await eventually_async(lambda: holds("ScaledObject", lambda obj: threshold(obj) and labelled(obj)))
    await cluster.merge(f"{decisions}/dep", {"spec": {"autoscaling": None, "replicas": 2}})
    await eventually_async(lambda: holds("Deployment", lambda obj: obj["spec"].get("replicas") == 2))
    await eventually_async(lambda: gone("ScaledObject"))
    await cluster.delete(f"{NODES}/h100-a")
    await eventually_async(lambda: gone("Deployment"))
    await eventually_async(lambda: gone("Service"))
    await cluster.delete(f"{decisions}/dep")


async def _owned(cluster: EmulatedCluster, path: str) -> bool:
    items = [i for i in await cluster.items(path.rsplit("/", 1)[0]) if i["metadata"]["name"] == path.rsplit("/", 1)[1]]
    return bool(items and items[0]["metadata"].get("ownerReferences"))


def operator_requests(emulator: ClusterEmulator) -> list[tuple[Grant, str | None]]:
    """Each request the operator sent (not the test's own client) as (grant it needs, namespace)."""
    found = []
    for request in emulator.history:
        if request.headers.get("User-Agent", "").startswith("kmock/"):
            continue
        for grant in rbac_triples([request]):
            found.append((grant, request.namespace or None))
    return found


def expand(rules: list[dict[str, Any]]) -> set[Grant]:
    """Every (apiGroup, resource, verb) a list of RBAC rules grants (no wildcards are allowed)."""
    grants = set()
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {field}: {rule}"
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
        grants |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return grants


def granted(objects: list[dict[str, Any]]) -> tuple[set[Grant], dict[str, set[Grant]]]:
    """The grants of the rendered ClusterRole, and of the Role in each namespace."""
    (cluster_role,) = [
        o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-operator-cluster")
    ]
    roles = {o["metadata"]["namespace"]: expand(o["rules"]) for o in objects if o["kind"] == "Role"}
    return expand(cluster_role["rules"]), roles


def operator_args(objects: list[dict[str, Any]]) -> list[str]:
    """The operator container's args in the rendered Deployment."""
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize(
    "sets",
    [[], [f"operator.watchNamespaces={{{NS}}}"], ["peering.enabled=false"]],
    ids=["cluster-wide", "one-namespace", "standalone"],
)
async def test_rbac_allows_every_call_and_nothing_more(emulator: ClusterEmulator, sets: list[str]) -> None:
    objects = render_chart(sets=sets)
    cluster = EmulatedCluster(emulator)
    await cluster.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for peering in [o for o in objects if o["kind"] in ("ClusterKopfPeering", "KopfPeering")]:
        await cluster.create(peering_path(peering), peering)
    async with operator_as_deployed(operator_args(objects)):
        await run_scenario(cluster)

    cluster_grants, role_grants = granted(objects)
    calls = operator_requests(emulator)
    denied = sorted(
        {
            (grant, namespace)
            for grant, namespace in calls
            if grant not in cluster_grants and grant not in role_grants.get(namespace or "", set())
        },
        key=str,
    )
    assert denied == [], f"the chart's RBAC does not allow these calls of the operator: {denied}"
    used = {grant for grant, _ in calls}
    unused = (cluster_grants | set().union(*role_grants.values())) - used - GRANTED_FOR_ADMISSION
    assert unused == set(), f"the chart grants what the operator never uses: {sorted(unused)}"


def test_chart_rbac_is_the_documented_api_access() -> None:
    """Across its scopings the chart grants exactly the API access docs/operator.md lists."""
    grants: set[Grant] = set()
    for sets in ([], [f"operator.watchNamespaces={{{NS}}}"]):
        cluster_grants, role_grants = granted(render_chart(sets=sets))
        grants |= cluster_grants.union(*role_grants.values())
    assert grants == documented_rbac()
