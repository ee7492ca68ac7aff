"""Watches that heal: ERROR events of any status, 410, EOF, API outages; liveness; SIGTERM.

The first tests pin the kopf internals that clef_operator.watch_healing replaces (so that a kopf upgrade that
changes them fails here, not in a cluster); the others run the real operator against the emulator.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kopf
import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import watching as kopf_watching
from kopf._cogs.structs import references
from kopf._core.engines import peering as kopf_peering
from kopf._core.reactor import orchestration
from kopf._core.reactor import queueing as kopf_queueing

from clef_operator import handlers, watch_healing, work_queue
from clef_tools.local_server import free_port
from tests.operator.harness import (
    DECISIONS,
    ISVCS,
    NODES,
    ROOT,
    EmulatedCluster,
    decision,
    gpu_node,
    running_operator,
)
from tests.polling import eventually_async

NS = "ml"
H100 = dict(product="NVIDIA-H100-80GB-HBM3", family="hopper", major=9, minor=0)
pytestmark = [pytest.mark.timeout(120), pytest.mark.looptime]


async def max_model_len(cluster: EmulatedCluster, isvc: str) -> str | None:
    items = {i["metadata"]["name"]: i for i in await cluster.items(ISVCS.format(ns=NS))}
    if isvc not in items:
        return None
    args = items[isvc]["spec"]["predictor"]["containers"][0]["args"]
    return next((a.split("=", 1)[1] for a in args if a.startswith("--max-model-len=")), None)


def test_kopf_internals_the_healing_replaces() -> None:
    """kopf's watch loop still calls continuous_watch/watch_objs by module name, with these keywords, and
    still raises WatchingError for a non-410 ERROR event (the behaviour being healed)."""
    assert watch_healing.installed()  # importing the handlers installs it
    loop_names = kopf_watching.infinite_watch.__code__.co_names
    assert "continuous_watch" in loop_names
    original = watch_healing._original_continuous_watch
    assert "watch_objs" in original.__code__.co_names
    assert set(inspect.signature(original).parameters) == {"settings", "resource", "namespace", "operator_pause_waiter"}
    assert {"settings", "resource", "namespace"} <= set(
        inspect.signature(watch_healing._original_watch_objs).parameters
    )
    assert "WatchingError" in inspect.getsource(original)
    assert issubclass(kopf_watching.WatchingError, watch_healing.HEALABLE)


async def _fake_cycle(items: list[Any], error: BaseException | None) -> AsyncIterator[Any]:
    for item in items:
        yield item
    if error is not None:
        raise error


async def test_failed_cycle_backs_off_and_replays_deletions(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = kopf.OperatorSettings()
    a, b = ({"metadata": {"uid": uid, "name": uid}} for uid in ("a", "b"))
    cycles = [
        (
            [{"type": None, "object": a}, {"type": None, "object": b}, kopf_watching.Bookmark.LISTED],
            kopf_watching.WatchingError("ERROR 500"),
        ),
        ([{"type": None, "object": b}, kopf_watching.Bookmark.LISTED], None),  # a went while down
    ]
    monkeypatch.setattr(watch_healing, "_original_continuous_watch", lambda **_: _fake_cycle(*cycles.pop(0)))
    loop = asyncio.get_running_loop()
    start = loop.time()
    first = [item async for item in watch_healing.continuous_watch(settings=settings, resource="r", namespace=None)]
    assert loop.time() - start == pytest.approx(watch_healing.backoff(0))  # slept once, then ended quietly
    assert first[-1] is kopf_watching.Bookmark.LISTED
    second = [item async for item in watch_healing.continuous_watch(settings=settings, resource="r", namespace=None)]
    assert second == [{"type": None, "object": b}, {"type": "DELETED", "object": a}, kopf_watching.Bookmark.LISTED]
    assert [watch_healing.backoff(n) for n in range(7)] == [0.5, 1, 2, 4, 8, 10, 10]


async def test_kopf_keepalive_dies_on_an_outage_and_the_healing_one_starts_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf's peering keep-alive lets an API failure escape once its request's retries are spent (the behaviour
    being healed: the task's end stops the operator), kopf's orchestrator spawns it by module name (so the
    installed wrapper runs), and the wrapper starts it again after a backoff."""
    settings = kopf.OperatorSettings()
    settings.peering.name = "clef-operator"
    settings.networking.error_backoffs = [0.1]
    peerings = references.Resource(group="kopf.dev", version="v1", plural="clusterkopfpeerings", namespaced=False)
    failing = {"left": 2}  # the keep-alive's touch, then its finally's touch (removing the peer's record)
    touches: list[Any] = []

    async def patch_obj(**kwargs: Any) -> tuple[dict[str, Any], None]:
        touches.append(kwargs["patch"])
        if failing["left"]:
            failing["left"] -= 1
            raise aiohttp.ClientConnectionError("connection refused")
        return {}, None

    monkeypatch.setattr(kopf_peering.patching, "patch_obj", patch_obj)
    with pytest.raises(aiohttp.ClientConnectionError):
        await watch_healing._original_keepalive(
            namespace=None, resource=peerings, identity=kopf_peering.Identity("me"), settings=settings
        )
    assert len(touches) == 2

    assert watch_healing.installed()
    monkeypatch.setattr(kopf_queueing, "watcher", lambda **_: asyncio.sleep(3600))  # no peering observer here
    paused = aiotoggles.ToggleSet(any)
    ensemble = orchestration.Ensemble(
        operator_indexed=aiotoggles.ToggleSet(all),
        operator_paused=paused,
        peering_missing=await paused.make_toggle(name="peering CRD is missing"),
    )
    failing["left"] = 2
    touches.clear()
    await orchestration.spawn_missing_peerings(
        ensemble=ensemble,
        settings=settings,
        identity=kopf_peering.Identity("me"),
        resources=[peerings],
        namespaces=[None],
    )
    (task,) = ensemble.pinging_tasks.values()
    try:
        await asyncio.sleep(watch_healing.backoff(0) + 1)
        assert not task.done()
        assert len(touches) == 3  # failed, its record's removal failed, then a new keep-alive's touch
    finally:
        for running in ensemble.get_tasks(ensemble.get_keys()):
            running.cancel()
        await asyncio.gather(*ensemble.get_tasks(ensemble.get_keys()), return_exceptions=True)


