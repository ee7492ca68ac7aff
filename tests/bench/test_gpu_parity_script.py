"""The GPU parity script's CPU-independent parts: options and comparison (the GPU run is manual)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from clef_head.layout import QuestionLayout, RecordLayout
from tests.bench.scripts import run_bench

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "plugin_gpu_parity.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    """The script loaded as a module (its import must not need vLLM or a GPU)."""
    spec = importlib.util.spec_from_file_location("plugin_gpu_parity", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


def test_help_runs_without_a_gpu() -> None:
    """``--help`` lists the cases."""
    stdout = run_bench("plugin_gpu_parity", "--help")
    assert "bf16-eager" in stdout and "fp8-graph" in stdout


def test_arguments(script: ModuleType) -> None:
    """Defaults cover every case; unknown cases and silly sizes are refused."""
    args = script.parse_args([])
    assert args.cases.split(",") == list(script.CASES)
    assert script.parse_args(["--cases", "bf16-eager", "--records", "5"]).records == 5
    with pytest.raises(SystemExit):
        script.parse_args(["--cases", "bf16-eager,int4"])
    with pytest.raises(SystemExit):
        script.parse_args(["--records", "0"])


def test_compare_flags_differences_beyond_tolerance(script: ModuleType) -> None:
    """Identical logits pass; a shifted option fails the tolerance and the top-1 agreement."""
    layout = RecordLayout(questions=(QuestionLayout("q", 1, (0, 1), ((1, 2), (2, 3)), ("a", "b")),))
    reference = [torch.tensor([1.0, 0.0])]
    same = script.compare([layout], reference, [torch.tensor([1.0, 0.0])])
    assert same["within_tolerance"] and same["top1_agreement"] == 1.0 and same["max_probability_diff"] == 0.0
    flipped = script.compare([layout], reference, [torch.tensor([0.0, 1.0])])
    assert not flipped["within_tolerance"] and flipped["top1_agreement"] == 0.0
