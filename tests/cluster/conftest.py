"""The real cluster for the tests in this folder: one per session, with the chart installed and the operator
running as a local process with the chart's ServiceAccount token.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from clef_cluster.cluster import Cluster
from tests.cluster.helpers import apply_readme_decision
from tests.cluster.kube import Kube, Operator, cluster_for, install_chart, operator_for


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """etcd, the API server, controllers, scheduler, kwok's fake GPU pools and KServe's controller (the real node
    has its own cluster: test_real_node.py)."""
    with cluster_for(tmp_path_factory, "cluster", with_node=False) as running:
        yield running


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Kube:
    """kubectl/helm as the admin."""
    return Kube(cluster)


@pytest.fixture(scope="session")
def installed_chart(kube: Kube) -> dict[str, Any]:
    """``helm install`` of charts/clef-serving (default values) into clef-system, waited for; its manifest."""
    return install_chart(kube)


@pytest.fixture(scope="session")
def operator(
    kube: Kube, installed_chart: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    """The operator, running for the session (tests may kill and restart it)."""
    with operator_for(kube, tmp_path_factory.mktemp("operator")) as running:
        yield running


@pytest.fixture(scope="session")
def readme_decision(kube: Kube, operator: Operator) -> dict[str, Any]:
    """The README's ClefDecision applied with kubectl into ml-serving, waited for until Ready."""
    return apply_readme_decision(kube)
