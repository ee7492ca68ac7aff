"""The GPU benchmark's CPU smoke mode, so the script cannot rot between GPU runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _smoke(work: Path, cases: str) -> dict:
    command = [
        sys.executable, "-m", "bench.gpu_benchmark", "--device", "cpu", "--scale", "tiny", "--records", "8",
        "--tokens", "192", "--latency-records", "2", "--work", str(work), "--out", str(work), "--cases", cases, "--time-budget", "1200",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    summary = json.loads((work / "gpu_benchmark.json").read_text())
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:], summary)
    return summary


def test_smoke_without_vllm(tmp_path: Path) -> None:
    summary = _smoke(tmp_path, "prepare,transformers,head")
    records = summary["prepare"]["records"]
    assert records["count"] == 8 and records["mean_questions"] >= 1
    transformers = summary["cases"]["transformers"]
    assert transformers["records"] == 8 and transformers["prompt_tokens_per_s"] > 0
    assert 0 < transformers["split"]["head_share"] < 1
    assert summary["cases"]["head"]["batch_16_ms_per_record"] > 0
    assert (tmp_path / "logits-transformers.pt").is_file()


@pytest.mark.vllm
def test_smoke_with_vllm_reports_fp8_agreement(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    summary = _smoke(tmp_path, "prepare,vllm-bf16,vllm-fp8")
    for case in ("vllm-bf16", "vllm-fp8"):
        result = summary["cases"][case]
        assert result["records"] == 8 and result["start_s"] > 0 and result["single_record_ms"]["p50"] > 0
    agreement = summary["agreement"]["vllm-bf16 vs vllm-fp8"]
    assert agreement["questions"] >= 8 and 0 <= agreement["mean_kl"] < 1e-2
