"""clef_operator.work_queue.run_pass: a pass reads the GPU nodes when it holds its ClefDecision's lock, not when it
was asked for. Two nodes deleted at once run two node handlers; the pass of the first deletion, waiting for the lock
while the second one's pass wrote the pool Degraded, must not then write a status from a node already gone."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

import kopf

from clef_operator import work_queue
from clef_operator.pools import GpuNode
from clef_operator.reconcile import Outcome
from clef_operator.work_queue import OperatorState, run_pass


class StatusWrites:
    """The one API call a pass makes here: its status write, recorded."""

    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []

    async def patch_decision_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.written.append(dict(status))


async def test_a_pass_that_waited_for_the_lock_reads_the_nodes_as_they_are_when_it_runs(
    monkeypatch: Any,
) -> None:
    passed_nodes: list[list[str]] = []

    async def reconcile(body: Mapping[str, Any], *, nodes: list[GpuNode], **_: Any) -> Outcome:
        passed_nodes.append(sorted(node.name for node in nodes))
        return Outcome(status={"nodes": len(nodes)})

    monkeypatch.setattr(work_queue, "reconcile", reconcile)
    api = StatusWrites()
    memo = kopf.Memo()
    memo.clef = state = OperatorState(api=cast(Any, api))
    index = {"pool": [GpuNode("a", {}, 8), GpuNode("b", {}, 8)]}  # kopf's index is live: changed in place
    body = {"metadata": {"namespace": "ns", "name": "decision", "uid": "uid-1"}}
    lock = state.locks.setdefault(("ns", "decision"), asyncio.Lock())
    async with lock:  # another pass of this ClefDecision is running
        waiting = asyncio.create_task(run_pass(body, memo, cast(Any, index)))
        await asyncio.sleep(0.05)
        assert not waiting.done(), "the pass ran without the ClefDecision's lock"
        index["pool"] = []  # both nodes deleted meanwhile
    outcome = await waiting
    assert passed_nodes == [[]], "the pass reconciled the nodes as they were when it was asked for"
    assert outcome is not None and api.written == [{"nodes": 0}]