async def test_liveness_fails_on_a_stuck_stream_or_a_dead_scheduler() -> None:
    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings, memo=kopf.Memo())
    limit = handlers.liveness_limit(settings)
    assert 70 < limit < 600
    stream = watch_healing.streams(settings).setdefault(("nodes", None), watch_healing.StreamHealth())
    stream.progress = 1000.0
    assert watch_healing.stale_streams(settings, 1000.0 + limit - 1, limit) == []
    assert watch_healing.stale_streams(settings, 1000.0 + limit + 1, limit) == ["nodes"]
    stream.touch()
    memo = kopf.Memo()
    assert await handlers.liveness(settings=settings, memo=memo) == {"scheduler": "not started"}
    stream.progress -= limit + 1
    with pytest.raises(kopf.PermanentError, match="no progress on the watch streams of nodes"):
        await handlers.liveness(settings=settings, memo=memo)
    stream.touch()
    work_queue.operator_state(memo).task = asyncio.create_task(asyncio.sleep(0))
    await work_queue.operator_state(memo).task
    with pytest.raises(kopf.PermanentError, match="scheduler has stopped"):
        await handlers.liveness(settings=settings, memo=memo)


@pytest.mark.parametrize("code", [500, 410, 403])
async def test_watch_error_event_relists_and_keeps_applying_changes(cluster: EmulatedCluster, code: int) -> None:
    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    await cluster.create(DECISIONS.format(ns=NS), decision())
    async with running_operator() as task:
        await eventually_async(lambda: max_model_len(cluster, "clef-h100-pool"))
        for plural in ("clefdecisions", "nodes", "inferenceservices"):
            await cluster.emulator.watch_error(plural, code)
        await cluster.merge(f"{DECISIONS.format(ns=NS)}/clef", {"spec": {"predictor": {"maxModelLen": 4096}}})
        await eventually_async(lambda: _equals(max_model_len(cluster, "clef-h100-pool"), "4096"), timeout=10)
        await cluster.create(NODES, gpu_node("h100-b", "h100-b-pool", **H100))
        await eventually_async(lambda: max_model_len(cluster, "clef-h100-b-pool"), timeout=10)
        assert not task.done()


