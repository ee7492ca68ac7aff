"""Bodies of at most 64 KiB on the wire that inflate or multiply:
``python -m reliability.bounded_bodies --url URL --pid PID``.

The family: gzip, zstd and stacked bodies whose state inflates to a million short strings, hundreds of
thousands of keys, empty lists, numbers just under and over the JSON value limit, 8 MiB of digits, deep
nesting; batch, KServe V1 and V2 bodies with too many requests or one element holding a million values.
Each is sent alone first (its latency and the server's CPU seconds, from /proc: run on the server's
machine); then the refused ones are sent again and again (``--hostile-rate`` bodies per second; 0: as fast
as they are answered) while ``--clients`` valid requests run beside them,
and those requests' latencies are compared with the same valid traffic alone (an accepted body is ordinary
work for the model: 64 full prompts delay others as 64 valid requests would). A refused body must be
answered within ``--bound-s`` (0.5 s); an accepted one within that plus what its records cost the model: as
many valid requests whose state fills the prompt (the slowest of three, timed alone first), times
``--model-slack`` for a shared machine (run the server with ``--answer-cache-bytes 0``: a repeated body is
otherwise answered from the cache). Prints JSON; exit status 1 if a body missed its bound or got a 5xx, or a valid
request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import sys
import time
from typing import Any

import httpx

from reliability.common import MODEL_NAME, loopback_url, percentile, valid_request

if sys.version_info >= (3, 14):  # Python 3.14+ ships zstd in the standard library.
    from compression.zstd import compress as zstd_compress
    from compression.zstd import decompress as zstd_decompress
else:
    from backports.zstd import compress as zstd_compress
    from backports.zstd import decompress as zstd_decompress

WIRE_LIMIT = 64 << 10
Body = tuple[str, str, bytes]  # path, Content-Encoding, bytes on the wire


def _request(state: Any, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "state": state,
        "questions": {"q": {"type": "noul"}, "c": {"type": "choice", "criteria": {"a": None, "b": None}}},
    }


def _raw(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _many_keys(model: str) -> bytes:
    """As many keys as zstd fits in 64 KiB (keys that repeat a pattern compress well)."""
    count = 200_000
    while True:
        body = zstd_compress(_raw(_request({f"key{index:07d}": 0 for index in range(count)}, model)), 19)
        if len(body) <= WIRE_LIMIT:
            return body
        count = count * 3 // 4


def _v2(items: list[str]) -> dict[str, Any]:
    return {"inputs": [{"name": "request", "datatype": "BYTES", "shape": [len(items)], "data": items}]}


def family(model: str) -> dict[str, Body]:
    """Every body of the family, named."""
    one = valid_request(1, model)
    heavy = _request(["ab"] * 3000 + [{"k": list(range(20))}] * 20, model)  # 3,451 values a request: 64 fit the limit
    bodies: dict[str, Body] = {
        "gzip_million_short_strings": (
            "/v1/systemone",
            "gzip",
            gzip.compress(_raw(_request(["ab"] * 1_000_000, model)), 9),
        ),
        "zstd_million_short_strings": (
            "/v1/systemone",
            "zstd",
            zstd_compress(_raw(_request(["ab"] * 1_000_000, model)), 19),
        ),
        "zstd_many_keys": ("/v1/systemone", "zstd", _many_keys(model)),
        "gzip_empty_lists_660k": ("/v1/systemone", "gzip", gzip.compress(_raw(_request([[]] * 660_000, model)), 9)),
        "zstd_values_just_under_limit": (
            "/v1/systemone",
            "zstd",
            zstd_compress(_raw(_request([0] * 262_000, model)), 19),
        ),
        "zstd_values_just_over_limit": (
            "/v1/systemone",
            "zstd",
            zstd_compress(_raw(_request([0] * 263_000, model)), 19),
        ),
        "zstd_digits_8mib": (
            "/v1/systemone",
            "zstd",
            zstd_compress(_raw(_request("9" * ((8 << 20) - 512), model)), 19),
        ),
        "gzip_zstd_emoji_7mib": (
            "/v1/systemone",
            "gzip, zstd",
            zstd_compress(gzip.compress(_raw(_request("🙂 é 日本" * 600_000, model)))),
        ),
        "gzip_deep_127": (
            "/v1/systemone",
            "gzip",
            gzip.compress(_raw(_request([json.loads("[" * 126 + "]" * 126)] * 5000, model)), 9),
        ),
        "gzip_deep_129": (
            "/v1/systemone",
            "gzip",
            gzip.compress(_raw(_request(json.loads("[" * 129 + "]" * 129), model)), 9),
        ),
        "gzip_batch_64_heavy": ("/v1/systemone/batch", "gzip", gzip.compress(_raw([heavy] * 64), 9)),
        "gzip_batch_65": ("/v1/systemone/batch", "gzip", gzip.compress(_raw([one] * 65), 9)),
        "gzip_v1_64_heavy": (
            f"/v1/models/{model}:predict",
            "gzip",
            gzip.compress(_raw({"instances": [heavy] * 64}), 9),
        ),
        "gzip_v1_512": (f"/v1/models/{model}:predict", "gzip", gzip.compress(_raw({"instances": [one] * 512}), 9)),
        "gzip_v2_65": (f"/v2/models/{model}/infer", "gzip", gzip.compress(_raw(_v2([json.dumps(one)] * 65)), 9)),
        "gzip_v2_million_values": (
            f"/v2/models/{model}/infer",
            "gzip",
            gzip.compress(_raw(_v2([json.dumps(_request([1] * 1_000_000, model))])), 9),
        ),
    }
    for name, (_, _, body) in bodies.items():
        assert len(body) <= WIRE_LIMIT, f"{name} is {len(body)} bytes on the wire"
    return bodies


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _send(http: httpx.AsyncClient, body: Body) -> tuple[int, float, str]:
    path, encoding, content = body
    begun = time.perf_counter()
    response = await http.post(
        path, content=content, headers={"content-type": "application/json", "content-encoding": encoding}
    )
    message = response.json().get("error", {}).get("message", "") if response.status_code != 200 else ""
    return response.status_code, time.perf_counter() - begun, message[:110]


async def _valid_traffic(http: httpx.AsyncClient, model: str, clients: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    failures: list[int] = []  # statuses other than 200
    deadline = time.perf_counter() + seconds

    async def client(index: int) -> None:
        count = 0
        while time.perf_counter() < deadline:
            begun = time.perf_counter()
            response = await http.post("/v1/systemone", json=valid_request(index * 1000 + count, model))
            latencies.append(time.perf_counter() - begun)
            if response.status_code != 200:
                failures.append(response.status_code)
            count += 1

    await asyncio.gather(*(client(index) for index in range(clients)))
    return {
        "requests": len(latencies),
        "non_200": {str(status): failures.count(status) for status in sorted(set(failures))},
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
    }


def _records(body: Body) -> int:
    """System One requests in a family body (for its bound when accepted)."""
    path, encoding, content = body
    raw = zstd_decompress(content) if "zstd" in encoding else content  # gzip, then zstd around it
    if "gzip" in encoding:
        raw = gzip.decompress(raw)
    if path.endswith("/batch"):
        return len(json.loads(raw))
    if path.endswith(":predict"):
        return len(json.loads(raw)["instances"])
    if path.endswith("/infer"):
        return len(json.loads(raw)["inputs"][0]["data"])
    return 1


async def _full_prompt_s(http: httpx.AsyncClient, model: str) -> float:
    """The slowest of three valid requests whose state fills the prompt, sent alone (what the model costs)."""
    latencies = []
    for index in range(3):
        body = {**valid_request(index, model), "state": f"turn {index}: " + "the customer writes again " * 4000}
        begun = time.perf_counter()
        response = await http.post("/v1/systemone", json=body)
        response.raise_for_status()
        latencies.append(time.perf_counter() - begun)
    return max(latencies)


async def run(
    url: str, pid: int | None, model: str, clients: int, seconds: float, bound_s: float, slack: float, rate: float
) -> dict[str, Any]:
    """The figures: each body alone, then the valid traffic alone and beside the family."""
    bodies = family(model)
    result: dict[str, Any] = {"bodies": {}, "slow": []}
    async with httpx.AsyncClient(base_url=loopback_url(url), timeout=300) as http:
        full_prompt_s = await _full_prompt_s(http, model)
        result["full_prompt_request_s"] = round(full_prompt_s, 3)
        for name, body in bodies.items():
            before = cpu_seconds(pid) if pid else 0.0
            status, latency, message = await _send(http, body)
            limit = bound_s + (_records(body) * full_prompt_s * slack if status == 200 else 0.0)
            if latency >= limit or status >= 500:
                result["slow"].append(name)
            result["bodies"][name] = {
                "wire_bytes": len(body[2]),
                "status": status,
                "latency_s": round(latency, 3),
                "bound_s": round(limit, 3),
                "server_cpu_s": round(cpu_seconds(pid) - before, 2) if pid else None,
                "message": message,
            }
        before = cpu_seconds(pid) if pid else 0.0
        result["valid_alone"] = await _valid_traffic(http, model, clients, seconds)
        result["valid_alone"]["server_cpu_s"] = round(cpu_seconds(pid) - before, 1) if pid else None
        stop = time.perf_counter() + seconds
        hostile: list[tuple[int, float]] = []

        refused = [bodies[name] for name, item in result["bodies"].items() if item["status"] != 200]

        async def attacker() -> None:
            while time.perf_counter() < stop:
                for body in refused:
                    begun = time.perf_counter()
                    status, latency, _ = await _send(http, body)
                    hostile.append((status, latency))
                    if rate > 0:
                        await asyncio.sleep(max(0.0, 1 / rate - (time.perf_counter() - begun)))

        before = cpu_seconds(pid) if pid else 0.0
        beside, _ = await asyncio.gather(_valid_traffic(http, model, clients, seconds), attacker())
        beside["server_cpu_s"] = round(cpu_seconds(pid) - before, 1) if pid else None
        result["valid_beside_family"] = beside
        result["refused_beside_valid"] = {
            "sent": len(hostile),
            "statuses": sorted({status for status, _ in hostile}),
            "latency_s_max": round(max(latency for _, latency in hostile), 3),
        }
    return result


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m reliability.bounded_bodies", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="predictor base URL (loopback only)")
    parser.add_argument("--pid", type=int, default=None, help="the predictor's process id, for its CPU seconds")
    parser.add_argument("--model", default=MODEL_NAME)
    parser.add_argument("--clients", type=int, default=4, help="valid requests in flight beside the family")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each valid-traffic phase")
    parser.add_argument("--bound-s", type=float, default=0.5, help="the most a refused body may take")
    parser.add_argument(
        "--model-slack", type=float, default=2.0, help="tolerance on what the model costs an accepted body"
    )
    parser.add_argument(
        "--hostile-rate", type=float, default=2.0, help="refused bodies per second beside the valid traffic"
    )
    args = parser.parse_args(argv)
    result = asyncio.run(
        run(
            args.url,
            args.pid,
            args.model,
            args.clients,
            args.seconds,
            args.bound_s,
            args.model_slack,
            args.hostile_rate,
        )
    )
    print(json.dumps(result, indent=2))
    slow = result["slow"]
    failed = {**result["valid_alone"]["non_200"], **result["valid_beside_family"]["non_200"]}
    if slow or failed or any(status >= 500 for status in result["refused_beside_valid"]["statuses"]):
        print(f"FAILED: slow or 5xx bodies {slow}, valid requests failed {failed}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
