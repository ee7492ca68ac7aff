"""A quiet operator: refusals back off per object, owned-object events reconcile one pool's owner without a
storm of passes, Events are posted once per condition. (A child that lost its owner reference is adopted back on
the real API server: tests/cluster/test_2b_operator_limits.py.)"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from clef_operator import handlers
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
H100 = dict(product="NVIDIA-H100-80GB-HBM3", family="hopper", major=9, minor=0)
L4 = dict(product="NVIDIA-L4", family="ada-lovelace", major=8, minor=9)
pytestmark = [pytest.mark.timeout(180), pytest.mark.looptime]


async def pool_entry(cluster: EmulatedCluster, pool: str, name: str = "clef") -> dict[str, Any]:
    status = (await cluster.get(f"{DECISIONS.format(ns=NS)}/{name}")).get("status") or {}
    return next((p for p in status.get("pools") or [] if p["name"] == pool), {})


async def events(cluster: EmulatedCluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in await cluster.items(f"/api/v1/namespaces/{NS}/events") if e.get("reason") == reason]


async def test_taken_name_backs_off_instead_of_a_post_per_node_event(
    cluster: EmulatedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10 node events that each trigger a pass: one POST for the taken name (the backoff outlasts them), one
    Warning, the pool Conflict throughout; the holder's deletion then frees the name at once."""
    monkeypatch.setenv("CLEF_RETRY_BASE_SECONDS", "30")
    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    await cluster.create(
        ISVCS.format(ns=NS),
        {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": {"name": "clef-h100-pool", "namespace": NS},
            "spec": {},
        },
    )
    await cluster.create(DECISIONS.format(ns=NS), decision())
    async with running_operator():
        await eventually_async(lambda: _state_is(cluster, "h100-pool", "Conflict"))
        await eventually_async(lambda: events(cluster, "NameTaken"))
        await asyncio.sleep(1.5)  # both the pool's Warning and the Ready condition's change are posted
        warned = await events(cluster, "NameTaken")
        for index in range(10):  # each changes what the nodes say about pools: a pass per event
            await cluster.create(NODES, gpu_node(f"l4-{index}", "l4-pool", **L4))
            await eventually_async(lambda count=index + 1: _nodes_are(cluster, "l4-pool", count))
        posts = Counter(cluster.emulator.operator_writes("inferenceservices"))
        assert posts[("POST", "clef-h100-pool")] == 1
        assert (await pool_entry(cluster, "h100-pool"))["state"] == "Conflict"
        assert await events(cluster, "NameTaken") == warned  # said once, not once per pass
        assert any(
            e["type"] == "Warning" and e["message"].startswith("node pool h100-pool: an InferenceService")
            for e in warned
        )
        await cluster.delete(f"{ISVCS.format(ns=NS)}/clef-h100-pool")
        await eventually_async(lambda: _state_is(cluster, "h100-pool", "Serving"), timeout=10)
    assert len(await events(cluster, "NameTaken")) == len(warned)


async def _state_is(cluster: EmulatedCluster, pool: str, state: str) -> bool:
    return (await pool_entry(cluster, pool)).get("state") == state


async def _nodes_are(cluster: EmulatedCluster, pool: str, count: int) -> bool:
    return (await pool_entry(cluster, pool)).get("nodes") == count


def operator_lists(cluster: EmulatedCluster) -> int:
    """InferenceService lists the operator sent: one per reconciliation pass."""
    return sum(
        1
        for r in cluster.emulator.history
        if not r.headers.get("User-Agent", "").startswith("kmock/")
        and str(r.method.value) == "GET"
        and r.resource is not None
        and r.resource.plural == "inferenceservices"
        and r.name is None
        and r.params.get("watch") not in ("true", "1")
    )


async def test_status_updates_of_many_inferenceservices_are_coalesced(cluster: EmulatedCluster) -> None:
    """KServe marks 40 InferenceServices Ready one after another: a handful of passes, not 40."""
    pools = 40
    for index in range(pools):
        await cluster.create(NODES, gpu_node(f"h100-{index}", f"pool{index}", **H100))
    await cluster.create(DECISIONS.format(ns=NS), decision())
    async with running_operator():

        async def created() -> list[dict[str, Any]] | None:
            items = await cluster.items(ISVCS.format(ns=NS))
            return items if len(items) == pools else None

        items = await eventually_async(created, timeout=60)
        await asyncio.sleep(1.5)
        before = operator_lists(cluster)
        ready = {"conditions": [{"type": "Ready", "status": "True"}], "url": "http://x"}
        start = asyncio.get_running_loop().time()
        for item in items:
            await cluster.merge(f"{ISVCS.format(ns=NS)}/{item['metadata']['name']}/status", {"status": ready})
        spread = asyncio.get_running_loop().time() - start

        async def all_ready() -> bool:
            status = (await cluster.get(f"{DECISIONS.format(ns=NS)}/clef")).get("status") or {}
            return status.get("poolsReady") == f"{pools}/{pools}"

        await eventually_async(all_ready, timeout=30)
        await asyncio.sleep(1.5)
        passes = operator_lists(cluster) - before
    # At most one pass per coalescing window while the updates arrive (and one after), far fewer than updates.
    assert 1 <= passes <= min(pools // 2, spread / handlers.OWNED_EVENT_COALESCE_SECONDS + 3), (passes, spread)


async def test_an_included_pool_that_does_not_exist_is_named(cluster: EmulatedCluster) -> None:
    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    await cluster.create(DECISIONS.format(ns=NS), decision(nodePools={"include": ["no-such-pool"]}))

    async def ready() -> dict[str, Any] | None:
        status = (await cluster.get(f"{DECISIONS.format(ns=NS)}/clef")).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), None)

    async with running_operator():
        condition = await eventually_async(ready)
    assert condition["status"] == "False"
    assert condition["message"].endswith("spec.nodePools.include names pools that no GPU node carries: no-such-pool")
