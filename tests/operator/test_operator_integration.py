"""The real operator over HTTP against the cluster emulator: pools, readiness, updates, restarts, cleanup."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.operator.harness import (
    DECISIONS,
    ISVCS,
    KSERVE_CRD,
    NODES,
    EmulatedCluster,
    documented_rbac,
    fast_settings,
    gpu_node,
    running_operator,
)
from tests.operator.rbac_record import RECORD_ENV
from tests.polling import eventually_async

NS = "ml"
DECISION = "clef"
H100 = dict(product="NVIDIA-H100-80GB-HBM3", family="hopper", major=9, minor=0)
L4 = dict(product="NVIDIA-L4", family="ada-lovelace", major=8, minor=9)
A100 = dict(product="NVIDIA-A100-SXM4-80GB", family="ampere", major=8, minor=0)
B200 = dict(product="NVIDIA-B200", family="blackwell", major=10, minor=0)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

pytestmark = [pytest.mark.timeout(120), pytest.mark.looptime]


def decision(**spec: Any) -> dict[str, Any]:
    """A ClefDecision in namespace ``ml``."""
    return {
        "apiVersion": "clef-serving.io/v1alpha1",
        "kind": "ClefDecision",
        "metadata": {"name": DECISION, "namespace": NS},
        "spec": {"model": {"storageUri": "hf://cloudflare/clef-flash-fp8", "name": "clef-flash"}, **spec},
    }


async def isvc_names(cluster: EmulatedCluster) -> list[str]:
    """Names of the InferenceServices in the namespace."""
    return sorted(item["metadata"]["name"] for item in await cluster.items(ISVCS.format(ns=NS)))


async def status(cluster: EmulatedCluster) -> dict[str, Any]:
    """The ClefDecision's status."""
    return (await cluster.get(f"{DECISIONS.format(ns=NS)}/{DECISION}")).get("status") or {}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    """One condition of a status."""
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


async def seed_three_pools(cluster: EmulatedCluster) -> None:
    """An H100 pool (2 nodes), an L4 pool and an A100 pool."""
    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    await cluster.create(NODES, gpu_node("h100-b", "h100-pool", **H100))
    await cluster.create(NODES, gpu_node("l4-a", "l4-pool", gpus=4, **L4))
    await cluster.create(NODES, gpu_node("a100-a", "a100-pool", **A100))
    await cluster.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-a"}})


async def mark_ready(cluster: EmulatedCluster, name: str) -> None:
    """Let KServe report an InferenceService Ready (via its status subresource)."""
    await cluster.merge(
        f"{ISVCS.format(ns=NS)}/{name}/status",
        {
            "status": {
                "url": f"http://{name}.{NS}.example.com",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            }
        },
    )


def volume(predictor: dict[str, Any], name: str) -> dict[str, Any]:
    """One of a pod spec's volumes, by name."""
    return next(v for v in predictor["volumes"] if v["name"] == name)


