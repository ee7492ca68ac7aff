"""Small bodies that used to cost much: ``python -m reliability.costly_bodies --url URL --pid PID``.

- a zstd body of a few hundred bytes whose state is 8 MiB of digits (just under the default
  --max-body-bytes): its latency, and the server's peak RSS above its level before (sampled every 5 ms
  from /proc: run on the server's machine);
- a gzip body of a few KB holding 660,000 JSON lists (and one of 99,000, under the server's limit of
  100,000 arrays and objects): the longest ``GET /health`` while it is answered.
Prints the figures as JSON. ``--direct DIR`` measures instead, in this process and without a server or an
engine, the work done before the engine for each body (decompress, count containers, parse, validate,
encode with DIR's tokenizer): its seconds and the process's peak RSS growth.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import time
from typing import Any

import httpx

from reliability.common import MODEL_NAME, loopback_url, mib, rss_bytes

try:  # Python 3.14+ ships zstd in the standard library.
    from compression.zstd import compress as zstd_compress  # type: ignore[import-not-found]
except ImportError:
    from backports.zstd import compress as zstd_compress


def digits_body(model: str) -> bytes:
    """The zstd body: 8 MiB of digits as the state, one question."""
    raw = json.dumps({"model": model, "state": "9" * ((8 << 20) - 512), "questions": {"q": {"type": "noul"}}}).encode()
    return zstd_compress(raw, 19)


def lists_body(model: str, count: int = 660_000) -> bytes:
    """The gzip body: a state of ``count`` empty lists."""
    raw = json.dumps({"model": model, "state": [[]] * count, "questions": {"q": {"type": "noul"}}}).encode()
    return gzip.compress(raw, 9)


async def measure(url: str, pid: int | None, model: str, repeats: int) -> dict[str, Any]:
    """Send each costly body ``repeats`` times; return latencies, peak RSS growth and the worst /health."""
    url = loopback_url(url)
    bodies = {
        "digits": (digits_body(model), "zstd"),
        "lists": (lists_body(model), "gzip"),
        "lists_99k": (lists_body(model, 99_000), "gzip"),
    }
    result: dict[str, Any] = {f"{name}_body_bytes": len(body) for name, (body, _) in bodies.items()}
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        for name, (body, encoding) in bodies.items():
            latencies: list[float] = []
            peaks: list[int] = []
            statuses: list[int] = []
            health: list[float] = []
            for _ in range(repeats):
                baseline = rss_bytes(pid) if pid else 0
                peak = baseline
                done = asyncio.Event()

                async def sample(stop: asyncio.Event) -> None:
                    nonlocal peak
                    while not stop.is_set():
                        peak = max(peak, rss_bytes(pid) if pid else 0)
                        await asyncio.sleep(0.005)

                async def probe(stop: asyncio.Event, seconds: list[float]) -> None:
                    while not stop.is_set():
                        begun = time.perf_counter()
                        await http.get("/health")
                        seconds.append(time.perf_counter() - begun)
                        await asyncio.sleep(0.02)

                tasks = [asyncio.create_task(sample(done)), asyncio.create_task(probe(done, health))]
                begun = time.perf_counter()
                response = await http.post(
                    "/v1/systemone",
                    content=body,
                    headers={"content-type": "application/json", "content-encoding": encoding},
                )
                latencies.append(time.perf_counter() - begun)
                done.set()
                await asyncio.gather(*tasks)
                statuses.append(response.status_code)
                peaks.append(peak - baseline)
            result[name] = {
                "statuses": statuses,
                "latency_s_max": round(max(latencies), 3),
                "peak_rss_growth_mib_max": mib(max(peaks)) if pid else None,
                "health_latency_s_max": round(max(health), 3) if health else None,
            }
    return result


def measure_direct(model_dir: str, model: str, max_length: int) -> dict[str, Any]:
    """Seconds and peak RSS growth of the pre-engine work for each costly body, in this process."""
    import threading

    from transformers import AutoTokenizer

    from clef_head.encoder import encode_request
    from clef_head.request import parse_request
    from predictor.core.errors import TooLarge
    from predictor.http.errors import ApiError
    from predictor.http.http_body import decode_body
    from predictor.serving.body_limits import check_json_counts
    from predictor.serving.prepare import decode_json_body

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encode_request(
        tokenizer, parse_request(json.loads(b'{"model": "m", "state": "warm", "questions": {"q": {"type": "noul"}}}'))
    )
    bodies = {
        "digits": (digits_body(model), "zstd"),
        "lists": (lists_body(model), "gzip"),
        "lists_99k": (lists_body(model, 99_000), "gzip"),
    }
    result: dict[str, Any] = {}
    for name, (body, encoding) in bodies.items():
        baseline = rss_bytes(os.getpid(), with_children=False)
        peak = baseline
        done = threading.Event()

        def sample(stop: threading.Event) -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, rss_bytes(os.getpid(), with_children=False))
                time.sleep(0.002)

        sampler = threading.Thread(target=sample, args=(done,))
        sampler.start()
        begun = time.perf_counter()
        outcome = "encoded"
        try:
            raw = decode_body(body, encoding, 8 << 20)
            check_json_counts(raw)
            encoded = encode_request(
                tokenizer, parse_request(decode_json_body(raw, "application/json")), max_length=max_length
            )
            outcome += f" ({len(encoded.input_ids)} tokens, state truncated: {encoded.state_truncated})"
        except (ApiError, TooLarge) as error:
            outcome = f"{type(error).__name__}: {str(error)[:120]}"
        seconds = time.perf_counter() - begun
        done.set()
        sampler.join()
        result[name] = {"outcome": outcome, "seconds": round(seconds, 3), "peak_rss_growth_mib": mib(peak - baseline)}
    return result


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m reliability.costly_bodies", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="predictor base URL (loopback only)")
    parser.add_argument("--pid", type=int, default=None, help="the predictor's process id, for peak RSS")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=MODEL_NAME)
    parser.add_argument(
        "--direct", metavar="MODEL_DIR", default=None, help="measure in this process with this release's tokenizer"
    )
    parser.add_argument(
        "--max-model-len", type=int, default=16384, help="with --direct: the prompt length to encode for"
    )
    args = parser.parse_args(argv)
    if args.direct:
        print(json.dumps(measure_direct(args.direct, args.model, args.max_model_len), indent=2))
    else:
        print(json.dumps(asyncio.run(measure(args.url, args.pid, args.model, args.repeats)), indent=2))


if __name__ == "__main__":
    main()
