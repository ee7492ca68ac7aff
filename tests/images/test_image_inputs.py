"""What decides an image (clef_cluster.images): the Dockerfile's settings and sources, the pins; the cache key."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest

from clef_cluster import images
from clef_contract.container import COMMAND
from clef_contract.predictor import PREDICTOR_GID, PREDICTOR_HOME, PREDICTOR_PORT, PREDICTOR_UID

REPO = Path(__file__).resolve().parents[2]


def test_runtime_settings_come_from_the_dockerfiles() -> None:
    predictor = images.dockerfile_runtime(REPO / "docker" / "predictor.Dockerfile")
    assert predictor.user == f"{PREDICTOR_UID}:{PREDICTOR_GID}" and predictor.home == PREDICTOR_HOME
    assert predictor.entrypoint == COMMAND and predictor.exposed == (str(PREDICTOR_PORT),)
    assert ("pyproject.toml", "/tmp/clef-serving/") in predictor.copies
    operator = images.dockerfile_runtime(REPO / "docker" / "operator.Dockerfile")
    assert operator.user == "10001:10001" and operator.home is None  # the chart's runAsUser and runAsGroup
    assert operator.entrypoint == ("python", "-m", "clef_operator")
    assert operator.cmd == ("--all-namespaces", "--liveness-port", "8080")


def test_sources_are_what_the_dockerfile_copies_less_build_leftovers(tmp_path: Path) -> None:
    runtime = images.dockerfile_runtime(REPO / "docker" / "operator.Dockerfile")
    destinations = [destination for _, destination in images.source_files(runtime)]
    assert "/tmp/clef-serving-operator/pyproject.toml" in destinations
    assert "/tmp/clef-serving-operator/clef_operator/__main__.py" in destinations
    assert not [path for path in destinations if "__pycache__" in path or ".egg-info" in path]


def test_the_image_config_is_the_dockerfiles() -> None:
    runtime = images.dockerfile_runtime(REPO / "docker" / "operator.Dockerfile")
    config = images.image_config(runtime)
    assert config["config"]["Entrypoint"] == ["python", "-m", "clef_operator"]
    assert config["config"]["Cmd"] == ["--all-namespaces", "--liveness-port", "8080"]
    assert config["config"]["User"] == "10001:10001" and config["config"]["WorkingDir"] == "/tmp"
    assert "PYTHONUNBUFFERED=1" in config["config"]["Env"]
    assert config["created"] == "2026-01-01T00:00:00Z"


@pytest.fixture
def repo_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The operator image's inputs copied aside, and the image module reading them from there."""
    shutil.copytree(REPO / "docker", tmp_path / "docker")
    shutil.copytree(REPO / "operator", tmp_path / "operator", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(images, "REPO", tmp_path)
    monkeypatch.setattr(images, "DOCKER_DIR", tmp_path / "docker")
    return tmp_path


def test_the_key_follows_sources_and_pins_not_mtimes(repo_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = images.image_key(images.OPERATOR)
    main = repo_copy / "operator" / "clef_operator" / "__main__.py"
    main.touch()
    (repo_copy / "operator" / "clef_operator" / "__pycache__").mkdir(exist_ok=True)
    (repo_copy / "operator" / "clef_operator" / "__pycache__" / "x.pyc").write_bytes(b"leftover")
    assert images.image_key(images.OPERATOR) == key  # mtimes and bytecode leftovers change nothing
    main.write_text(main.read_text() + "\n# changed\n")
    changed = images.image_key(images.OPERATOR)
    assert changed != key
    monkeypatch.setattr(images, "pins", lambda: ["kopf==0.0.1"])
    assert images.image_key(images.OPERATOR) not in (key, changed)


def test_the_reference_names_the_version_and_the_key(repo_copy: Path) -> None:
    image = images.built_image("clef-operator")
    key = images.image_key(images.OPERATOR)
    assert image.reference == f"localhost/clef-serving/clef-operator:0.1.0-{key}"
    assert image.archive == images.images_dir() / "clef-operator" / key / "clef-operator.oci.tar"


def test_own_distributions_are_not_pinned() -> None:
    pinned = {pin.split("==")[0] for pin in images.pins()}
    assert "kopf" in pinned and "torch" in pinned
    assert not pinned & images.OWN_DISTRIBUTIONS


def test_install_records_are_dropped_from_the_files_and_from_record(tmp_path: Path) -> None:
    dist_info = tmp_path / "pkg-1.0.dist-info"
    dist_info.mkdir()
    for name in ("METADATA", "direct_url.json", "uv_cache.json"):
        (dist_info / name).write_text("{}")
    (dist_info / "RECORD").write_text(
        "pkg/__init__.py,sha256=abc,3\n"
        "pkg-1.0.dist-info/METADATA,sha256=def,2\n"
        "pkg-1.0.dist-info/direct_url.json,sha256=ghi,2\n"
        "pkg-1.0.dist-info/uv_cache.json,sha256=jkl,2\n"
        "pkg-1.0.dist-info/RECORD,,\n"
    )
    images.drop_install_records(tmp_path)
    assert sorted(path.name for path in dist_info.iterdir()) == ["METADATA", "RECORD"]
    assert (dist_info / "RECORD").read_text() == (
        "pkg/__init__.py,sha256=abc,3\npkg-1.0.dist-info/METADATA,sha256=def,2\npkg-1.0.dist-info/RECORD,,\n"
    )


def test_console_scripts_move_to_usr_local_bin_with_the_images_python(tmp_path: Path) -> None:
    """The installer's scripts carry the building machine's interpreter; the image's carry its own, and RECORD
    follows them (path and hash), as ``pip install`` into /usr/local records them."""
    site, scripts = tmp_path / "site", tmp_path / "scripts"
    (site / "bin").mkdir(parents=True)
    (site / "bin" / "tool").write_bytes(b"#!/home/someone/.venv/bin/python\nimport pkg\npkg.main()\n")
    dist_info = site / "pkg-1.0.dist-info"
    dist_info.mkdir()
    record = "bin/tool,sha256=old,49\npkg/__init__.py,sha256=abc,3\npkg-1.0.dist-info/RECORD,,\n"
    (dist_info / "RECORD").write_text(record)
    images.relocate_scripts(site, scripts)
    body = b"#!/usr/bin/python3\nimport pkg\npkg.main()\n"
    assert (scripts / "tool").read_bytes() == body and (scripts / "tool").stat().st_mode & 0o777 == 0o755
    assert not (site / "bin").exists()
    digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
    assert (dist_info / "RECORD").read_text() == (
        f"../../../bin/tool,sha256={digest},{len(body)}\npkg/__init__.py,sha256=abc,3\npkg-1.0.dist-info/RECORD,,\n"
    )


def test_a_long_interpreter_paths_sh_prologue_is_replaced_too(tmp_path: Path) -> None:
    (tmp_path / "site" / "bin").mkdir(parents=True)
    long_python = "/home/someone/" + "deep/" * 30 + ".venv/bin/python"
    prologue = f"#!/bin/sh\n'''exec' '{long_python}' \"$0\" \"$@\"\n' '''\n"
    (tmp_path / "site" / "bin" / "tool").write_text(prologue + "import pkg\npkg.main()\n")
    images.relocate_scripts(tmp_path / "site", tmp_path / "scripts")
    assert (tmp_path / "scripts" / "tool").read_text() == "#!/usr/bin/python3\nimport pkg\npkg.main()\n"


def test_a_script_that_is_not_python_stops_the_build(tmp_path: Path) -> None:
    (tmp_path / "site" / "bin").mkdir(parents=True)
    (tmp_path / "site" / "bin" / "tool").write_bytes(b"\x7fELF\x02\x01")
    with pytest.raises(images.ImageBuildError, match="tool: not a Python console script"):
        images.relocate_scripts(tmp_path / "site", tmp_path / "scripts")


def test_the_archives_used_last_are_kept_and_the_others_removed(tmp_path: Path) -> None:
    """Other checkouts' archives stay while they are among the last used; a killed build's folder goes."""
    for age, key in enumerate(("newest", "older", "oldest")):
        (tmp_path / key).mkdir()
        (tmp_path / key / "img.oci.tar").write_bytes(b"")
        os.utime(tmp_path / key, (1_000_000 - age, 1_000_000 - age))
    (tmp_path / "killed").mkdir()
    (tmp_path / "killed" / "work-1").mkdir()
    images.remove_unused_archives(tmp_path, keep=2)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["newest", "older"]


def test_pins_read_the_environment_not_other_folders_on_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder on sys.path with another version of an installed distribution (as setuptools' vendored ones are once
    pkg_resources is imported) changes neither the pins nor so the image's key."""
    before = images.pins()
    vendored = tmp_path / "typing_extensions-0.0.1.dist-info"
    vendored.mkdir()
    (vendored / "METADATA").write_text("Metadata-Version: 2.1\nName: typing_extensions\nVersion: 0.0.1\n")
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path)])  # after site-packages, as setuptools puts them
    assert images.pins() == before and "typing-extensions==0.0.1" not in images.pins()
