"""Shared fixtures for the chart, manifest and image checks: rendered charts and CRDs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kmock._internal import parsing as kmock_parsing

from tests.crd_schema import CLEF_CRD
from tests.deploy.chart import (
    ALL_ON_VALUES,
    REPO,
    load_kserve_crds,
    load_yaml_objects,
    render_chart,
)

Render = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="session")
def render() -> Render:
    """The chart renderer (a function: render(values=[...], sets=[...]))."""
    return render_chart


@pytest.fixture(scope="session")
def rendered_default() -> list[dict[str, Any]]:
    """The chart rendered with its default values."""
    return render_chart()


@pytest.fixture(scope="session")
def rendered_all_on() -> list[dict[str, Any]]:
    """The chart rendered with every option turned on (tests/deploy/values-all-on.yaml)."""
    return render_chart(values=[ALL_ON_VALUES])


@pytest.fixture(scope="session")
def clef_crd() -> dict[str, Any]:
    """The ClefDecision CRD shipped in the chart (its one source of truth)."""
    assert CLEF_CRD.is_file(), f"{CLEF_CRD.relative_to(REPO)} is missing: the chart must ship the CRD"
    (crd,) = load_yaml_objects(CLEF_CRD)
    return crd


@pytest.fixture(scope="session")
def kserve_crds() -> dict[str, dict[str, Any]]:
    """KServe v0.20.0's CRDs by kind (InferenceService, ServingRuntime, ClusterServingRuntime)."""
    return load_kserve_crds()


@pytest.fixture
def namespace_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the API emulator parse /api/v1/namespaces[/NAME] as the Namespace resource.

    kmock 0.8 reads the segment after ``namespaces/`` as a namespace and fails on the bare collection,
    which kopf lists and watches when it serves specific namespaces, and kubectl posts namespaces to.
    """
    original = kmock_parsing.parse_path

    def parse_path(path: str) -> kmock_parsing.ParsedPath:
        parts = path.strip("/").split("/")
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
            return kmock_parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) == 4 else None)
        return original(path)

    monkeypatch.setattr(kmock_parsing, "parse_path", parse_path)
