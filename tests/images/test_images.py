"""The operator and CPU predictor images (clef_cluster.images), built here and run under containerd and runc the way
the chart runs them: as uid/gid 10001, on a read-only root filesystem, writable only where the pod mounts volumes.

Needs root and Debian's mmdebstrap, containerd and runc (scripts/install_container_tools.sh installs them). The images
are built once per input hash and cached, so only a cold cache pays the build.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from clef_cluster import images, oci
from clef_contract.container import COMMAND
from clef_contract.predictor import MODEL_DIR, PREDICTOR_GID, PREDICTOR_HOME, PREDICTOR_UID
from clef_tools.local_server import free_port, http_ok
from predictor.demo import demo_release
from tests.images.containerd import Containerd
from tests.predictor.conftest import start_predictor, stop, without_timing

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 600
PROBE = (
    "import importlib.util, json, os\n"
    "try:\n    open('/probe', 'w')\n    wrote = True\nexcept OSError:\n    wrote = False\n"
    "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'wrote_root': wrote,"
    " 'torch': importlib.util.find_spec('torch') is not None, 'vllm': importlib.util.find_spec('vllm') is not None}))"
)


@pytest.fixture(scope="module")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    daemon = Containerd(tmp_path_factory.mktemp("containerd"))
    yield daemon
    daemon.stop()


def archive_config(image: images.BuiltImage) -> dict[str, Any]:
    """The image configuration inside an OCI archive (index -> manifest -> config)."""
    with tarfile.open(image.archive) as archive:

        def blob(digest: str) -> Any:
            member = archive.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert member is not None
            return json.loads(member.read())

        index = json.loads(archive.extractfile("index.json").read())  # type: ignore[union-attr]
        (entry,) = index["manifests"]
        assert entry["annotations"]["io.containerd.image.name"] == image.reference
        return blob(blob(entry["digest"])["config"]["digest"])  # type: ignore[no-any-return]


def imported(containerd: Containerd, name: str) -> images.BuiltImage:
    image = images.build(name)
    containerd.ctr("images", "import", str(image.archive))
    assert image.reference in containerd.images()
    return image


def run_once(containerd: Containerd, image: images.BuiltImage, name: str, args: list[str]) -> str:
    """``ctr run`` to completion as the image's user with a read-only root and a /tmp volume; its stdout."""
    done = containerd.ctr(
        "run", "--rm", "--read-only", "--net-host",
        "--mount", "type=tmpfs,src=tmpfs,dst=/tmp,options=rw:nosuid:nodev:mode=1777",
        image.reference, name, *args,
        timeout=300,
    )  # fmt: skip
    return done.stdout


def test_operator_image_runs_as_the_charts_user_on_a_read_only_root(containerd: Containerd) -> None:
    image = imported(containerd, "clef-operator")
    config = archive_config(image)["config"]
    assert config["User"] == "10001:10001"  # the chart's runAsUser/runAsGroup
    assert config["Entrypoint"] == ["python", "-m", "clef_operator"]
    help_text = run_once(containerd, image, "operator-help", [*config["Entrypoint"], "--help"])
    assert "--all-namespaces" in help_text and "--liveness-port" in help_text
    probe = json.loads(run_once(containerd, image, "operator-probe", ["python", "-c", PROBE]))
    assert probe == {"uid": 10001, "gid": 10001, "wrote_root": False, "torch": False, "vllm": False}


def test_the_operator_image_names_nothing_of_the_machine_that_built_it() -> None:
    """No file of the layer holds this checkout's path, this Python's or the image cache's; the console scripts
    are in /usr/local/bin and start the image's Python."""
    image = images.build("clef-operator")
    host_paths = {str(REPO), sys.prefix, sys.base_prefix, str(images.images_dir())}
    found: list[tuple[str, str]] = []
    shebangs: dict[str, bytes] = {}
    with tarfile.open(image.archive) as archive:
        (layer_member,) = [member for member in archive.getmembers() if member.size > 1_000_000]
        with tarfile.open(fileobj=archive.extractfile(layer_member)) as layer:
            for member in layer:
                if not member.isfile():
                    continue
                data = layer.extractfile(member).read()  # type: ignore[union-attr]
                found += [(member.name, path) for path in host_paths if path.encode() in data]
                if member.name.startswith(f".{images.SCRIPTS_DIR}/"):
                    shebangs[member.name.rpartition("/")[2]] = data.partition(b"\n")[0]
    assert found == []
    assert {"clef-operator", "kopf"} <= shebangs.keys()
    assert set(shebangs.values()) == {f"#!{images.IMAGE_PYTHON}".encode()}


