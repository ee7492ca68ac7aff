"""Overload a running predictor:
``python -m reliability.overload --url http://127.0.0.1:8080 --clients 256 --seconds 60``.

Many clients send valid requests back to back. A server that sheds load answers the excess with 503 or
429 and a ``Retry-After`` header while the admitted requests keep a bounded latency. Prints the status
counts, whether every 429/503 carried ``Retry-After``, and latency percentiles of the 200s; exit status 1
on a 5xx other than 503, a shed answer without ``Retry-After``, or a transport error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from typing import Any

import httpx

from reliability.common import MODEL_NAME, loopback_url, percentile, valid_request


async def overload(
    url: str, clients: int, seconds: float, model: str = MODEL_NAME, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run the overload; return its figures."""
    url = loopback_url(url)
    statuses: Counter[str] = Counter()
    admitted: list[float] = []
    shed_without_retry_after = 0
    stop_at = time.monotonic() + seconds

    async def client_loop(index: int, http: httpx.AsyncClient) -> None:
        nonlocal shed_without_retry_after
        sent = 0
        while time.monotonic() < stop_at:
            sent += 1
            begun = time.perf_counter()
            try:
                response = await http.post("/v1/systemone", json=valid_request(index * 7919 + sent, model), timeout=600)
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
                continue
            statuses[str(response.status_code)] += 1
            if response.status_code == 200:
                admitted.append(time.perf_counter() - begun)
            elif response.status_code in (429, 503):
                if "retry-after" not in response.headers:
                    shed_without_retry_after += 1
                await asyncio.sleep(min(float(response.headers.get("retry-after", "1") or 1), 5.0))

    async with httpx.AsyncClient(
        base_url=url, headers=headers or {}, limits=httpx.Limits(max_connections=clients)
    ) as http:
        await asyncio.gather(*(client_loop(index, http) for index in range(clients)))
    failures = sum(
        count
        for status, count in statuses.items()
        if not status.isdigit() or (status.startswith("5") and status != "503")
    )
    return {
        "clients": clients,
        "statuses": dict(statuses),
        "shed_without_retry_after": shed_without_retry_after,
        "admitted_latency_ms_p50": round(1000 * percentile(admitted, 0.5), 1),
        "admitted_latency_ms_p99": round(1000 * percentile(admitted, 0.99), 1),
        "ok": failures == 0 and shed_without_retry_after == 0 and bool(admitted),
    }


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m reliability.overload", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="predictor base URL (loopback only)")
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--model", default=MODEL_NAME)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args(argv)
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else None
    result = asyncio.run(overload(args.url, args.clients, args.seconds, args.model, headers))
    print(json.dumps(result, indent=2))
    raise SystemExit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
