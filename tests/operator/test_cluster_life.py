"""Cluster life against the real operator on the emulator, where a scenario needs time fast-forwarded or a fault
injected, or counts the operator's own writes: grace periods, refused pools, mixed and declared pools, ownership
metadata, name collisions, variants. What the API server itself does (GFD labels arriving late, a node replaced,
a hand edit reverted, a deletion while the operator is down, kills, a freed name) is tested on a real control
plane: tests/cluster/test_2_cluster_life.py and test_2b_operator_limits.py.

Each scenario asserts the final objects and the operator's writes to InferenceServices (counted from the
requests the emulator served to the operator, not to the test).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from clef_operator import work_queue
from clef_operator.kserve_backend import Placement, build_inferenceservice
from clef_operator.pools import NodePool
from clef_operator.spec import parse_spec
from tests.operator.harness import (
    DECISIONS,
    ISVCS,
    NODES,
    EmulatedCluster,
    decision,
    gpu_node,
    running_operator,
)
from tests.polling import eventually_async

NS = "ml"
GKE = "cloud.google.com/gke-nodepool"
KARPENTER = "karpenter.sh/nodepool"
H100 = dict(product="NVIDIA-H100-80GB-HBM3", family="hopper", major=9, minor=0)
L4 = dict(product="NVIDIA-L4", family="ada-lovelace", major=8, minor=9)
A100 = dict(product="NVIDIA-A100-SXM4-80GB", family="ampere", major=8, minor=0)
B200 = dict(product="NVIDIA-B200", family="blackwell", major=10, minor=0)
SETTLE = 1.5  # seconds of quiet after a change, in which a wrong write would show up

pytestmark = [pytest.mark.timeout(180), pytest.mark.looptime]


async def isvcs(cluster: EmulatedCluster) -> dict[str, dict[str, Any]]:
    """The InferenceServices in the namespace, by name."""
    return {item["metadata"]["name"]: item for item in await cluster.items(ISVCS.format(ns=NS))}


async def status(cluster: EmulatedCluster, name: str = "clef") -> dict[str, Any]:
    """A ClefDecision's status."""
    return (await cluster.get(f"{DECISIONS.format(ns=NS)}/{name}")).get("status") or {}