def test_predictor_image_answers_system_one_as_the_local_predictor(containerd: Containerd, tmp_path: Path) -> None:
    """The CPU predictor image, with the demo release mounted where KServe puts a model, starts with the engine
    `--engine auto` picks on a CPU node and answers the demo's System One request (scripts/demo_request.json) as
    the local predictor does."""
    image = imported(containerd, "clef-predictor-cpu")
    config = archive_config(image)["config"]
    assert config["User"] == f"{PREDICTOR_UID}:{PREDICTOR_GID}"
    assert config["Entrypoint"] == list(COMMAND)
    probe = json.loads(run_once(containerd, image, "predictor-probe", ["python", "-c", PROBE]))
    assert probe == {"uid": 10001, "gid": 10001, "wrote_root": False, "torch": True, "vllm": False}

    release = tmp_path / "release"
    shutil.copytree(demo_release(tmp_path / "demo-cache"), release)
    for path in (release, *release.rglob("*")):  # what a storage initializer leaves: readable by the pod's user
        path.chmod(0o755 if path.is_dir() else 0o644)
    body = json.loads((REPO / "scripts" / "demo_request.json").read_text())
    port = free_port()
    args = [f"--model-dir={MODEL_DIR}", "--model-name=clef-flash", "--engine=auto", f"--http_port={port}"]
    log = tmp_path / "container.log"
    containerd.ctr(
        "run", "--detach", "--read-only", "--net-host", f"--log-uri=file://{log}",
        "--mount", f"type=bind,src={release},dst={MODEL_DIR},options=rbind:ro",
        "--mount", "type=tmpfs,src=tmpfs,dst=/tmp,options=rw:nosuid:nodev:mode=1777",
        "--mount", f"type=tmpfs,src=tmpfs,dst={PREDICTOR_HOME},options=rw:nosuid:nodev:uid=10001:gid=10001:mode=0700",
        image.reference, "predictor", *config["Entrypoint"], *args, "--host=127.0.0.1",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not http_ok(f"http://127.0.0.1:{port}/v1/models/clef-flash"):
            status = containerd.ctr("task", "list").stdout
            if "predictor" not in status or "STOPPED" in status or time.monotonic() > deadline:
                pytest.fail(f"the predictor container was not ready:\n{status}\n{log.read_text()[-5000:]}")
            time.sleep(1)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            in_image = client.post("/v1/systemone", json=body)
        assert in_image.status_code == 200, in_image.text
    finally:
        containerd.remove_container("predictor")
    assert "transformers" in log.read_text(), log.read_text()[-3000:]

    local = start_predictor(tmp_path, f"--model-dir={release}", "--engine=auto")
    try:
        with httpx.Client(base_url=local.url, timeout=120) as client:
            local_answer = client.post("/v1/systemone", json=body)
    finally:
        stop(local, timeout=120)
    assert local_answer.status_code == 200, local_answer.text
    assert without_timing(in_image.json()) == without_timing(local_answer.json())


def test_a_second_build_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing changed, build() returns the cached archive and builds nothing."""
    before = {name: images.build(name) for name in images.IMAGES}
    stamps = {name: image.archive.stat().st_mtime_ns for name, image in before.items()}

    def must_not_build(*args: object) -> None:
        raise AssertionError("built again with no input changed")

    monkeypatch.setattr(images, "_build_archive", must_not_build)
    assert images.build_all(log=False) == before
    assert {name: image.archive.stat().st_mtime_ns for name, image in before.items()} == stamps


def test_the_operator_image_builds_bit_for_bit_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reproducible: a second cold build of the same inputs (another cache, another working directory, no
    virtual environment named) gives the same archive, byte for byte."""
    cached = images.build("clef-operator")
    monkeypatch.setenv("CLEF_CLUSTER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.chdir(tmp_path)
    again = images.build("clef-operator", log=False)
    assert again.archive != cached.archive and again.reference == cached.reference
    assert oci.file_sha256(again.archive) == oci.file_sha256(cached.archive)


def test_root_and_the_image_tools_are_here() -> None:
    """The image tests run as root with Debian's tools (no skip: a machine without them fails here, by name)."""
    assert os.geteuid() == 0, "the image tests need root (mmdebstrap --mode=root, containerd)"
    missing = [tool for tool in ("mmdebstrap", "containerd", "ctr", "runc") if shutil.which(tool) is None]
    assert not missing, f"missing {missing}: bash scripts/install_container_tools.sh installs them"