async def _equals(value: Any, expected: Any) -> bool:
    return (await value) == expected


async def test_outage_longer_than_kopfs_retries_is_ridden_out(cluster: EmulatedCluster) -> None:
    """The API answers 503 for longer than kopf's whole retry budget; changes made meanwhile (a spec edit,
    a node gone, a ClefDecision deleted) are applied within seconds of the API answering again."""
    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    await cluster.create(NODES, gpu_node("h100-b", "h100-b-pool", **H100))
    await cluster.create(DECISIONS.format(ns=NS), decision())
    await cluster.create(DECISIONS.format(ns=NS), decision("other"))
    async with running_operator() as task:
        await eventually_async(lambda: max_model_len(cluster, "other-h100-b-pool"))
        await cluster.emulator.start_outage()
        await cluster.merge(f"{DECISIONS.format(ns=NS)}/clef", {"spec": {"predictor": {"maxModelLen": 4096}}})
        await cluster.delete(f"{DECISIONS.format(ns=NS)}/other")
        await cluster.delete(f"{NODES}/h100-b")
        await asyncio.sleep(4)  # kopf's retry budget in these tests is 0.8 s
        assert not task.done()
        cluster.emulator.end_outage()
        await eventually_async(lambda: _equals(max_model_len(cluster, "clef-h100-pool"), "4096"), timeout=15)
        state = task.get_name()
        assert state and not task.done()
        # The deleted ClefDecision and node are forgotten: nothing recreates "other"'s InferenceServices.
        await asyncio.sleep(2)
        names = {i["metadata"]["name"] for i in await cluster.items(ISVCS.format(ns=NS))}
        assert not {n for n in names if n.startswith("other-")}


def _healthz(port: int) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never a proxy
    try:
        with opener.open(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.mark.looptime(False)  # a real operator process, on the wall clock
async def test_process_survives_a_watch_error_and_exits_on_sigterm(cluster: EmulatedCluster) -> None:
    """`python -m clef_operator`: an ERROR 500 on every stream, a later spec change applied, /healthz 200,
    then SIGTERM ends it promptly with rc 0."""
    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    await cluster.create(DECISIONS.format(ns=NS), decision())
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "operator")])}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "clef_operator",
            "--standalone",
            "--all-namespaces",
            f"--liveness-port={port}",
            "--liveness-host=127.0.0.1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await eventually_async(lambda: max_model_len(cluster, "clef-h100-pool"), timeout=30)
        for plural in ("clefdecisions", "nodes", "inferenceservices"):
            await cluster.emulator.watch_error(plural, 500)
        await asyncio.sleep(7)  # the watcher failed after ~6 s before the fix
        assert process.poll() is None
        await cluster.merge(f"{DECISIONS.format(ns=NS)}/clef", {"spec": {"predictor": {"maxModelLen": 4096}}})
        await eventually_async(lambda: _equals(max_model_len(cluster, "clef-h100-pool"), "4096"), timeout=15)
        assert await asyncio.to_thread(_healthz, port) == 200
        start = asyncio.get_running_loop().time()
        process.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(process.wait, 15)
        assert rc == 0
        assert asyncio.get_running_loop().time() - start < 5
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