def pools(current: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """status.pools by pool name."""
    return {pool["name"]: pool for pool in current.get("pools", [])}


def writes(cluster: EmulatedCluster) -> Counter[tuple[str, str]]:
    """The operator's writes to InferenceServices as (METHOD, name) counts."""
    return Counter(cluster.emulator.operator_writes("inferenceservices"))


async def pool_state(
    cluster: EmulatedCluster, pool: str, state: str, name: str = "clef", **fields: Any
) -> dict[str, Any]:
    """Wait until a pool's status entry has ``state`` (and ``fields``); return that entry."""

    async def check() -> dict[str, Any] | None:
        entry = pools(await status(cluster, name)).get(pool)
        ok = entry is not None and entry.get("state") == state and all(entry.get(k) == v for k, v in fields.items())
        return entry if ok else None

    return await eventually_async(check)


async def has_isvcs(cluster: EmulatedCluster, expected: set[str]) -> None:
    """Wait until exactly these InferenceServices exist."""

    async def check() -> bool:
        return set(await isvcs(cluster)) == expected

    await eventually_async(check)


async def label(cluster: EmulatedCluster, node: str, labels: dict[str, str | None]) -> None:
    """Merge-patch a node's labels (None removes one)."""
    await cluster.merge(f"{NODES}/{node}", {"metadata": {"labels": labels}})


def expected_isvc(spec: dict[str, Any], pool: str, key: str = GKE, **options: Any) -> dict[str, Any]:
    """What the builders make for a pool (the spec the operator must converge to)."""
    return build_inferenceservice(
        Placement(decision="clef", namespace=NS, spec=parse_spec(spec), pool=NodePool(pool, key, ()), **options)
    )["spec"]


@pytest.mark.looptime(False)  # the grace period ends on the wall clock (removalAt is a wall-clock time)
async def test_degraded_pool_is_removed_after_the_grace_period(cluster: EmulatedCluster) -> None:
    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    await cluster.create(NODES, gpu_node("l4-a", "l4-pool", **L4))
    await cluster.create(DECISIONS.format(ns=NS), decision(nodePools={"removalGracePeriod": "3s"}))
    async with running_operator():
        await has_isvcs(cluster, {"clef-h100-pool", "clef-l4-pool"})
        await cluster.delete(f"{NODES}/l4-a")
        await pool_state(cluster, "l4-pool", "Degraded", reason="NoNodes")
        assert set(await isvcs(cluster)) == {"clef-h100-pool", "clef-l4-pool"}
        # The scheduler wakes up at removalAt (no resync needed): the predictor goes, the pool leaves the status.
        await has_isvcs(cluster, {"clef-h100-pool"})
        await eventually_async(lambda: _without(cluster, "l4-pool"))
        await asyncio.sleep(SETTLE)
    assert writes(cluster) == {
        ("POST", "clef-h100-pool"): 1,
        ("POST", "clef-l4-pool"): 1,
        ("DELETE", "clef-l4-pool"): 1,
    }


async def _without(cluster: EmulatedCluster, pool: str) -> bool:
    current = await status(cluster)
    return bool(current.get("pools")) and pool not in pools(current)


async def test_mixed_pool_serves_on_its_capable_nodes(cluster: EmulatedCluster) -> None:
    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    body = decision()
    await cluster.create(DECISIONS.format(ns=NS), body)
    async with running_operator():
        await has_isvcs(cluster, {"clef-h100-pool"})
        await cluster.create(NODES, gpu_node("a100-x", "h100-pool", **A100))
        entry = await pool_state(cluster, "h100-pool", "Serving", nodes=2)
        assert "1 of 2 nodes" in entry["message"] and entry["gpu"]["computeCapability"] == "9.0"
        await asyncio.sleep(SETTLE)
    predictor = (await isvcs(cluster))["clef-h100-pool"]["spec"]["predictor"]
    terms = predictor["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "nvidia.com/gpu.compute.major", "operator": "Gt", "values": ["8"]}
    ]
    assert {"predictor": predictor} == expected_isvc(body["spec"], "h100-pool")
    assert writes(cluster) == {("POST", "clef-h100-pool"): 1}


async def test_empty_declared_pool_gets_a_predictor(cluster: EmulatedCluster) -> None:
    body = decision(
        nodePools={
            "declared": [{"name": "gpu-h100", "labelKey": KARPENTER, "computeCapability": "9.0", "gpusPerNode": 8}]
        }
    )
    await cluster.create(DECISIONS.format(ns=NS), body)
    async with running_operator():
        await has_isvcs(cluster, {"clef-gpu-h100"})
        entry = await pool_state(cluster, "gpu-h100", "Serving", reason="Declared", nodes=0)
        assert entry["gpu"] == {"count": 8, "computeCapability": "9.0"}
        # Karpenter brings up the first node: nothing to change.
        await cluster.create(NODES, gpu_node("karp-1", "gpu-h100", pool_key=KARPENTER, **H100))
        await pool_state(cluster, "gpu-h100", "Serving", reason="Eligible", nodes=1)
        await asyncio.sleep(SETTLE)
    isvc = (await isvcs(cluster))["clef-gpu-h100"]
    assert isvc["spec"]["predictor"]["nodeSelector"] == {KARPENTER: "gpu-h100"}
    assert isvc["spec"] == expected_isvc(body["spec"], "gpu-h100", KARPENTER)
    assert writes(cluster) == {("POST", "clef-gpu-h100"): 1}


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (403, "exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1"),
        (422, 'admission webhook "policy.example.com" denied the request: GPU class not allowed'),
    ],
)
async def test_a_refused_pool_fails_alone(cluster: EmulatedCluster, code: int, message: str) -> None:
    for node, pool, gpu in (("h100-a", "h100-pool", H100), ("b200-a", "b200-pool", B200)):
        await cluster.create(NODES, gpu_node(node, pool, **gpu))
    await cluster.create(DECISIONS.format(ns=NS), decision())
    async with running_operator():
        await has_isvcs(cluster, {"clef-h100-pool", "clef-b200-pool"})
        # A third pool appears (a node-triggered pass) and its create is refused.
        cluster.emulator.refusals[("POST", "inferenceservices", "clef-l4-pool")] = (code, message)
        await cluster.create(NODES, gpu_node("l4-a", "l4-pool", **L4))
        failed = await pool_state(cluster, "l4-pool", "Failed")
        assert str(code) in failed["predictorMessage"] and message in failed["predictorMessage"]
        current = await status(cluster)
        predictors = next(c for c in current["conditions"] if c["type"] == "PredictorsReady")
        assert predictors["reason"] == "PoolFailed" and "l4-pool" in predictors["message"]
        assert pools(current)["h100-pool"]["state"] == pools(current)["b200-pool"]["state"] == "Serving"

        async def warned() -> bool:
            events = await cluster.items(f"/api/v1/namespaces/{NS}/events")
            return any(
                e["reason"] == "InferenceServiceFailed" and e["type"] == "Warning" and message in e["message"]
                for e in events
            )

        await eventually_async(warned)
        # The quota is raised: the scheduler's retry (with backoff, no other trigger) creates it.
        del cluster.emulator.refusals[("POST", "inferenceservices", "clef-l4-pool")]
        await has_isvcs(cluster, {"clef-h100-pool", "clef-b200-pool", "clef-l4-pool"})
        await pool_state(cluster, "l4-pool", "Serving")
        await asyncio.sleep(SETTLE)
    counts = writes(cluster)
    assert counts[("POST", "clef-h100-pool")] == counts[("POST", "clef-b200-pool")] == 1
    assert counts[("POST", "clef-l4-pool")] >= 2  # refused, then retried
    assert not [w for w in counts if w[0] != "POST"]


