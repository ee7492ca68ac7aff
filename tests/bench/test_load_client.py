"""The load tool's HTTP client (``bench.load.http_load``) and request bodies, and ``bench.load_client_ceiling``,
which measures how fast a client can go against a server that costs nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from bench.load import http_load
from bench.load_client_ceiling import BODY, started_server
from clef_tools.local_server import free_port

REPO = Path(__file__).resolve().parents[2]


def test_http_load_counts_every_answer_of_a_fixed_rate_server() -> None:
    child, url = started_server(rate=400.0)
    try:
        results = asyncio.run(http_load(url, clients=4, requests=40, warmup=4, body=lambda _index: BODY)).summary()
    finally:
        child.terminate()
        child.wait(timeout=10)
    assert (results["requests"], results["errors"], results["tokens"]) == (40, 0, 40 * 512)
    assert 0 < results["latency_ms_p50"] <= results["latency_ms_p95"] <= results["latency_ms_p99"]


def test_http_load_counts_a_refused_connection_as_an_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    results = asyncio.run(http_load(url, clients=2, requests=4, warmup=0, body=lambda _index: BODY)).summary()
    assert (results["requests"], results["errors"]) == (0, 4)
    assert list(results["error_kinds"]) == ["ClientConnectorError"]


def test_ceiling_script_loads_both_servers_with_both_clients() -> None:
    command = [
        sys.executable,
        "-m",
        "bench.load_client_ceiling",
        "--clients",
        "2,8",
        "--requests",
        "40",
        "--rate",
        "400",
        "--json",
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(row["server"], row["client"], row["clients"]) for row in rows] == [
        (server, client, clients)
        for server in ("instant", "rate")
        for client in ("aiohttp", "httpx")
        for clients in (2, 8)
    ]
    assert all(row["requests"] == 40 and row["errors"] == 0 for row in rows)
    assert all(
        row["ideal"] == {"requests_per_s": 400.0, "latency_ms": 1000 * row["clients"] / 400}
        for row in rows
        if row["server"] == "rate"
    )


def test_ceiling_script_sets_the_vision_benchmarks_client_beside_bench_loads() -> None:
    command = [sys.executable, "-m", "bench.load_client_ceiling", "--clients", "1", "--requests", "30"]
    done = subprocess.run(
        [*command, "--client", "aiohttp,vision", "--rate", "400", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(row["server"], row["client"]) for row in rows] == [
        (server, client) for server in ("instant", "rate") for client in ("aiohttp", "vision")
    ]
    assert all(row["requests"] == 30 and row["errors"] == 0 and row["latency_ms_p50"] > 0 for row in rows)
    refused = subprocess.run(
        [sys.executable, "-m", "bench.load_client_ceiling", "--clients", "1,2", "--client", "vision"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and "needs --clients 1" in refused.stderr


def test_bench_repeat_fraction_repeats_a_few_bodies() -> None:
    from bench.load import HOT_BODIES, bench_request

    def distinct(fraction: float) -> int:
        return len({json.dumps(bench_request(index, "m", fraction), sort_keys=True) for index in range(400)})

    assert distinct(0.0) == 400 and distinct(1.0) == HOT_BODIES
    assert 150 < distinct(0.5) < 250
    assert bench_request(7, "m", 0.5) == bench_request(7, "m", 0.5)
