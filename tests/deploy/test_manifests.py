"""manifests/: generated from the chart by scripts/render_manifests.py, never edited by hand."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType
from typing import Any

import pytest

from tests.deploy.chart import HELM, NAMESPACE, REPO, load_yaml_objects

MANIFESTS = REPO / "manifests"


@pytest.fixture(scope="module")
def renderer() -> ModuleType:
    """scripts/render_manifests.py, imported by path."""
    spec = importlib.util.spec_from_file_location("render_manifests", REPO / "scripts" / "render_manifests.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_manifests_match_the_chart(renderer: ModuleType, tmp_path: pathlib.Path) -> None:
    if not HELM.is_file():
        pytest.fail(f"helm not found at {HELM}: run `bash scripts/install_k8s_tools.sh` (bootstrap does)")
    renderer.render(tmp_path, str(HELM))
    drift = renderer.diff_dirs(tmp_path, MANIFESTS)
    assert drift == "", f"manifests/ is stale; run `.venv/bin/python scripts/render_manifests.py`:\n{drift}"


def test_the_charts_crd_is_rendered_from_the_spec_model(renderer: ModuleType) -> None:
    drift = renderer.crd_drift()
    assert drift == "", f"the chart's CRD is stale; run `.venv/bin/python scripts/render_manifests.py`:\n{drift}"


def test_crd_drift_names_a_hand_edit(renderer: ModuleType, tmp_path: pathlib.Path) -> None:
    edited = tmp_path / "clefdecisions.yaml"
    chart_crd = REPO / "charts" / "clef-serving" / "crds" / "clefdecisions.yaml"
    edited.write_text(chart_crd.read_text().replace("maximum: 1000", "maximum: 2000", 1))
    drift = renderer.crd_drift(edited)
    assert "-  " in drift and "maximum: 2000" in drift and "maximum: 1000" in drift


def test_manifests_are_the_default_release_plus_its_namespace(rendered_default: list[dict[str, Any]]) -> None:
    files = sorted(MANIFESTS.glob("*.yaml"))
    objects = [obj for path in files for obj in load_yaml_objects(path)]
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"] == [NAMESPACE]
    key = lambda o: (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", ""))  # noqa: E731
    others = [o for o in objects if o["kind"] != "Namespace"]
    assert sorted(others, key=key) == sorted(rendered_default, key=key)
    # kubectl applies a folder's files in name order: the namespace and CRDs come before what uses them.
    order = [path.name for path in files]
    assert order[:2] == ["00-namespace.yaml", "01-crds.yaml"]
    crd_kinds = {o["spec"]["names"]["kind"] for o in load_yaml_objects(MANIFESTS / "01-crds.yaml")}
    assert crd_kinds == {"ClefDecision", "ClusterKopfPeering", "KopfPeering"}


def test_the_crd_has_one_source(renderer: ModuleType) -> None:
    chart_crd = load_yaml_objects(REPO / "charts" / "clef-serving" / "crds" / "clefdecisions.yaml")
    manifest_crds = load_yaml_objects(MANIFESTS / "01-crds.yaml")
    assert chart_crd[0] in manifest_crds
    project_yaml = [
        p for top in REPO.iterdir() if top.is_dir() and not top.name.startswith(".") for p in top.rglob("*.yaml")
    ]
    copies = [
        p
        for p in project_yaml
        if "kind: CustomResourceDefinition" in (text := p.read_text()) and "name: clefdecisions.clef-serving.io" in text
    ]
    assert sorted(p.relative_to(REPO).as_posix() for p in copies) == [
        "charts/clef-serving/crds/clefdecisions.yaml",
        "manifests/01-crds.yaml",
    ]


def test_check_mode_reports_drift(
    renderer: ModuleType, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    renderer.render(tmp_path, str(HELM))
    assert renderer.main(["--check", "--out", str(tmp_path), "--helm", str(HELM)]) == 0
    operator_file = tmp_path / "04-operator.yaml"
    operator_file.write_text(operator_file.read_text().replace("replicas: 1", "replicas: 3"))
    assert renderer.main(["--check", "--out", str(tmp_path), "--helm", str(HELM)]) == 1
    assert "-  replicas: 3" in capsys.readouterr().out