@pytest.mark.parametrize(
    "edit",
    [
        {"annotations": {"clef-serving.io/pool": "another-pool"}},
        {"labels": {"clef-serving.io/decision": "someone-else"}},
        {
            "annotations": {"clef-serving.io/pool-label-key": "example.com/pool"},
            "labels": {"clef-serving.io/pool": "x"},
        },
    ],
)
async def test_hand_edit_of_ownership_metadata_is_put_back(cluster: EmulatedCluster, edit: dict[str, Any]) -> None:
    """Ownership is the controller ownerReference: an edited pool annotation or decision label is put back on the
    same InferenceService, never a reason for a second one, a deletion or a pool left Pending."""
    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    await cluster.create(DECISIONS.format(ns=NS), decision())
    async with running_operator():
        await has_isvcs(cluster, {"clef-h100-pool"})
        before = (await isvcs(cluster))["clef-h100-pool"]["metadata"]
        await cluster.merge(f"{ISVCS.format(ns=NS)}/clef-h100-pool", {"metadata": edit})

        async def restored() -> bool:
            meta = (await isvcs(cluster))["clef-h100-pool"]["metadata"]
            return meta["labels"] == before["labels"] and meta["annotations"] == before["annotations"]

        await eventually_async(restored)
        await pool_state(cluster, "h100-pool", "Serving")
        await asyncio.sleep(SETTLE)
    assert set(await isvcs(cluster)) == {"clef-h100-pool"}
    assert (await isvcs(cluster))["clef-h100-pool"]["metadata"]["uid"] == before["uid"]
    counts = writes(cluster)
    assert counts[("PATCH", "clef-h100-pool")] == 1 and counts[("POST", "clef-h100-pool")] <= 2, counts
    assert not [w for w in counts if w[0] == "DELETE" or w[1] != "clef-h100-pool"], counts


# The deployment backend's objects that go with each pool's Deployment, by plural: their collection's path.
COMPANION_PATHS = {
    "services": "/api/v1/namespaces/{ns}/services",
    "horizontalpodautoscalers": "/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers",
    "scaledobjects": "/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects",
}
KEDA = {"serverAddress": "http://prometheus.monitoring:9090", "target": "2"}


@pytest.mark.parametrize("plural", sorted(COMPANION_PATHS))
async def test_hand_edited_decision_label_of_a_companion_is_put_back(
    bare_cluster: EmulatedCluster, monkeypatch: pytest.MonkeyPatch, plural: str
) -> None:
    """A Service, HorizontalPodAutoscaler or ScaledObject whose decision label is edited by hand is missed by the list
    by that label: the refused create (409) finds it controlled by this ClefDecision, and it is repaired in place
    at the next pass, with no second object, no deletion and no refused create on every pass."""
    monkeypatch.setattr(work_queue, "RESYNC_SECONDS", 2.0)  # companions are not watched: the resync repairs them
    cluster = bare_cluster
    path = COMPANION_PATHS[plural].format(ns=NS)
    autoscaling: dict[str, Any] = {"minReplicas": 1, "maxReplicas": 2}
    if plural == "scaledobjects":
        await cluster.install_keda()
        autoscaling["keda"] = KEDA
    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    await cluster.create(DECISIONS.format(ns=NS), decision(backend="deployment", autoscaling=autoscaling))

    async def companion() -> dict[str, Any] | None:
        return next((i for i in await cluster.items(path) if i["metadata"]["name"] == "clef-h100-pool"), None)

    async with running_operator():
        before = (await eventually_async(companion))["metadata"]
        await pool_state(cluster, "h100-pool", "Serving")
        await cluster.merge(f"{path}/clef-h100-pool", {"metadata": {"labels": {"clef-serving.io/decision": "x"}}})

        async def restored() -> bool:
            meta = ((await companion()) or {}).get("metadata") or {}
            return meta.get("labels") == before["labels"]

        await eventually_async(restored)
        await asyncio.sleep(3 * work_queue.RESYNC_SECONDS)  # later passes find it by its label again
        await pool_state(cluster, "h100-pool", "Serving")
    assert [i["metadata"]["uid"] for i in await cluster.items(path)] == [before["uid"]]
    counts = Counter(cluster.emulator.operator_writes(plural))
    # The first create, one refused create that finds the edited object, one repair.
    assert counts == {("POST", "clef-h100-pool"): 2, ("PATCH", "clef-h100-pool"): 1}, counts


