"""What a lone request costs outside the predictor's own timer, request by request, on a text server and on a
``--vision`` server, through ``bench.load``'s client and ``bench.vision_http``'s (BENCHMARKS.md, R45).

    python -m bench.request_overhead --out overhead.json [--release DIR --records WORK/records.json] \\
        [--engine vllm] [--starts 3] [--requests 200] [--images 20] [--image-size 1024x768] -- [predictor arguments]

Each start runs one predictor of each kind in ``--servers`` (``text``, ``vision``; their order alternates from start
to start), with ``--json-logs``: the predictor then logs, per request, the latency its request observer timed (from
the first call of its ASGI application to the end of the response). Every request carries its own ``x-request-id``,
so each client's latency is set beside the server's for the same request; the difference (``overhead_ms``) is what
the client, the connection and the HTTP server cost around the application. A ``--vision`` server first answers
``--images`` requests of one image each, as in ``bench.vision_http``, whose text phase follows its images.

Both kinds get the same text bodies in the same order (``--records``' bodies, else ``bench.load``'s representative
request), one at a time: first ``--warmup`` bodies, then ``--requests``, for each client in ``--clients``; each
client's bodies carry a mark of their own, so the answer cache serves none. Arguments after ``--`` go to every
``python -m predictor``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.gpu_benchmark.timing import percentiles
from bench.load import bench_request
from bench.vision_http import MODEL_NAME, parse_size, png_data_url, timed_post
from clef_tools.local_server import NotReady, free_port, http_ok, start_and_wait, stop_process

SERVERS = ("text", "vision")
CLIENTS = ("aiohttp", "vision")
"""``aiohttp``: ``bench.load``'s client (one ``aiohttp.ClientSession``); ``vision``: ``bench.vision_http``'s
(:func:`bench.vision_http.timed_post` on one blocking ``httpx.Client``)."""

Timed = list[tuple[str, float]]
"""(request id, client's milliseconds) per request, in the order sent."""


def marked(body: dict[str, Any], mark: str) -> dict[str, Any]:
    """``body`` with ``mark`` at the start of its state (a text state) or as its first field (a structured one)."""
    state = body["state"]
    return {**body, "state": f"{mark} {state}" if isinstance(state, str) else {"mark": mark, **state}}


def body_source(records: list[dict[str, Any]] | None) -> Callable[[str, int], dict[str, Any]]:
    """``(mark, index) -> body``: record ``index`` (cycled), else ``bench.load``'s request ``index``, marked."""
    if records:
        return lambda mark, index: marked(records[index % len(records)], f"#{mark}{index}")
    return lambda mark, index: marked(bench_request(index, MODEL_NAME), f"#{mark}{index}")


def server_latencies(log: str) -> dict[str, float]:
    """The predictor's ``--json-logs`` request lines in ``log``: request id -> the server's milliseconds."""
    latencies = {}
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and "latency_ms" in entry and "id" in entry:
            latencies[str(entry["id"])] = float(entry["latency_ms"])
    return latencies


def overhead(timed: Timed, server: dict[str, float]) -> dict[str, Any]:
    """The client's, the server's and their difference's figures over ``timed``; every request must be logged."""
    missing = [request_id for request_id, _ in timed if request_id not in server]
    if missing:
        raise RuntimeError(f"{len(missing)} of {len(timed)} requests are not in the predictor's log, e.g. {missing[0]}")
    return {
        "requests": len(timed),
        "client_ms": percentiles([ms for _, ms in timed]),
        "server_ms": percentiles([server[request_id] for request_id, _ in timed]),
        "overhead_ms": percentiles([ms - server[request_id] for request_id, ms in timed]),
    }


async def aiohttp_requests(url: str, bodies: list[tuple[str, dict[str, Any]]]) -> Timed:
    """``bench.load``'s client (one session), one request at a time."""
    import aiohttp

    timed = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for request_id, body in bodies:
            started = time.perf_counter()
            async with session.post(f"{url}/v1/systemone", json=body, headers={"x-request-id": request_id}) as response:
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:500]}")
                await response.json()
            timed.append((request_id, 1000 * (time.perf_counter() - started)))
    return timed


def vision_requests(url: str, bodies: list[tuple[str, dict[str, Any]]]) -> Timed:
    """``bench.vision_http``'s client (one blocking ``httpx.Client``, the body encoded before the clock)."""
    import httpx

    with httpx.Client(timeout=600) as client:
        return [(request_id, timed_post(client, url, body, request_id)[0]) for request_id, body in bodies]


