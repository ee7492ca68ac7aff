"""Paths and helpers for the chart checks: run helm, render the chart, read YAML."""

from __future__ import annotations

import functools
import os
import pathlib
import subprocess
from collections.abc import Sequence
from typing import Any

import pytest
import yaml

from tests.crd_schema import KSERVE_CRDS

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "clef-serving"
ALL_ON_VALUES = pathlib.Path(__file__).resolve().parent / "values-all-on.yaml"
HELM = pathlib.Path(os.environ.get("HELM", REPO / ".venv" / "bin" / "helm"))
RELEASE = "clef-serving"
NAMESPACE = "clef-system"


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    """Run helm with args (no check): fails the test with a clear message when helm is missing."""
    if not HELM.is_file():
        pytest.fail(f"helm not found at {HELM}: run `bash scripts/install_k8s_tools.sh` (bootstrap does)")
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, check=False, timeout=120)


def render_chart(*, values: Sequence[pathlib.Path] = (), sets: Sequence[str] = ()) -> list[dict[str, Any]]:
    """`helm template` the chart (CRDs included) and return the rendered objects."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    for path in values:
        args += ["--values", str(path)]
    for item in sets:
        args += ["--set", item]
    done = run_helm(*args)
    assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def load_yaml_objects(path: pathlib.Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document of a file (with libyaml where available: KServe's CRDs are large)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(path.read_text(), Loader=loader) if doc]


@functools.cache
def load_kserve_crds() -> dict[str, dict[str, Any]]:
    """KServe's CRDs by kind: InferenceService, ServingRuntime and ClusterServingRuntime."""
    crds: dict[str, dict[str, Any]] = {}
    for path in sorted(KSERVE_CRDS.glob("*.yaml")):
        for crd in load_yaml_objects(path):
            crds[crd["spec"]["names"]["kind"]] = crd
    expected = {"InferenceService", "ServingRuntime", "ClusterServingRuntime"}
    assert set(crds) == expected, f"{KSERVE_CRDS}: {sorted(crds)}"
    return crds
