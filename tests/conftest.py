"""Shared fixtures (tiny random releases built by our own code, the original release code), the skip policy and
the tests' worker groups (pytest-xdist)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from clef_tools.tiny import build_tiny_release
from tests.skip_policy import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401 (the suite's hooks)
from tests.worker_groups import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401 (the suite's hooks)

REFERENCE_MODULE = "clef_finetune/_vendor/joint_schema_model.py"


@pytest.fixture(scope="session")
def tiny_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random release with the head at the root (Cloudflare's layout)."""
    return build_tiny_release(tmp_path_factory.mktemp("tiny-release"), seed=0, layout="release").path


@pytest.fixture(scope="session")
def tiny_release_fp8_layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random release with the head in clef_head/ (the FP8 repository's layout)."""
    return build_tiny_release(tmp_path_factory.mktemp("tiny-fp8-layout"), seed=1, layout="fp8").path


@pytest.fixture(scope="session")
def reference() -> ModuleType:
    """Clef's original release code, loaded by path from the clef-finetune package (test-only)."""
    spec = importlib.util.find_spec("clef_finetune")
    assert spec is not None and spec.origin is not None, "clef-finetune is not installed (the dev extra has it)"
    path = Path(spec.origin).parent.parent / REFERENCE_MODULE
    module_spec = importlib.util.spec_from_file_location("clef_reference_release", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    return module
