"""Which tests share a pytest-xdist worker when the suite runs on several (``-n 3 --dist loadscope
--no-loadscope-reorder``, as scripts/test.sh runs it).

Each test module runs whole on one worker, in order, so its module-scoped servers and engines start once (xdist's
loadscope); modules that share an expensive session fixture, or read what other modules' tests recorded, run
together on one worker. Waiting tests (the real cluster, servers starting) then overlap
with busy ones. tests/conftest.py installs the hook for the whole suite.

The one place that leans on xdist's internals: loadscope's scheduler names each test's unit of work with its
``_split_scope`` method, which this module's scheduler overrides (as xdist's own loadfile scheduler does).
xdist_group marks with ``--dist loadgroup`` would say the same through a public mark, but they stopped grouping
with pytest 9.2 (pytest-dev/pytest-xdist#1386). tests/test_worker_groups.py pins the behaviour.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

#: Test files (or folders, ending in "/") that must share a worker, by group name, relative to the repository root.
SHARED_GROUPS: dict[str, tuple[str, ...]] = {
    # The real node's own clusters (kubelet, containerd, kube-proxy; the end to end one with KServe and the chart),
    # one after the other: listed before "cluster", whose folder holds them.
    "real-node": ("tests/cluster/test_real_node.py", "tests/cluster/test_real_node_e2e.py"),
    # The autoscaling tests' own cluster (the real node and the metrics pipeline): a worker of its own, beside the
    # real-node group, listed before "cluster" too.
    "autoscaling": ("tests/cluster/test_real_node_autoscaling.py",),
    # One real cluster per session; its files run in name order (test_3_helm.py last).
    "cluster": ("tests/cluster/",),
    # test_documented_rbac_matches_requests reads the RBAC requests the scenarios of both files made in this session.
    "operator-scenarios": ("tests/operator/test_cluster_life.py", "tests/operator/test_operator_integration.py"),
    # The container images: built once (cached by their inputs) and run under one containerd of the group's own.
    "images": ("tests/images/",),
    # The session's CPU vLLM predictor (tests/predictor/conftest.py's vllm_server).
    "vllm-server": ("tests/predictor/test_server_vllm.py", "tests/predictor/test_systemone_cli.py"),
}


#: Units that start first, each on a worker of its own, so that none ends the run alone
#: (``--no-loadscope-reorder``: the rest follow in collection order): the real cluster (mostly waiting), the
#: container images (a cold build is minutes of downloads and disk writes) and the GPU benchmark's CPU smoke run
#: (the longest busy unit); the real node's modules follow them.
FIRST = ("cluster", "images", "tests/bench/test_gpu_benchmark_smoke.py", "real-node", "autoscaling")


def group_of(path: str) -> str:
    """The worker group of the test file at ``path`` (relative, "/"-separated): its shared group, else itself."""
    for name, members in SHARED_GROUPS.items():
        if any(path == member or (member.endswith("/") and path.startswith(member)) for member in members):
            return name
    return path


class SharedFixtureScheduling(LoadScopeScheduling):
    """loadscope with a module as the unit of work, and the modules of a shared group as one unit."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid.split("::", 1)[0])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker (each collects the same list, in the same order), :data:`FIRST`'s units come first."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {group: index for index, group in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.path.relative_to(config.rootpath).as_posix()), len(FIRST)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """``--dist loadscope`` schedules by :func:`group_of`; other modes are xdist's own."""
    if config.getvalue("dist") != "loadscope":
        return None
    return SharedFixtureScheduling(config, log)