@pytest.mark.looptime(False)  # the grace period ends on the wall clock (removalAt is a wall-clock time)
async def test_pools_readiness_updates_and_cleanup(cluster: EmulatedCluster) -> None:
    await seed_three_pools(cluster)
    await cluster.create(DECISIONS.format(ns=NS), decision(nodePools={"removalGracePeriod": "1s"}))
    async with running_operator():
        assert await eventually_async(lambda: _equals(isvc_names(cluster), ["clef-h100-pool", "clef-l4-pool"]))
        current = await eventually_async(lambda: _when(status(cluster), lambda s: len(s.get("pools", [])) == 3))
        pools = {pool["name"]: pool for pool in current["pools"]}
        assert pools["a100-pool"]["eligible"] is False
        assert pools["a100-pool"]["reason"] == "ComputeCapabilityTooLow"
        assert pools["a100-pool"]["gpu"] == {
            "count": 8,
            "product": "NVIDIA-A100-SXM4-80GB",
            "family": "ampere",
            "computeCapability": "8.0",
        }
        assert pools["h100-pool"]["nodes"] == 2 and pools["h100-pool"]["inferenceService"] == "clef-h100-pool"
        assert condition(current, "NodePoolsEligible")["status"] == "True"
        assert condition(current, "Ready")["status"] == "False"
        assert current["poolsReady"] == "0/2"

        isvc = await cluster.get(f"{ISVCS.format(ns=NS)}/clef-l4-pool")
        predictor = isvc["spec"]["predictor"]
        assert predictor["nodeSelector"] == {"cloud.google.com/gke-nodepool": "l4-pool"}
        assert volume(predictor, "compile-cache") == {"name": "compile-cache", "emptyDir": {}}
        assert predictor["securityContext"]["fsGroup"] == 10001
        owner = isvc["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("ClefDecision", DECISION, True)

        # A new pool's nodes appear: a third InferenceService.
        await cluster.create(NODES, gpu_node("b200-a", "b200-pool", **B200))
        await eventually_async(
            lambda: _equals(isvc_names(cluster), ["clef-b200-pool", "clef-h100-pool", "clef-l4-pool"])
        )

        # A pool's nodes vanish: its InferenceService goes once the (here 1 s) removal grace period is over.
        await cluster.delete(f"{NODES}/b200-a")
        await eventually_async(lambda: _equals(isvc_names(cluster), ["clef-h100-pool", "clef-l4-pool"]))

        # Readiness: the pool, then the ClefDecision only once every eligible pool is Ready.
        await mark_ready(cluster, "clef-h100-pool")
        current = await eventually_async(lambda: _when(status(cluster), lambda s: s.get("readyPools") == 1))
        pools = {pool["name"]: pool for pool in current["pools"]}
        assert pools["h100-pool"]["ready"] is True and pools["h100-pool"]["url"].startswith("http://clef-h100-pool")
        assert pools["l4-pool"]["ready"] is False
        assert condition(current, "Ready")["status"] == "False"
        assert condition(current, "PredictorsReady")["reason"] == "PredictorsNotReady"
        await mark_ready(cluster, "clef-l4-pool")
        current = await eventually_async(
            lambda: _when(status(cluster), lambda s: condition(s, "Ready").get("status") == "True")
        )
        assert current["poolsReady"] == "2/2"

        # A spec change updates the children in place.
        cache = {"persistentVolumeClaim": {"claimName": "clef-compile-cache"}}
        await cluster.merge(
            f"{DECISIONS.format(ns=NS)}/{DECISION}",
            {"spec": {"predictor": {"maxModelLen": 4096, "compileCache": cache}}},
        )

        async def updated() -> bool:
            items = await cluster.items(ISVCS.format(ns=NS))
            return len(items) == 2 and all(
                "--max-model-len=4096" in item["spec"]["predictor"]["containers"][0]["args"]
                and volume(item["spec"]["predictor"], "compile-cache") == {"name": "compile-cache", **cache}
                for item in items
            )

        await eventually_async(updated)
        expected_reasons = {
            "InferenceServiceCreated",
            "InferenceServiceDeleted",
            "InferenceServiceUpdated",
            "PoolDegraded",
            "PoolEligible",
            "PoolIneligible",
            "PredictorsNotReady",
            "Ready",
        }

        async def posted() -> bool:
            events = await cluster.items(f"/api/v1/namespaces/{NS}/events")
            return expected_reasons <= {event["reason"] for event in events}

        await eventually_async(posted)

        # Delete: no finalizer holds the ClefDecision; garbage collection removes the children.
        await cluster.delete(f"{DECISIONS.format(ns=NS)}/{DECISION}")
        await eventually_async(lambda: _equals(isvc_names(cluster), []))
        creates = [
            path
            for method, path in cluster.emulator.served_requests()
            if method == "POST" and "inferenceservices" in path
        ]
    assert len(creates) == 3  # h100, l4, b200: never re-created


async def _equals(value: Any, expected: Any) -> bool:
    return (await value) == expected


async def _when(value: Any, predicate: Any) -> Any:
    result = await value
    return result if predicate(result) else None


async def test_restart_midway_converges_without_duplicates(cluster: EmulatedCluster) -> None:
    from clef_operator.kserve_backend import Placement, build_inferenceservice
    from clef_operator.pools import NodePool
    from clef_operator.spec import parse_spec

    await seed_three_pools(cluster)
    await cluster.create(DECISIONS.format(ns=NS), decision())
    async with running_operator():
        await eventually_async(lambda: _equals(isvc_names(cluster), ["clef-h100-pool", "clef-l4-pool"]))

    # While the operator is down: a pool appears and the spec changes.
    await cluster.create(NODES, gpu_node("b200-a", "b200-pool", **B200))
    await cluster.merge(f"{DECISIONS.format(ns=NS)}/{DECISION}", {"spec": {"gpusPerReplica": 2}})

    async with running_operator():
        expected = ["clef-b200-pool", "clef-h100-pool", "clef-l4-pool"]
        await eventually_async(lambda: _equals(isvc_names(cluster), expected))

        async def converged() -> bool:
            items = await cluster.items(ISVCS.format(ns=NS))
            return all("--dp=2" in i["spec"]["predictor"]["containers"][0]["args"] for i in items)

        await eventually_async(converged)
        await eventually_async(lambda: _when(status(cluster), lambda s: s.get("eligiblePools") == 3))

    spec = parse_spec((await cluster.get(f"{DECISIONS.format(ns=NS)}/{DECISION}"))["spec"])
    for item in await cluster.items(ISVCS.format(ns=NS)):
        pool = item["metadata"]["annotations"]["clef-serving.io/pool"]
        fresh = build_inferenceservice(
            Placement(
                decision=DECISION, namespace=NS, spec=spec, pool=NodePool(pool, "cloud.google.com/gke-nodepool", ())
            )
        )
        assert item["spec"] == fresh["spec"]
    creates = [
        path
        for method, path in cluster.emulator.served_requests()
        if method == "POST" and path.endswith("/inferenceservices")
    ]
    assert len(creates) == 3


async def test_kserve_missing_is_reported_then_recovered(bare_cluster: EmulatedCluster) -> None:
    cluster = bare_cluster
    await seed_three_pools(cluster)
    await cluster.create(DECISIONS.format(ns=NS), decision(backend="kserve"))
    async with running_operator() as operator:
        current = await eventually_async(
            lambda: _when(status(cluster), lambda s: condition(s, "Ready").get("reason") == "KServeNotInstalled")
        )
        assert condition(current, "PredictorsReady")["reason"] == "KServeNotInstalled"
        assert condition(current, "NodePoolsEligible")["status"] == "True"
        assert not operator.done()

        await cluster.install_kserve()
        await eventually_async(lambda: _equals(isvc_names(cluster), ["clef-h100-pool", "clef-l4-pool"]))
        await eventually_async(
            lambda: _when(
                status(cluster), lambda s: condition(s, "PredictorsReady").get("reason") == "PredictorsNotReady"
            )
        )


async def names(cluster: EmulatedCluster, path: str) -> list[str]:
    """Names of the objects of a collection."""
    return sorted(item["metadata"]["name"] for item in await cluster.items(path))


async def test_without_kserve_the_deployment_backend_serves_and_a_switch_cleans_up(
    bare_cluster: EmulatedCluster,
) -> None:
    cluster = bare_cluster
    deployments, services = f"/apis/apps/v1/namespaces/{NS}/deployments", f"/api/v1/namespaces/{NS}/services"
    hpas = f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers"
    decision_path = f"{DECISIONS.format(ns=NS)}/{DECISION}"
    await seed_three_pools(cluster)
    # Someone else's Deployment holds the L4 pool's name.
    foreign = {"matchLabels": {"app": "someone-else"}}
    await cluster.create(
        deployments,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "clef-l4-pool", "namespace": NS},
            "spec": {"selector": foreign, "template": {"metadata": {"labels": foreign["matchLabels"]}}},
        },
    )
    await cluster.create(DECISIONS.format(ns=NS), decision())
    served = ["clef-h100-pool", "clef-l4-pool"]
    async with running_operator():
        # No InferenceService resource: the deployment backend, a Deployment and a Service per eligible pool.
        current = await eventually_async(lambda: _when(status(cluster), lambda s: s.get("backend") == "deployment"))
        l4 = await eventually_async(
            lambda: _when(status(cluster), lambda s: any(p.get("state") == "Conflict" for p in s.get("pools", [])))
        )
        conflict = next(p for p in l4["pools"] if p["name"] == "l4-pool")
        assert (
            conflict["predictorReason"] == "NameTaken"
            and "a Deployment named clef-l4-pool" in conflict["predictorMessage"]
        )
        await cluster.delete(f"{deployments}/clef-l4-pool")
        await eventually_async(lambda: _equals(names(cluster, deployments), served))
        await eventually_async(lambda: _equals(names(cluster, services), served))
        current = await eventually_async(
            lambda: _when(status(cluster), lambda s: all(p.get("state") != "Conflict" for p in s.get("pools", [])))
        )
        assert {pool["name"]: pool.get("deployment") for pool in current["pools"] if pool["eligible"]} == {
            "h100-pool": "clef-h100-pool",
            "l4-pool": "clef-l4-pool",
        }
        for name in served:  # the Deployment controller's report: every replica available
            live = await cluster.get(f"{deployments}/{name}")
            await cluster.merge(
                f"{deployments}/{name}/status",
                {
                    "status": {
                        "observedGeneration": live["metadata"]["generation"],
                        "replicas": 1,
                        "updatedReplicas": 1,
                        "availableReplicas": 1,
                    }
                },
            )
        ready = await eventually_async(
            lambda: _when(status(cluster), lambda s: condition(s, "Ready").get("status") == "True")
        )
        assert condition(ready, "PredictorsReady")["message"] == "2/2 Deployments ready"
        assert {pool.get("url") for pool in ready["pools"] if pool["eligible"]} == {
            f"http://{name}.{NS}.svc" for name in served
        }
        # Autoscaling: an autoscaler per pool, changed with the spec; a hand-edited Service is put back.
        autoscaling = {"minReplicas": 1, "maxReplicas": 2}
        await cluster.merge(decision_path, {"spec": {"autoscaling": autoscaling, "predictor": {"maxModelLen": 4096}}})
        await eventually_async(lambda: _equals(names(cluster, hpas), served))

        async def updated() -> bool:
            pods = [d["spec"]["template"]["spec"] for d in await cluster.items(deployments)]
            return all("--max-model-len=4096" in pod["containers"][0]["args"] for pod in pods)

        await eventually_async(updated)
        await cluster.merge(f"{services}/clef-l4-pool", {"spec": {"ports": [{"name": "x", "port": 1}]}})
        await cluster.merge(decision_path, {"spec": {"autoscaling": {"maxReplicas": 3}}})

        async def repaired() -> bool:
            autoscalers = await cluster.items(hpas)
            service = await cluster.get(f"{services}/clef-l4-pool")
            return all(h["spec"]["maxReplicas"] == 3 for h in autoscalers) and service["spec"]["ports"][0]["port"] == 80

        await eventually_async(repaired)
        # autoscaling.keda without KEDA: the pools fail naming it and keep their autoscalers; KEDA installed, a
        # ScaledObject per pool replaces each HorizontalPodAutoscaler and follows the spec.
        scaled_objects = f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects"
        keda = {"serverAddress": "http://prometheus.monitoring:9090"}
        await cluster.merge(decision_path, {"spec": {"autoscaling": {"keda": keda}}})
        failed = await eventually_async(
            lambda: _when(
                status(cluster),
                lambda s: [p.get("state") for p in s.get("pools", []) if p["eligible"]] == ["Failed", "Failed"],
            )
        )
        assert all("autoscaling.keda needs KEDA" in p["predictorMessage"] for p in failed["pools"] if p["eligible"])
        assert await names(cluster, hpas) == served
        await cluster.install_keda()
        await eventually_async(lambda: _equals(names(cluster, scaled_objects), served))
        await eventually_async(lambda: _equals(names(cluster, hpas), []))
        await cluster.merge(decision_path, {"spec": {"autoscaling": {"keda": {"target": "8"}}}})

        async def retargeted() -> bool:
            triggers = [o["spec"]["triggers"][0]["metadata"] for o in await cluster.items(scaled_objects)]
            return len(triggers) == 2 and all(t["threshold"] == "8" for t in triggers)

        await eventually_async(retargeted)
        await cluster.merge(decision_path, {"spec": {"autoscaling": None}})
        await eventually_async(lambda: _equals(names(cluster, scaled_objects), []))
        assert await names(cluster, hpas) == []
        # KServe arrives and the spec asks for it: InferenceServices replace the Deployments and Services.
        await cluster.install_kserve()
        await cluster.merge(decision_path, {"spec": {"backend": "kserve"}})
        await eventually_async(lambda: _equals(isvc_names(cluster), served))
        await eventually_async(lambda: _equals(names(cluster, deployments), []))
        await eventually_async(lambda: _equals(names(cluster, services), []))
        await eventually_async(lambda: _when(status(cluster), lambda s: s.get("backend") == "kserve"))