async def test_name_collision_between_clefdecisions(cluster: EmulatedCluster) -> None:
    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    await cluster.create(NODES, gpu_node("p-a", "pool", **H100))
    await cluster.create(DECISIONS.format(ns=NS), decision(nodePools={"include": ["h100-pool"]}))
    async with running_operator():
        await has_isvcs(cluster, {"clef-h100-pool"})
        # "clef" x "h100-pool" and "clef-h100" x "pool" both want clef-h100-pool.
        await cluster.create(DECISIONS.format(ns=NS), decision("clef-h100", nodePools={"include": ["pool"]}))
        entry = await pool_state(cluster, "pool", "Conflict", name="clef-h100", predictorReason="NameCollision")
        assert "ClefDecision clef" in entry["predictorMessage"]

        async def warned() -> bool:
            events = await cluster.items(f"/api/v1/namespaces/{NS}/events")
            return any(e["reason"] == "NameCollision" and e["involvedObject"]["name"] == "clef-h100" for e in events)

        await eventually_async(warned)
        await asyncio.sleep(SETTLE)
    (isvc,) = (await isvcs(cluster)).values()
    assert isvc["metadata"]["ownerReferences"][0]["name"] == "clef"
    counts = writes(cluster)
    assert not [w for w in counts if w[0] != "POST"]  # no flip-flop: nobody patches or deletes the other's
    assert counts[("POST", "clef-h100-pool")] >= 2


async def test_same_pool_name_under_two_label_keys(cluster: EmulatedCluster) -> None:
    await cluster.create(NODES, gpu_node("gke-1", "gpu", **H100))
    await cluster.create(NODES, gpu_node("karp-1", "gpu", pool_key=KARPENTER, **L4))
    await cluster.create(DECISIONS.format(ns=NS), decision())
    async with running_operator():
        await eventually_async(lambda: _count(isvcs(cluster), 2))
        await asyncio.sleep(SETTLE)
    items = await isvcs(cluster)
    selectors = {name: item["spec"]["predictor"]["nodeSelector"] for name, item in items.items()}
    assert selectors["clef-gpu"] == {GKE: "gpu"}
    (other,) = set(items) - {"clef-gpu"}
    assert other.startswith("clef-gpu-") and selectors[other] == {KARPENTER: "gpu"}
    assert writes(cluster) == {("POST", "clef-gpu"): 1, ("POST", other): 1}


async def _count(value: Any, expected: int) -> bool:
    return len(await value) == expected


async def test_gfd_timestamp_relabel_triggers_nothing(cluster: EmulatedCluster) -> None:
    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    await cluster.create(DECISIONS.format(ns=NS), decision())
    async with running_operator():
        await pool_state(cluster, "h100-pool", "Serving")
        await asyncio.sleep(SETTLE)
        listed = _operator_lists(cluster)
        before = writes(cluster)
        for stamp in range(5):
            await label(
                cluster,
                "h100-a",
                {"nvidia.com/gfd.timestamp": str(1767225600 + 60 * stamp), "nvidia.com/cuda.driver.rev": str(stamp)},
            )
        await asyncio.sleep(SETTLE)
        assert _operator_lists(cluster) == listed  # not even a reconcile pass
    assert writes(cluster) == before == {("POST", "clef-h100-pool"): 1}


def _operator_lists(cluster: EmulatedCluster) -> int:
    """LIST requests for InferenceServices (each reconcile pass makes one; kopf's watches are not counted)."""
    return sum(
        1
        for method, path in cluster.emulator.served_requests()
        if method == "GET" and path.split("?")[0].endswith("/inferenceservices") and "watch=" not in path
    )


