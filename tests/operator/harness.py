"""Run the real operator (kopf, over HTTP) against the test-side cluster emulator, and drive the cluster."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import kopf
import yaml

from tests.crd_schema import KEDA_CRD, load_crd
from tests.operator.emulator import ClusterEmulator

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_DOC = ROOT / "docs" / "operator.md"
DECISIONS = "/apis/clef-serving.io/v1alpha1/namespaces/{ns}/clefdecisions"
ISVCS = "/apis/serving.kserve.io/v1beta1/namespaces/{ns}/inferenceservices"
NODES = "/api/v1/nodes"

# Discovery-only copy of KServe's InferenceService CRD: what the API server would register.
KSERVE_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "inferenceservices.serving.kserve.io"},
    "spec": {
        "group": "serving.kserve.io",
        "scope": "Namespaced",
        "names": {
            "kind": "InferenceService",
            "plural": "inferenceservices",
            "singular": "inferenceservice",
            "shortNames": ["isvc"],
            "listKind": "InferenceServiceList",
        },
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}


def decision(name: str = "clef", namespace: str = "ml", **spec: Any) -> dict[str, Any]:
    """A ClefDecision serving the FP8 release on every eligible pool, with ``spec``'s fields on top."""
    return {
        "apiVersion": "clef-serving.io/v1alpha1",
        "kind": "ClefDecision",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": {"storageUri": "hf://cloudflare/clef-flash-fp8"}, **spec},
    }


def documented_rbac(path: Path = OPERATOR_DOC) -> set[tuple[str, str, str]]:
    """The (apiGroup, resource, verb) triples listed in the API-access table of docs/operator.md.

    Rows look like: | `clef-serving.io` | `clefdecisions` | `list`, `watch`, `patch` | why |
    (the core group is written as `""`).
    """
    triples: set[tuple[str, str, str]] = set()
    in_table = False
    for line in path.read_text().splitlines():
        if line.startswith("<!-- rbac-table -->"):
            in_table = True
            continue
        if line.startswith("<!-- /rbac-table -->"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not in_table or len(cells) < 3 or not cells[0].startswith("`"):
            continue
        group = cells[0].strip("`").strip('"')
        resource = cells[1].strip("`")
        for verb in cells[2].split(","):
            triples.add((group, resource, verb.strip().strip("`")))
    return triples


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig pointing at the emulator."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulator", "cluster": {"server": server}}],
                "users": [{"name": "tester", "user": {"token": "test-token"}}],
                "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}],
                "current-context": "emulator",
            }
        )
    )
    return path


def fast_settings() -> kopf.OperatorSettings:
    """kopf settings with short backoffs so that tests run in seconds."""
    settings = kopf.OperatorSettings()
    settings.watching.reconnect_backoff = 0.05
    settings.networking.error_backoffs = [0.1, 0.2, 0.5]
    settings.execution.default_backoff = 0.5
    settings.queueing.exit_timeout = 0.5
    settings.queueing.idle_timeout = 0.5
    settings.persistence.consistency_timeout = 1.0
    return settings


def gpu_node(
    name: str,
    pool: str,
    *,
    product: str | None,
    major: int | None,
    minor: int | None,
    gpus: int = 8,
    pool_key: str = "cloud.google.com/gke-nodepool",
    family: str | None = None,
) -> dict[str, Any]:
    """A Node as GPU Feature Discovery and the device plugin label it."""
    labels = {pool_key: pool, "nvidia.com/gpu.present": "true"}
    if product is not None:
        labels["nvidia.com/gpu.product"] = product
    if family is not None:
        labels["nvidia.com/gpu.family"] = family
    if major is not None and minor is not None:
        labels["nvidia.com/gpu.compute.major"] = str(major)
        labels["nvidia.com/gpu.compute.minor"] = str(minor)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"capacity": {"nvidia.com/gpu": str(gpus), "cpu": "96"}},
    }


class EmulatedCluster:
    """Test-side client of the emulator (requests carry kmock's own User-Agent)."""

    def __init__(self, emulator: ClusterEmulator) -> None:
        self.emulator = emulator

    async def request(self, method: str, path: str, body: Any = None, content_type: str | None = None) -> Any:
        """Send one API request and return the decoded JSON; fail on HTTP errors."""
        headers = {"Content-Type": content_type} if content_type else {}
        async with self.emulator.request(method, path, json=body, headers=headers) as response:
            payload = await response.json(content_type=None)
            assert response.status < 400, (method, path, response.status, payload)
            return payload

    async def create(self, path: str, body: Mapping[str, Any]) -> Any:
        """POST an object."""
        return await self.request("POST", path, body)

    async def merge(self, path: str, patch: Mapping[str, Any]) -> Any:
        """Merge-patch an object."""
        return await self.request("PATCH", path, patch, "application/merge-patch+json")

    async def delete(self, path: str) -> Any:
        """DELETE an object."""
        return await self.request("DELETE", path)

    async def get(self, path: str) -> Any:
        """GET an object or a list."""
        return await self.request("GET", path)

    async def items(self, path: str) -> list[dict[str, Any]]:
        """The items of a list."""
        return list((await self.get(path)).get("items", []))

    async def install_kserve(self) -> None:
        """Register the InferenceService resource and announce its CRD (as installing KServe does)."""
        self.emulator.add_crd(KSERVE_CRD)
        await self.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", KSERVE_CRD)

    async def install_keda(self) -> None:
        """Register KEDA's ScaledObject resource and announce its CRD (as installing KEDA does)."""
        crd = load_crd(KEDA_CRD)
        self.emulator.add_crd(crd)
        await self.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)


@contextlib.asynccontextmanager
async def running_operator(**kwargs: Any) -> AsyncIterator[asyncio.Task[None]]:
    """Run the real operator in this event loop until the block exits."""
    import clef_operator.handlers  # noqa: F401  (registers the handlers in kopf's default registry)

    stop = asyncio.Event()
    ready = asyncio.Event()
    logging.getLogger("kopf").setLevel(logging.INFO)
    task = asyncio.create_task(
        kopf.operator(
            clusterwide=kwargs.pop("clusterwide", True),
            standalone=True,
            settings=kwargs.pop("settings", None) or fast_settings(),
            memo=kwargs.pop("memo", None) or kopf.Memo(),
            stop_flag=stop,
            ready_flag=ready,
            **kwargs,
        )
    )
    await asyncio.wait_for(ready.wait(), timeout=30)
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)
