"""bench.request_overhead: its bodies, its reading of the predictor's JSON request lines, the join of client and
server latencies, and one run against real predictors (the demo release, the transformers engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.request_overhead import body_source, main, marked, overhead, server_latencies


def test_marked_puts_the_mark_in_a_text_state_and_a_structured_one() -> None:
    assert marked({"state": "a ticket", "questions": {}}, "#a1")["state"] == "#a1 a ticket"
    assert marked({"state": {"ticket": "x"}}, "#v2")["state"] == {"mark": "#v2", "ticket": "x"}


def test_body_source_cycles_the_records_and_never_changes_them() -> None:
    records = [{"model": "m", "state": "a"}, {"model": "m", "state": "b"}]
    body = body_source(records)
    assert [body("a", n)["state"] for n in range(3)] == ["#a0 a", "#a1 b", "#a2 a"]
    assert body("v", 0)["state"] == "#v0 a"
    assert records == [{"model": "m", "state": "a"}, {"model": "m", "state": "b"}]


def test_the_default_bodies_differ_by_mark_and_index() -> None:
    body = body_source(None)
    states = [json.dumps(body(mark, n)["state"]) for mark in "av" for n in range(3)]
    assert len(set(states)) == 6


def test_server_latencies_reads_only_the_request_lines() -> None:
    log = "\n".join(
        [
            "2026-12-07 INFO starting",
            '{"id": "s0-text-aiohttp-0", "route": "systemone", "status": 200, "latency_ms": 21.5}',
            "{not json",
            '{"event": "something else"}',
            '{"id": "s0-text-aiohttp-1", "latency_ms": 19}',
        ]
    )
    assert server_latencies(log) == {"s0-text-aiohttp-0": 21.5, "s0-text-aiohttp-1": 19.0}


def test_overhead_sets_each_request_beside_its_own_server_time() -> None:
    figures = overhead([("a", 10.0), ("b", 30.0), ("c", 21.0)], {"a": 9.0, "b": 27.0, "c": 20.5, "other": 1.0})
    assert figures["requests"] == 3
    assert figures["client_ms"]["p50"] == 21.0 and figures["server_ms"]["p50"] == 20.5
    assert figures["overhead_ms"] == {"p50": 1.0, "mean": 1.5, "p95": 3.0, "min": 0.5, "max": 3.0, "count": 3}


def test_a_request_missing_from_the_log_fails_the_run() -> None:
    with pytest.raises(RuntimeError, match="1 of 2 requests are not in the predictor's log, e.g. b"):
        overhead([("a", 10.0), ("b", 30.0)], {"a": 9.0})


def test_a_run_against_a_text_and_a_vision_predictor(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    argv = ["--out", str(out), "--engine", "transformers", "--requests", "3", "--warmup", "1"]
    assert main([*argv, "--images", "1", "--image-size", "64x48"]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [run["server"] for run in runs] == ["text", "vision"]
    assert "--vision" in runs[1]["command"] and "--vision" not in runs[0]["command"]
    for run in runs:
        assert set(run["clients"]) == {"aiohttp", "vision"}
        for figures in run["clients"].values():
            assert figures["requests"] == 3
            # the client's clock encloses the server's, request by request
            assert figures["overhead_ms"]["p50"] > 0 and figures["client_ms"]["p50"] > figures["server_ms"]["p50"] > 0
    assert (tmp_path / "overhead-vision-0.log").read_text().count('"latency_ms"') == 1 + 2 * 4  # an image, 2 x 4 texts
