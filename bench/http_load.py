"""Closed-loop HTTP load on ``POST /v1/systemone``: C clients, each sending its next request on reply.

Used by the GPU benchmark's HTTP stage against a running ``python -m predictor``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any, Sequence


def _percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def _run(url: str, bodies: Sequence[dict[str, Any]], clients: int, timeout: float) -> dict[str, Any]:
    import httpx

    latencies: list[float] = []
    errors: list[str] = []
    tokens = 0
    cursor = iter(range(len(bodies)))

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        for index in cursor:
            start = time.perf_counter()
            try:
                response = await http.post(url, json=bodies[index])
            except httpx.HTTPError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            latencies.append(time.perf_counter() - start)
            if response.status_code != 200:
                errors.append(f"HTTP {response.status_code}: {response.text[:200]}")
                continue
            tokens += int(response.json()["usage"]["input_tokens"])

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        elapsed = time.perf_counter() - started
    ok = len(latencies) - sum(1 for e in errors if e.startswith("HTTP"))
    return {
        "clients": clients,
        "requests": len(bodies),
        "ok": ok,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "seconds": round(elapsed, 3),
        "requests_per_s": round(ok / elapsed, 2),
        "prompt_tokens_per_s": round(tokens / elapsed, 1),
        "p50_ms": round(1000 * statistics.median(latencies), 1) if latencies else None,
        "p95_ms": round(1000 * _percentile(latencies, 0.95), 1) if latencies else None,
    }


def run_load(url: str, bodies: Sequence[dict[str, Any]], clients: int, timeout: float = 120.0) -> dict[str, Any]:
    """Send every body once with ``clients`` concurrent clients; requests/s, tokens/s, p50/p95 latency."""
    if clients < 1 or not bodies:
        raise ValueError("clients must be positive and bodies non-empty")
    return asyncio.run(_run(url, bodies, clients, timeout))