async def test_a_crd_discovery_does_not_list_yet_decides_nothing(bare_cluster: EmulatedCluster) -> None:
    """KServe's CRD exists but discovery leaves it out (as just after an API server start): no backend is chosen
    and nothing is created until discovery lists it; then the InferenceServices come."""
    cluster = bare_cluster
    await seed_three_pools(cluster)
    await cluster.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", KSERVE_CRD)
    await cluster.create(DECISIONS.format(ns=NS), decision())
    deployments = f"/apis/apps/v1/namespaces/{NS}/deployments"
    async with running_operator():
        await asyncio.sleep(2.0)  # several passes with backoff (CLEF_RETRY_BASE_SECONDS=0.2)
        assert "backend" not in await status(cluster)
        assert await names(cluster, deployments) == []
        cluster.emulator.add_crd(KSERVE_CRD)
        await eventually_async(lambda: _equals(isvc_names(cluster), ["clef-h100-pool", "clef-l4-pool"]))
        await eventually_async(lambda: _when(status(cluster), lambda s: s.get("backend") == "kserve"))
        assert await names(cluster, deployments) == []


async def test_invalid_spec_gets_a_condition_naming_the_field(cluster: EmulatedCluster) -> None:
    await seed_three_pools(cluster)
    bad = decision()
    bad["spec"]["model"]["storageUri"] = "ftp://example.com/model"
    await cluster.create(DECISIONS.format(ns=NS), bad)
    async with running_operator():
        current = await eventually_async(
            lambda: _when(status(cluster), lambda s: condition(s, "Ready").get("reason") == "InvalidSpec")
        )
        assert "spec.model.storageUri" in condition(current, "Ready")["message"]

        # Fixing the spec recovers.
        await cluster.merge(
            f"{DECISIONS.format(ns=NS)}/{DECISION}", {"spec": {"model": {"storageUri": "pvc://models/clef-flash-fp8"}}}
        )
        await eventually_async(lambda: _equals(isvc_names(cluster), ["clef-h100-pool", "clef-l4-pool"]))


