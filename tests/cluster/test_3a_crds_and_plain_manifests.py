"""CRDs on a real API server of its own (a control plane only: nothing is scheduled): the cluster tooling's wait for
CRDs just created, and docs/install.md's "Plain manifests" commands run as written (every object of manifests/ ends
up stored, its CRDs Established; the operator's pod stays Pending)."""

from __future__ import annotations

import copy
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clef_cluster import kserve
from clef_cluster.cluster import ClusterError, wait_established
from tests.cluster.kube import REPO, Kube, cluster_for
from tests.deploy.chart import load_yaml_objects
from tests.polling import eventually

pytestmark = pytest.mark.cluster

GUIDE = REPO / "docs" / "install.md"
MANIFESTS = REPO / "manifests"


def plain_manifests_commands() -> str:
    """The first bash block of the guide's "Plain manifests" section."""
    section = GUIDE.read_text().split("## Plain manifests", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "docs/install.md's 'Plain manifests' section has no bash block"
    return block.group(1)


@pytest.fixture(scope="module")
def bare_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """A control plane of its own: no KServe, no nodes."""
    with cluster_for(tmp_path_factory, "plain-manifests", with_kserve=False, with_nodes=False, with_node=False) as c:
        yield Kube(c)


def test_the_guides_plain_manifest_commands_store_every_object(bare_control_plane: Kube, tmp_path: Path) -> None:
    cluster = bare_control_plane.cluster
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", plain_manifests_commands()],
        cwd=REPO,
        env={
            **os.environ,
            "PATH": f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "KUBECONFIG": str(cluster.kubeconfig),
            "KUBECACHEDIR": str(tmp_path / "kube-cache"),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for obj in load_yaml_objects(path):
            meta = obj["metadata"]
            group = obj["apiVersion"].rpartition("/")[0]
            kind = f"{obj['kind']}.{group}" if group else obj["kind"]
            stored = bare_control_plane.get(kind, meta["name"], meta.get("namespace"))
            assert stored is not None, f"{path.name}: {obj['kind']} {meta['name']} was not stored"
            if obj["kind"] == "CustomResourceDefinition":
                conditions = {c["type"]: c["status"] for c in stored["status"]["conditions"]}
                assert conditions.get("Established") == "True", (meta["name"], conditions)


def crd_in_group(group: str) -> dict[str, Any]:
    """KServe's InferenceService CRD (a large one) moved to ``group``, without the names that would clash."""
    crd = copy.deepcopy(next(c for c in kserve.crds() if c["spec"]["names"]["kind"] == "InferenceService"))
    crd["spec"]["group"] = group
    crd["metadata"]["name"] = f"{crd['spec']['names']['plural']}.{group}"
    for shared in ("shortNames", "categories"):
        crd["spec"]["names"].pop(shared, None)
    return crd


def test_a_crd_is_waited_for_from_its_first_moment(bare_control_plane: Kube) -> None:
    """Right after it is created a CRD has no conditions; `kubectl wait --for=condition=Established` fails at once on
    it (".status.conditions accessor error"), which once failed a whole cluster's start."""
    cluster = bare_control_plane.cluster
    for attempt in range(2):
        crd = crd_in_group(f"fresh{attempt}.example.com")
        cluster.apply([crd])
        wait_established(cluster, [crd])
        assert bare_control_plane.get("crd", crd["metadata"]["name"]) is not None


def test_a_crd_that_cannot_be_established_is_named_with_its_conditions(
    bare_control_plane: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = bare_control_plane.cluster
    first = crd_in_group("clash.example.com")
    clashing = copy.deepcopy(first)
    clashing["metadata"]["name"] = f"others.{first['spec']['group']}"
    clashing["spec"]["names"].update(plural="others", singular="other", shortNames=["isvc-clash"])
    first["spec"]["names"]["shortNames"] = ["isvc-clash"]
    cluster.apply([first])
    wait_established(cluster, [first])
    cluster.apply([clashing])
    # The API server's naming controller writes the clash (NamesAccepted=False) a moment after the CRD is stored,
    # later on a loaded machine: once it is written, a short wait must name it.
    name = clashing["metadata"]["name"]
    eventually(
        lambda: ((bare_control_plane.get("crd", name) or {}).get("status") or {}).get("conditions"),
        f"the API server to write {name}'s conditions",
        timeout=60,
    )
    monkeypatch.setattr("clef_cluster.cluster.ESTABLISHED_TIMEOUT_S", 5.0)
    with pytest.raises(ClusterError) as raised:
        wait_established(cluster, [first, clashing])
    message = str(raised.value)
    assert "others.clash.example.com" in message and "is already in use" in message, message
    assert f'{first["metadata"]["name"]}"' not in message, message
