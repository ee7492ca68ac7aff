"""Pins what the test-side emulator (tests/operator/emulator.py) leans on in kmock's private modules, so that an
upgrade of kmock fails here, by name, before the emulator's tests misbehave."""

from __future__ import annotations

import importlib.metadata
import inspect

import attrs
import kmock
from kmock._internal import enums, references, rendering

from tests.operator.harness import NODES, EmulatedCluster

KMOCK_VERSION = "0.8"  # the dev extra pins it exactly (pyproject.toml)


def test_kmock_is_the_pinned_version() -> None:
    assert importlib.metadata.version("kmock") == KMOCK_VERSION


def test_the_private_names_the_emulator_reads_exist() -> None:
    assert {"CREATE", "UPDATE", "DELETE"} <= set(enums.action.__members__)  # the actions the emulator compares
    assert inspect.isclass(references.resource)
    assert inspect.isclass(rendering.Request)
    assert rendering.Payload is not None  # a type alias the emulator's signatures name


def test_the_emulator_methods_it_overrides_or_calls_exist() -> None:
    emulator = kmock.KubernetesEmulator
    for name in ("_handle", "_serve_list", "_serve_version", "_serve_watch"):
        assert callable(getattr(emulator, name, None)), name


def test_the_emulator_state_it_reads_is_declared() -> None:
    fields = {field.name for field in attrs.fields(kmock.KubernetesEmulator)}
    assert {"_requests", "_objects", "_lock", "_buses"} <= fields


async def test_kmock_dispatches_from_the_requests_in_flight_and_history_keeps_all(cluster: EmulatedCluster) -> None:
    """kmock finds each request's reaction by scanning the root's requests (its iteration: ``_requests``); the
    emulator leaves there only those in flight, so that scan stays short, and keeps every request in ``history``."""
    await cluster.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    for _ in range(3):
        await cluster.get(f"{NODES}/n1")
    emulator = cluster.emulator
    assert [str(r.method.value) for r in emulator.history] == ["POST", "GET", "GET", "GET"]
    assert emulator._requests == [] and list(emulator) == []
    assert emulator.served_requests()[-1] == ("GET", f"{NODES}/n1")


async def test_lists_apply_label_selectors_as_the_api_server_does(cluster: EmulatedCluster) -> None:
    """kmock lists every object whatever the selector; the operator deletes unowned objects it lists by its label, so
    the emulator filters as kube-apiserver does (equality terms; set-based terms fail the test instead)."""
    for name, labels in (("n1", {"pool": "a", "zone": "x"}), ("n2", {"pool": "b"}), ("n3", {})):
        await cluster.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})

    async def names(selector: str) -> list[str]:
        return sorted(item["metadata"]["name"] for item in await cluster.items(f"{NODES}?labelSelector={selector}"))

    assert await names("pool=a") == ["n1"]
    assert await names("pool==b") == ["n2"]
    assert await names("pool!=a") == ["n2", "n3"]
    assert await names("pool") == ["n1", "n2"]
    assert await names("!pool") == ["n3"]
    assert await names("pool=a,zone=x") == ["n1"]
    assert await names("pool=a,zone=y") == []
    assert await names("pool=c") == []
