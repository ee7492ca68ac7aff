"""The real cluster for the tests in this folder: one per session, with the chart installed and the operator
running as a local process with the chart's ServiceAccount token.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from clef_cluster.cluster import Cluster, down, up
from tests.cluster.helpers import is_ready, namespace
from tests.cluster.kube import CHART, EXAMPLE, README_NS, RELEASE, SYSTEM_NS, Kube, Operator, eventually


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """etcd, the API server, controllers, scheduler, kwok's fake GPU pools and KServe's controller."""
    folder = tmp_path_factory.mktemp("cluster")
    running = up(folder)
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
    namespace(kube, README_NS)
    kube.run("apply", f"--namespace={README_NS}", "-f", str(EXAMPLE))
    return eventually(
        lambda: (d := kube.get("clefdecision", "clef-flash", README_NS)) and is_ready(d) and d,
        "the README's ClefDecision to be Ready",
        timeout=180,
    )
