"""Load tool: ``python -m bench.load`` — N concurrent clients against a running predictor.

    python -m bench.load --url http://127.0.0.1:8080 --clients 8 --requests 200
    python -m bench.load --direct --model-dir DIR --engine transformers --clients 8 --requests 200

Prints requests/s, prompt tokens/s, p50/p95/p99 latency and errors. ``--direct`` calls the engine in
this process (no HTTP) with the same requests: the difference in latency is the HTTP overhead.

The HTTP client is aiohttp, one session with one connection per client: a load generator must not be what
it measures. httpx's connection pool costs each request time that grows with the number of connections
(``python -m bench.load_client_ceiling`` measures both clients against a server that answers at once or at a
fixed rate; see BENCHMARKS.md, "The load client").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from predictor.engines.config import ENGINE_CHOICES

MODEL_NAME = "clef-flash"


HOT_BODIES = 8
"""Repeated requests (``--repeat-fraction``) cycle through this many distinct bodies."""


def repeated_index(index: int, repeat_fraction: float) -> int:
    """The body sent as call ``index``: with probability ``repeat_fraction`` (seeded by ``index``) one of
    :data:`HOT_BODIES` repeated bodies (negative ids), else a body used once (``index``)."""
    if random.Random(index).random() < repeat_fraction:
        return -1 - index % HOT_BODIES
    return index


def bench_request(index: int, model: str, repeat_fraction: float = 0.0) -> dict[str, Any]:
    """A representative System One request; the state varies with ``index`` (see :func:`repeated_index`)."""
    index = repeated_index(index, repeat_fraction)
    return {
        "model": model,
        "state": {"ticket": f"Customer {index} was charged twice for plan {index % 3} and asks for a refund."},
        "questions": {
            "urgent": {"type": "noul", "instructions": "Does this need a reply today?"},
            "topic": {"type": "choice", "criteria": {"billing": "money", "bug": None, "other": None}},
            "tone": {"type": "score", "criteria": ["calm", "annoyed", "angry"]},
        },
    }


@dataclass
class Results:
    """Latencies, token counts and errors of one run."""

    latencies: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The figures as a dict."""
        ordered = sorted(self.latencies)

        def pct(q: float) -> float:
            return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2) if ordered else 0.0

        return {
            "requests": len(self.latencies),
            "errors": sum(self.errors.values()),
            "error_kinds": self.errors,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 2),
            "requests_per_s": round(len(self.latencies) / self.seconds, 2) if self.seconds else 0.0,
            "tokens_per_s": round(self.tokens / self.seconds, 1) if self.seconds else 0.0,
            "latency_ms_mean": round(1000 * statistics.fmean(ordered), 2) if ordered else 0.0,
            "latency_ms_p50": pct(0.50),
            "latency_ms_p95": pct(0.95),
            "latency_ms_p99": pct(0.99),
        }


async def run_load(call: Callable[[int], Awaitable[int]], clients: int, requests: int) -> Results:
    """``clients`` workers share ``requests`` calls; ``call`` returns the prompt tokens or raises."""
    results = Results()
    counter = iter(range(requests))

    async def worker() -> None:
        for index in counter:
            started = time.perf_counter()
            try:
                tokens = await call(index)  # not `results.tokens += await ...`: that loses concurrent updates
            except Exception as exc:  # noqa: BLE001 (each failure is counted by type and reported; the run goes on)
                kind = type(exc).__name__
                results.errors[kind] = results.errors.get(kind, 0) + 1
                continue
            results.tokens += tokens
            results.latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    results.seconds = time.perf_counter() - started
    return results


async def http_load(
    url: str, clients: int, requests: int, warmup: int, body: Callable[[int], dict[str, Any]]
) -> Results:
    """Load over HTTP (``POST /v1/systemone``); ``body(index)`` gives the request sent as call ``index``.
    A response other than 200 counts as a ``RuntimeError``; a failed connection under aiohttp's name."""
    endpoint = f"{url.rstrip('/')}/v1/systemone"
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def call(index: int) -> int:
            async with session.post(endpoint, json=body(index)) as response:
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}")
                return int((await response.json())["usage"]["input_tokens"])

        await run_load(call, clients, warmup)
        return await run_load(call, clients, requests)


