"""The real cluster for the tests in this folder: one per session, with the chart installed and the operator
running as a local process with the chart's ServiceAccount token.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from clef_cluster.cluster import Cluster, down, up
from tests.cluster.helpers import apply_readme_decision
from tests.cluster.kube import CHART, RELEASE, SYSTEM_NS, Kube, Operator


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """etcd, the API server, controllers, scheduler, kwok's fake GPU pools and KServe's controller (the real node
    has its own cluster: test_real_node.py)."""
    folder = tmp_path_factory.mktemp("cluster")
    running = up(folder, with_node=False)
    try:
        yield running
    finally:
        down(folder)


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Kube:
    """kubectl/helm as the admin."""
    return Kube(cluster)


@pytest.fixture(scope="session")
def installed_chart(kube: Kube) -> dict[str, Any]:
    """``helm install`` of charts/clef-serving (default values) into clef-system, waited for; its manifest."""
    kube.helm(
        "install", RELEASE, str(CHART), f"--namespace={SYSTEM_NS}", "--create-namespace", "--wait", "--timeout=3m"
    )
    return {"release": RELEASE, "namespace": SYSTEM_NS}


@pytest.fixture(scope="session")
def operator(
    kube: Kube, installed_chart: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    """The operator, running for the session (tests may kill and restart it)."""
    running = Operator(kube, tmp_path_factory.mktemp("operator"))
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def readme_decision(kube: Kube, operator: Operator) -> dict[str, Any]:
    """The README's ClefDecision applied with kubectl into ml-serving, waited for until Ready."""
    return apply_readme_decision(kube)
