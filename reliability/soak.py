"""Soak a running predictor:
``python -m reliability.soak --url http://127.0.0.1:8080 --pid PID --clients 64 --minutes 10``.

N clients send valid, varied System One requests back to back for T minutes; the server's resident
memory (the process and its children, from /proc: run on the server's machine) is sampled every
``--sample-seconds``. Prints errors, latency percentiles, the RSS samples, and the RSS growth from the
end of minute ``--settle-minutes`` to the end. Exit status 1 on any error or when the growth exceeds
``--max-growth``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from typing import Any

import httpx

from reliability.common import MODEL_NAME, loopback_url, mib, percentile, rss_bytes, valid_request


async def soak(
    url: str,
    clients: int,
    seconds: float,
    pid: int | None,
    sample_seconds: float = 10.0,
    settle_seconds: float = 120.0,
    model: str = MODEL_NAME,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the soak; return its figures."""
    url = loopback_url(url)
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    samples: list[tuple[float, int]] = []
    started = time.monotonic()
    stop_at = started + seconds

    async def client_loop(index: int, http: httpx.AsyncClient) -> None:
        sent = 0
        while time.monotonic() < stop_at:
            body = valid_request(index * 100_003 + sent, model)
            sent += 1
            begun = time.perf_counter()
            try:
                response = await http.post("/v1/systemone", json=body, timeout=300)
            except httpx.HTTPError as exc:
                errors[type(exc).__name__] += 1
                continue
            if response.status_code == 200:
                latencies.append(time.perf_counter() - begun)
            else:
                errors[str(response.status_code)] += 1

    async def sampler() -> None:
        while pid is not None and time.monotonic() < stop_at:
            samples.append((round(time.monotonic() - started, 1), rss_bytes(pid)))
            await asyncio.sleep(sample_seconds)
        if pid is not None:
            samples.append((round(time.monotonic() - started, 1), rss_bytes(pid)))

    async with httpx.AsyncClient(
        base_url=url, headers=headers or {}, limits=httpx.Limits(max_connections=clients)
    ) as http:
        await asyncio.gather(sampler(), *(client_loop(index, http) for index in range(clients)))
    settled = [rss for at, rss in samples if at >= min(settle_seconds, seconds / 2)]
    growth = (settled[-1] - settled[0]) / settled[0] if len(settled) >= 2 and settled[0] else 0.0
    return {
        "clients": clients,
        "seconds": round(time.monotonic() - started, 1),
        "requests": len(latencies),
        "errors": dict(errors),
        "requests_per_s": round(len(latencies) / max(seconds, 1e-9), 2),
        "latency_ms_p50": round(1000 * percentile(latencies, 0.5), 1),
        "latency_ms_p99": round(1000 * percentile(latencies, 0.99), 1),
        "rss_mib": [(at, mib(rss)) for at, rss in samples],
        "rss_growth_after_settle": round(growth, 4),
    }


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m reliability.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="predictor base URL (loopback only)")
    parser.add_argument("--pid", type=int, default=None, help="the predictor's process id, for RSS samples")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--sample-seconds", type=float, default=10)
    parser.add_argument("--settle-minutes", type=float, default=2, help="growth is measured from here")
    parser.add_argument(
        "--max-growth", type=float, default=0.05, help="largest RSS growth after settling (0.05 = 5 %%)"
    )
    parser.add_argument("--model", default=MODEL_NAME)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args(argv)
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else None
    result = asyncio.run(
        soak(
            args.url,
            args.clients,
            args.minutes * 60,
            args.pid,
            args.sample_seconds,
            args.settle_minutes * 60,
            args.model,
            headers,
        )
    )
    print(json.dumps(result, indent=2))
    ok = not result["errors"] and result["requests"] > 0 and result["rss_growth_after_settle"] <= args.max_growth
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
