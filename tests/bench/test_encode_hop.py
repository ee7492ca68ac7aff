"""The encode-hop benchmark runs, so it cannot rot between benchmark runs, and times every preparer it names
through the predictor's own preparers (a worker pool that failed its start would fail the run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_encode_hop_prints_the_round_trip_of_each_preparer() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.encode_hop", "--records", "6", "--repeats", "2", "--processes", "1,2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[0])
    assert result["records"] == 6
    timed = result["ms_per_body"]
    assert list(timed) == [
        "thread, transformers tokenizer",
        "thread, release tokenizer",
        "1 worker process(es)",
        "2 worker process(es)",
    ]
    assert all(len(passes) == 2 and all(ms > 0 for ms in passes) for passes in timed.values())