async def test_variants_per_pool(cluster: EmulatedCluster) -> None:
    for node, pool, gpu in (
        ("l4-a", "ada", L4),
        ("h100-a", "hopper", H100),
        ("b200-a", "blackwell", B200),
        ("a100-a", "ampere", A100),
    ):
        await cluster.create(NODES, gpu_node(node, pool, **gpu))
    variants = [
        {"quantization": "fp8", "storageUri": "hf://cloudflare/clef-flash-fp8"},
        {"quantization": "nvfp4", "storageUri": "hf://cloudflare/clef-flash-nvfp4"},
    ]
    body = decision()
    body["spec"]["model"] = {"variants": variants}
    await cluster.create(DECISIONS.format(ns=NS), body)
    async with running_operator():
        await has_isvcs(cluster, {"clef-ada", "clef-hopper", "clef-blackwell"})
        entries = pools(await eventually_async(lambda: _when_pools(cluster, 4)))
        await asyncio.sleep(SETTLE)
    items = await isvcs(cluster)

    def storage(name: str) -> str:
        env = items[name]["spec"]["predictor"]["containers"][0]["env"]
        return next(e["value"] for e in env if e["name"] == "STORAGE_URI")

    assert storage("clef-ada") == storage("clef-hopper") == "hf://cloudflare/clef-flash-fp8"
    assert storage("clef-blackwell") == "hf://cloudflare/clef-flash-nvfp4"
    assert {name: entry.get("variant", {}).get("quantization") for name, entry in entries.items()} == {
        "ada": "fp8",
        "hopper": "fp8",
        "blackwell": "nvfp4",
        "ampere": None,
    }
    assert entries["ampere"]["state"] == "Ineligible"
    terms = items["clef-blackwell"]["spec"]["predictor"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert [t["matchExpressions"] for t in terms] == [  # 10.0 and later only
        [{"key": "nvidia.com/gpu.compute.major", "operator": "Gt", "values": ["10"]}],
        [
            {"key": "nvidia.com/gpu.compute.major", "operator": "In", "values": ["10"]},
            {"key": "nvidia.com/gpu.compute.minor", "operator": "Gt", "values": ["-1"]},
        ],
    ]
    assert items["clef-blackwell"]["metadata"]["annotations"]["clef-serving.io/variant"] == "nvfp4"
    assert sum(writes(cluster).values()) == 3


async def _when_pools(cluster: EmulatedCluster, count: int) -> dict[str, Any] | None:
    current = await status(cluster)
    return current if len(current.get("pools", [])) == count else None


async def test_single_storage_uri_spec_keeps_working_with_bf16_variant(cluster: EmulatedCluster) -> None:
    await cluster.create(NODES, gpu_node("a100-a", "ampere", **A100))
    await cluster.create(NODES, gpu_node("h100-a", "hopper", **H100))
    body = decision()
    body["spec"]["model"] = {
        "variants": [
            {"quantization": "bf16", "storageUri": "s3://m/bf16"},
            {"quantization": "fp8", "storageUri": "s3://m/fp8"},
        ]
    }
    await cluster.create(DECISIONS.format(ns=NS), body)
    async with running_operator():
        await has_isvcs(cluster, {"clef-ampere", "clef-hopper"})
        entries = pools(await eventually_async(lambda: _when_pools(cluster, 2)))
    assert entries["ampere"]["variant"] == {"quantization": "bf16", "storageUri": "s3://m/bf16"}
    assert entries["hopper"]["variant"] == {"quantization": "fp8", "storageUri": "s3://m/fp8"}


async def test_host_path_cache_only_under_the_allowed_prefix(cluster: EmulatedCluster) -> None:
    import kopf

    from clef_operator.pass_state import Policy
    from clef_operator.work_queue import OperatorState

    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    cache = {"hostPath": {"path": "/var/cache/clef/ml", "type": "DirectoryOrCreate"}}
    await cluster.create(DECISIONS.format(ns=NS), decision(predictor={"compileCache": cache}))
    async with running_operator():  # no --allow-host-path-prefix: refused, naming the field
        refused = await eventually_async(lambda: _ready_reason(cluster, "InvalidSpec"))
        assert refused["message"].startswith("spec.predictor.compileCache.hostPath.path: hostPath compile caches")
    assert await isvcs(cluster) == {}
    memo = kopf.Memo()
    memo.clef = OperatorState(policy=Policy(host_path_prefixes=("/var/cache/clef",)))
    async with running_operator(memo=memo):
        await has_isvcs(cluster, {"clef-h100-pool"})
    volumes = (await isvcs(cluster))["clef-h100-pool"]["spec"]["predictor"]["volumes"]
    assert {"name": "compile-cache", **cache} in volumes


async def _ready_reason(cluster: EmulatedCluster, reason: str) -> dict[str, Any] | None:
    ready = next((c for c in (await status(cluster)).get("conditions", []) if c["type"] == "Ready"), {})
    return ready if ready.get("reason") == reason else None
