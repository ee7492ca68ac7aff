"""At scale and at rest: 50 pools x 4 nodes x 3 ClefDecisions converge, then passes write nothing."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from clef_operator import work_queue
from tests.operator.harness import DECISIONS, ISVCS, NODES, EmulatedCluster, gpu_node, running_operator
from tests.polling import eventually_async

NS = "ml"
POOLS = 50
NODES_PER_POOL = 4
H100 = dict(product="NVIDIA-H100-80GB-HBM3", family="hopper", major=9, minor=0)
pytestmark = [pytest.mark.timeout(900), pytest.mark.looptime]


def decision(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "clef-serving.io/v1alpha1",
        "kind": "ClefDecision",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"model": {"storageUri": "hf://cloudflare/clef-flash-fp8"}},
    }


async def _all_serving(cluster: EmulatedCluster, names: list[str]) -> bool:
    for name in names:
        status = (await cluster.get(f"{DECISIONS.format(ns=NS)}/{name}")).get("status") or {}
        pools = status.get("pools") or []
        if len(pools) != POOLS or any(p.get("state") != "Serving" for p in pools):
            return False
    return True


async def _quiet(cluster: EmulatedCluster, seconds: float) -> bool:
    """Whether the operator wrote nothing for ``seconds``."""
    before = len(cluster.emulator.all_operator_writes())
    await asyncio.sleep(seconds)
    return len(cluster.emulator.all_operator_writes()) == before


async def test_steady_state_passes_write_nothing(cluster: EmulatedCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """After convergence, resync passes over every ClefDecision, node heartbeats and irrelevant relabels cause
    zero API writes (no status patch, no InferenceService write, no Event)."""
    monkeypatch.setattr(work_queue, "RESYNC_SECONDS", 2.0)
    for pool in range(POOLS):
        for node in range(NODES_PER_POOL):
            await cluster.create(NODES, gpu_node(f"n{pool}-{node}", f"pool{pool}", **H100))
    names = ["alpha", "beta", "gamma"]
    for name in names:
        await cluster.create(DECISIONS.format(ns=NS), decision(name))
    async with running_operator():
        await eventually_async(lambda: _all_serving(cluster, names), timeout=180, interval=1.0)
        assert len(await cluster.items(ISVCS.format(ns=NS))) == POOLS * len(names)
        await eventually_async(lambda: _quiet(cluster, 3.0), timeout=300)  # queued Events and patches have landed
        before = len(cluster.emulator.all_operator_writes())
        passes = len(cluster.emulator.served_requests())
        for node in range(0, POOLS * NODES_PER_POOL, 7):  # heartbeats and an unrelated label
            name = f"n{node // NODES_PER_POOL}-{node % NODES_PER_POOL}"
            await cluster.merge(
                f"{NODES}/{name}",
                {
                    "metadata": {"labels": {"heartbeat": str(node)}},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                },
            )
        await asyncio.sleep(6)  # several resyncs of every ClefDecision
        after = cluster.emulator.all_operator_writes()[before:]
        lists = [p for m, p in cluster.emulator.served_requests()[passes:] if m == "GET" and "inferenceservices" in p]
        posted = [
            (r.data or {}).get("reason")
            for r in cluster.emulator.history[passes:]
            if str(r.method.value) == "POST" and str(r.url.path).endswith("/events")
        ]
        print(f"steady state: {len(after)} writes over {len(lists)} InferenceService lists (passes): {Counter(posted)}")
    assert len(lists) >= 3 * len(names)  # passes did run
    assert Counter(after) == Counter()