async def direct_load(args: argparse.Namespace) -> list[tuple[int, Results]]:
    """Load on the engine in this process (validation, encoding, scoring; no HTTP), one run per client count."""
    from predictor.cli import DEFAULT_ANSWER_CACHE_BYTES
    from predictor.engines import EngineConfig, build_engine
    from predictor.serving.lifecycle import Lifecycle, Phase
    from predictor.serving.options import ServingOptions, build_service
    from predictor.serving.service import ModelCard

    config = EngineConfig(
        release_dir=args.model_dir,
        kind=args.engine,
        data_parallel_size=args.dp,
        max_model_len=args.max_model_len,
        max_batch=args.max_batch,
    )
    engine = build_engine(config)
    await engine.start()
    lifecycle = Lifecycle(args.model)
    lifecycle.enter(Phase.OK)
    options = ServingOptions(
        max_queued=1 << 30, answer_cache_bytes=DEFAULT_ANSWER_CACHE_BYTES if args.answer_cache else 0
    )
    service = build_service(engine, ModelCard(args.model, "bench", "1970-01-01"), lifecycle, options)

    async def call(index: int) -> int:
        response = await service.answer(bench_request(index, args.model, args.repeat_fraction))
        return int(response["usage"]["input_tokens"])

    runs = []
    try:
        for clients in args.clients:
            await run_load(call, clients, args.warmup)
            runs.append((clients, await run_load(call, clients, args.requests)))
    finally:
        engine.close()
    return runs


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="predictor base URL")
    parser.add_argument("--model", default=MODEL_NAME, help="model name in the requests")
    parser.add_argument(
        "--clients", type=int, nargs="+", default=[1, 8, 64], help="concurrent clients (several: one run each)"
    )
    parser.add_argument("--requests", type=int, default=128, help="requests per run")
    parser.add_argument("--warmup", type=int, default=8, help="unmeasured requests before each run")
    parser.add_argument("--json", action="store_true", help="print one JSON object per run")
    parser.add_argument(
        "--repeat-fraction",
        type=float,
        default=0.0,
        help=f"share of requests that repeat one of {HOT_BODIES} bodies (answer cache / in-flight merging)",
    )
    direct = parser.add_argument_group("direct (no HTTP)")
    direct.add_argument("--direct", action="store_true", help="call the engine in this process instead of HTTP")
    direct.add_argument("--model-dir", type=Path, help="release folder (with --direct)")
    direct.add_argument("--engine", default="transformers", choices=ENGINE_CHOICES)
    direct.add_argument("--max-model-len", type=int, default=1024)
    direct.add_argument("--max-batch", type=int, default=32)
    direct.add_argument("--dp", type=int, default=1)
    direct.add_argument(
        "--answer-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the service's answer cache (the predictor's default size); identical requests in flight merge either way",
    )
    args = parser.parse_args(argv)
    if args.direct and args.model_dir is None:
        parser.error("--direct needs --model-dir")
    if not 0.0 <= args.repeat_fraction <= 1.0:
        parser.error("--repeat-fraction must be between 0 and 1")
    if args.direct:
        runs = asyncio.run(direct_load(args))
    else:
        runs = [
            (
                clients,
                asyncio.run(
                    http_load(
                        args.url,
                        clients,
                        args.requests,
                        args.warmup,
                        partial(bench_request, model=args.model, repeat_fraction=args.repeat_fraction),
                    )
                ),
            )
            for clients in args.clients
        ]
    for clients, results in runs:
        summary = {
            "mode": "direct" if args.direct else "http",
            "clients": clients,
            "repeat_fraction": args.repeat_fraction,
            **results.summary(),
        }
        if args.json:
            print(json.dumps(summary))
        else:
            print(
                f"{summary['mode']:6} repeats={args.repeat_fraction:.0%} clients={clients:3d} "
                f"requests={summary['requests']} errors={summary['errors']} "
                f"req/s={summary['requests_per_s']} tok/s={summary['tokens_per_s']} "
                f"p50={summary['latency_ms_p50']}ms p95={summary['latency_ms_p95']}ms p99={summary['latency_ms_p99']}ms"
            )


if __name__ == "__main__":
    main()
