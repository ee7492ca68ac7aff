"""`kubectl apply -f manifests/` against a Kubernetes API emulator: it creates exactly the manifests' objects.

The emulator (tests/operator/emulator.py) stores objects as sent and knows the CRDs' kinds up front (as an
API server would once the CRDs are established); it validates nothing, hence `--validate=false`: the
schemas are checked in test_validation.py.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
import pytest_asyncio

from tests.deploy.chart import REPO, load_yaml_objects
from tests.operator.emulator import ClusterEmulator
from tests.operator.harness import write_kubeconfig

KUBECTL = REPO / ".venv" / "bin" / "kubectl"
MANIFESTS = REPO / "manifests"
SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "generation")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("namespace_paths")]


@pytest_asyncio.fixture
async def kubeconfig(tmp_path: pathlib.Path) -> AsyncIterator[pathlib.Path]:
    """A kubeconfig aimed at an emulator that serves the built-in kinds and the manifests' CRDs."""
    async with ClusterEmulator() as emulator, kmock.Server(emulator):
        emulator.resources.load_bundled()
        for crd in load_yaml_objects(MANIFESTS / "01-crds.yaml"):
            emulator.add_crd(crd)
        yield write_kubeconfig(tmp_path / "kubeconfig", str(emulator.url).rstrip("/"))


async def kubectl(kubeconfig: pathlib.Path, *args: str) -> str:
    """Run kubectl (in a subprocess, so that the emulator keeps serving) and return its stdout."""
    if not KUBECTL.is_file():
        pytest.fail(f"kubectl not found at {KUBECTL}: run `bash scripts/install_k8s_tools.sh` (bootstrap does)")
    process = await asyncio.create_subprocess_exec(
        str(KUBECTL),
        "--kubeconfig",
        str(kubeconfig),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, f"kubectl {' '.join(args)}:\n{err.decode()}"
    return out.decode()


def as_applied(obj: dict[str, Any]) -> dict[str, Any]:
    """An object read back from the server, without what the server and kubectl added."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in SERVER_SET}
    annotations = {k: v for k, v in meta.pop("annotations", {}).items() if k != LAST_APPLIED}
    return {**obj, "metadata": {**meta, **({"annotations": annotations} if annotations else {})}}


async def test_kubectl_apply_creates_exactly_the_manifests(kubeconfig: pathlib.Path) -> None:
    wanted = [obj for path in sorted(MANIFESTS.glob("*.yaml")) for obj in load_yaml_objects(path)]
    applied = await kubectl(kubeconfig, "apply", "--validate=false", "-f", str(MANIFESTS))
    assert applied.count(" created\n") == len(wanted), applied

    stored = json.loads(await kubectl(kubeconfig, "get", "-f", str(MANIFESTS), "-o", "json"))["items"]
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    assert sorted(map(as_applied, stored), key=key) == sorted(wanted, key=key)

    again = await kubectl(kubeconfig, "apply", "--validate=false", "-f", str(MANIFESTS))
    assert again.count(" unchanged\n") == len(wanted), again
