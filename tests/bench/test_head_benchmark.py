"""The head benchmark script runs (CPU, tiny head), so it cannot rot between benchmark runs."""

from __future__ import annotations

from tests.bench.scripts import run_bench


def test_head_benchmark_prints_both_paths_and_their_agreement() -> None:
    stdout = run_bench("head_benchmark", "--shape", "tiny", "--records", "4", "--repeats", "1")
    assert "one record per call" in stdout and "one batched call" in stdout
    difference = float(stdout.rsplit("max |Δ logit| between paths ", 1)[1].split()[0])
    assert difference < 1e-4
