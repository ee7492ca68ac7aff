"""The head benchmark script runs (CPU, tiny head), so it cannot rot between benchmark runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_head_benchmark_prints_both_paths_and_their_agreement() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.head_benchmark", "--shape", "tiny", "--records", "4", "--repeats", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "one record per call" in done.stdout and "one batched call" in done.stdout
    difference = float(done.stdout.rsplit("max |Δ logit| between paths ", 1)[1].split()[0])
    assert difference < 1e-4
