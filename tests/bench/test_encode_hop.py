"""The encode-hop benchmark runs, so it cannot rot between benchmark runs, and times every preparer it names
through the predictor's own preparers (a worker pool that failed its start would fail the run)."""

from __future__ import annotations

import json

from tests.bench.scripts import run_bench


def test_encode_hop_prints_the_round_trip_of_each_preparer() -> None:
    stdout = run_bench("encode_hop", "--records", "6", "--repeats", "2", "--processes", "1,2")
    result = json.loads(stdout.splitlines()[0])
    assert result["records"] == 6
    timed = result["ms_per_body"]
    assert list(timed) == [
        "thread, transformers tokenizer",
        "thread, release tokenizer",
        "1 worker process(es)",
        "2 worker process(es)",
    ]
    assert all(len(passes) == 2 and all(ms > 0 for ms in passes) for passes in timed.values())
