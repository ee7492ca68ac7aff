"""Fixtures for the operator's integration tests: the cluster emulator and a client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import kmock
import pytest
import pytest_asyncio

from tests.crd_schema import clef_crd
from tests.operator.emulator import ClusterEmulator
from tests.operator.harness import KSERVE_CRD, EmulatedCluster, write_kubeconfig


@pytest.fixture(scope="session")
def observed_rbac() -> dict[str, set[tuple[str, str, str]]]:
    """(apiGroup, resource, verb) triples the operator needed, per integration test that ran."""
    return {}


@pytest_asyncio.fixture
async def emulator(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    observed_rbac: dict[str, set[tuple[str, str, str]]],
) -> AsyncIterator[ClusterEmulator]:
    """A cluster emulator serving built-in kinds and the ClefDecision CRD, with $KUBECONFIG aimed at it."""
    async with ClusterEmulator() as emu, kmock.Server(emu):
        emu.resources.load_bundled()
        emu.add_crd(clef_crd())
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", str(emu.url).rstrip("/"))))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("CLEF_RETRY_BASE_SECONDS", "0.2")
        yield emu
        observed_rbac[request.node.name] = emu.rbac_requests()


@pytest.fixture
def cluster(emulator: ClusterEmulator) -> EmulatedCluster:
    """A test-side client of the emulator, with KServe installed."""
    emulator.add_crd(KSERVE_CRD)
    return EmulatedCluster(emulator)


@pytest.fixture
def bare_cluster(emulator: ClusterEmulator) -> EmulatedCluster:
    """A test-side client of the emulator, without KServe."""
    return EmulatedCluster(emulator)