def send(client: str, url: str, bodies: list[tuple[str, dict[str, Any]]]) -> Timed:
    """``bodies`` (request id, body) one at a time through ``client``."""
    return asyncio.run(aiohttp_requests(url, bodies)) if client == "aiohttp" else vision_requests(url, bodies)


def run_server(
    args: argparse.Namespace, body: Callable[[str, int], dict[str, Any]], kind: str, start: int, log_path: Path
) -> dict[str, Any]:
    """One predictor of ``kind``: ready, its images (a vision server), then each client's text bodies (``body``:
    :func:`body_source`'s)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "predictor", "--model-name", MODEL_NAME, "--engine", args.engine]
    command += ["--http_port", str(port), "--json-logs"]
    if args.release:
        command += ["--model-dir", args.release]
    if kind == "vision":
        command.append("--vision")
    command += args.predictor_args
    result: dict[str, Any] = {"server": kind, "start": start, "command": " ".join(command)}
    with log_path.open("w") as log_file:
        started = time.perf_counter()
        try:
            server = start_and_wait(
                command,
                lambda: http_ok(f"{url}/v1/models/{MODEL_NAME}"),
                args.ready_timeout,
                interval=0.5,
                what="the predictor",
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        except NotReady as exc:
            raise SystemExit(f"{exc}; see {log_path}") from None
        try:
            result["ready_s"] = round(time.perf_counter() - started, 1)
            if kind == "vision" and args.images:
                width, height = args.image_size
                images = [
                    (f"s{start}-image-{n}", {**body("i", n), "images": [png_data_url(width, height, 1000 * start + n)]})
                    for n in range(args.images)
                ]
                send("vision", url, images)
            timed: dict[str, Timed] = {}
            for client in args.clients:
                mark = client[0]
                bodies = [(f"s{start}-{kind}-{client}-{n}", body(mark, n)) for n in range(args.warmup + args.requests)]
                timed[client] = send(client, url, bodies)[args.warmup :]
        finally:
            stop_process(server)
    logged = server_latencies(log_path.read_text())
    result["clients"] = {client: overhead(client_timed, logged) for client, client_timed in timed.items()}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.request_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="result JSON (the predictors' logs beside it)")
    parser.add_argument("--release", help="the release folder (default: the predictor's demo release)")
    parser.add_argument("--records", type=Path, help="records.json of bench.gpu_benchmark's prepare (the bodies)")
    parser.add_argument("--engine", default="vllm", help="the predictor's --engine")
    parser.add_argument("--servers", type=lambda text: text.split(","), default=list(SERVERS), help="text,vision")
    parser.add_argument("--clients", type=lambda text: text.split(","), default=list(CLIENTS), help="aiohttp,vision")
    parser.add_argument("--starts", type=int, default=1, help="starts of each server kind")
    parser.add_argument("--requests", type=int, default=200, help="timed requests per client and start")
    parser.add_argument("--warmup", type=int, default=8, help="requests per client before the timed ones")
    parser.add_argument("--images", type=int, default=20, help="image requests a --vision server answers first")
    parser.add_argument("--image-size", type=parse_size, default=(1024, 768), help="WIDTHxHEIGHT")
    parser.add_argument("--ready-timeout", type=float, default=420.0)
    parser.add_argument("predictor_args", nargs="*", help="more predictor arguments (after --)")
    args = parser.parse_args(argv)
    if set(args.servers) - set(SERVERS) or set(args.clients) - set(CLIENTS):
        parser.error(f"--servers takes {','.join(SERVERS)}; --clients takes {','.join(CLIENTS)}")
    if args.starts < 1 or args.requests < 1 or args.warmup < 0 or args.images < 0:
        parser.error("--starts and --requests must be at least 1, --warmup and --images at least 0")
    body = body_source(json.loads(args.records.read_text()) if args.records else None)
    runs = []
    for start in range(args.starts):
        for kind in args.servers if start % 2 == 0 else reversed(args.servers):
            log_path = args.out.with_name(f"{args.out.stem}-{kind}-{start}.log")
            runs.append(run_server(args, body, kind, start, log_path))
            figures = {client: figures["overhead_ms"] for client, figures in runs[-1]["clients"].items()}
            print(json.dumps({"server": kind, "start": start, "overhead_ms": figures}), flush=True)
            args.out.write_text(json.dumps({"runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
