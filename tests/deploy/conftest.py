"""Shared fixtures for the chart, manifest and image checks: rendered charts and CRDs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.deploy.chart import (
    ALL_ON_VALUES,
    CLEF_CRD,
    KSERVE_CRDS,
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
    """KServe's v0.20.0 CRDs by kind (InferenceService, ServingRuntime, ClusterServingRuntime)."""
    crds = load_kserve_crds()
    if not crds:
        pytest.skip(f"KServe CRD YAML not found at {KSERVE_CRDS} (set $KSERVE_CRDS to a folder of them)")
    return crds