async def test_namespace_scoping(cluster: EmulatedCluster) -> None:
    await seed_three_pools(cluster)
    other = decision()
    other["metadata"]["namespace"] = "elsewhere"
    await cluster.create(DECISIONS.format(ns="elsewhere"), other)
    await cluster.create(DECISIONS.format(ns=NS), decision())
    # The emulator cannot serve /api/v1/namespaces, so kopf takes the namespace list as given.
    settings = fast_settings()
    settings.scanning.disabled = True
    async with running_operator(clusterwide=False, namespaces=[NS], settings=settings):
        await eventually_async(lambda: _equals(isvc_names(cluster), ["clef-h100-pool", "clef-l4-pool"]))
        assert await cluster.items(ISVCS.format(ns="elsewhere")) == []
        assert "status" not in await cluster.get(f"{DECISIONS.format(ns='elsewhere')}/{DECISION}")


# Needed on a real cluster but not exercised against the emulator: ownerReferences with
# blockOwnerDeletion (admission checks clefdecisions/finalizers), kopf peering (these tests run
# --standalone) and namespace discovery when namespace-scoped (the emulator cannot serve it).
NOT_OBSERVABLE = {
    ("clef-serving.io", "clefdecisions/finalizers", "update"),
    ("kopf.dev", "clusterkopfpeerings", "list"),
    ("kopf.dev", "clusterkopfpeerings", "watch"),
    ("kopf.dev", "clusterkopfpeerings", "patch"),
    ("kopf.dev", "kopfpeerings", "list"),
    ("kopf.dev", "kopfpeerings", "watch"),
    ("kopf.dev", "kopfpeerings", "patch"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
}


SCENARIO_MODULES = {"test_operator_integration.py", "test_cluster_life.py"}


def run_scenarios_apart(tmp_path: Path, exclude: str) -> dict[str, set[tuple[str, str, str]]]:
    """Run every scenario of SCENARIO_MODULES in a separate pytest process; the RBAC requests each made."""
    record = tmp_path / "rbac.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.operator.rbac_record",
            "-k",
            f"not {exclude}",
            *(str(HERE / name) for name in sorted(SCENARIO_MODULES)),
        ],
        cwd=REPO,
        env={**os.environ, RECORD_ENV: str(record)},
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert done.returncode == 0, f"the operator scenarios failed:\n{done.stdout[-5000:]}{done.stderr[-3000:]}"
    return {name: {tuple(triple) for triple in triples} for name, triples in json.loads(record.read_text()).items()}


@pytest.mark.timeout(900)
def test_documented_rbac_matches_requests(
    request: pytest.FixtureRequest, observed_rbac: dict[str, set[tuple[str, str, str]]], tmp_path: Path
) -> None:
    """Every request the operator made is in docs/operator.md's list, and the list has nothing unused."""
    # The scenarios of this module and of test_cluster_life.py (name collisions need `get`).
    scenarios = [
        item.name
        for item in request.session.items
        if item.path.name in SCENARIO_MODULES and item.name != request.node.name
    ]
    collected = {item.path.name for item in request.session.items}
    if not collected >= SCENARIO_MODULES or not all(name in observed_rbac for name in scenarios):
        observed_rbac = run_scenarios_apart(tmp_path, exclude=request.node.name)
        scenarios = list(observed_rbac)
    observed = set().union(*(observed_rbac[name] for name in scenarios))
    documented = documented_rbac()
    assert observed - documented == set(), "requests not covered by docs/operator.md"
    assert documented - observed == NOT_OBSERVABLE
