"""How fast can the load client go? ``bench.load``'s HTTP client against a server that costs nothing.

    python -m bench.load_client_ceiling [--clients 8,64,256] [--requests 2000] [--rate 100] [--client aiohttp,httpx]
    python -m bench.load_client_ceiling --clients 1 --client aiohttp,vision

A load generator is part of what a latency figure measures. This starts a minimal HTTP/1.1 server in a
child process (asyncio streams, keep-alive, a fixed small JSON answer) and loads it twice per client count:
- ``instant``: every request answered at once: the client's own ceiling in requests/s;
- ``rate``: requests answered in arrival order at ``--rate`` per second, like a server whose engine is the
  bottleneck: an ideal client measures ``--rate`` requests/s and a latency of clients ÷ rate for every
  request (Little's law), so the client's own share shows as lost throughput and a spread-out tail.
``aiohttp`` is the client ``bench.load.http_load`` uses; ``httpx`` (one ``AsyncClient``, one connection
per client) is there for comparison; ``vision`` is ``bench.vision_http``'s client (one blocking ``httpx.Client``,
one client only), so that its latencies can be set beside ``bench.load``'s. All send the same body.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.load import Results, http_load, run_load
from clef_tools.local_server import free_port, listening, start_and_wait

BODY = {"model": "clef-flash", "state": {"ticket": "x" * 1500}, "questions": {"q": {"type": "noul"}}}
ANSWER = json.dumps({"usage": {"input_tokens": 512}, "answers": {}}).encode()
RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER)


async def serve(port: int, rate: float) -> None:
    """Answer every request on ``port``: at once (``rate`` 0) or in arrival order, ``rate`` per second."""
    pending: asyncio.Queue[asyncio.Future[None]] = asyncio.Queue()

    async def release() -> None:
        due = time.perf_counter()
        while True:
            waiter = await pending.get()
            due = max(due + 1 / rate, time.perf_counter())
            await asyncio.sleep(due - time.perf_counter())
            waiter.set_result(None)

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                if rate:
                    waiter = asyncio.get_running_loop().create_future()
                    pending.put_nowait(waiter)
                    await waiter
                writer.write(RESPONSE)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    if rate:
        asyncio.get_running_loop().create_task(release())
    server = await asyncio.start_server(connection, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


async def httpx_load(
    url: str, clients: int, requests: int, warmup: int, body: Callable[[int], dict[str, Any]]
) -> Results:
    """The same load through one ``httpx.AsyncClient`` (the comparison)."""
    import httpx

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def call(index: int) -> int:
            response = await client.post("/v1/systemone", json=body(index))
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}")
            return int(response.json()["usage"]["input_tokens"])

        await run_load(call, clients, warmup)
        return await run_load(call, clients, requests)


async def vision_client_load(
    url: str, clients: int, requests: int, warmup: int, body: Callable[[int], dict[str, Any]]
) -> Results:
    """The same requests through ``bench.vision_http``'s client (:func:`bench.vision_http.timed_post` on one
    blocking ``httpx.Client``), one at a time; it reads answers, not token counts (``tokens`` stays 0)."""
    import httpx

    from bench.vision_http import timed_post

    if clients != 1:
        raise ValueError("the vision benchmark's client sends one request at a time")
    results = Results()
    with httpx.Client(timeout=600) as client:
        for index in range(warmup):
            timed_post(client, url, body(index))
        started = time.perf_counter()
        for index in range(requests):
            elapsed_ms, _answers = timed_post(client, url, body(index))
            results.latencies.append(elapsed_ms / 1000)
        results.seconds = time.perf_counter() - started
    return results


CLIENTS = {"aiohttp": http_load, "httpx": httpx_load, "vision": vision_client_load}


def started_server(rate: float) -> tuple[subprocess.Popen[bytes], str]:
    """The server in a child process (its own interpreter: the client's process measures only the client)."""
    port = free_port()
    child = start_and_wait(
        [sys.executable, "-m", "bench.load_client_ceiling", "--serve", str(port), "--rate", str(rate)],
        lambda: listening(port),
        30,
        interval=0.1,
        what="the test server",
    )
    return child, f"http://127.0.0.1:{port}"


def main(argv: list[str] | None = None) -> int:
    """Command line: one line of figures per server, client library and client count."""
    parser = argparse.ArgumentParser(prog="python -m bench.load_client_ceiling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=lambda text: [int(v) for v in text.split(",")], default=[8, 64, 256])
    parser.add_argument("--requests", type=int, default=2000, help="requests per load")
    parser.add_argument("--rate", type=float, default=100.0, help="answers per second of the 'rate' server")
    parser.add_argument(
        "--client", type=lambda text: text.split(","), default=["aiohttp", "httpx"], help="aiohttp,httpx,vision"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per load")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        asyncio.run(serve(args.serve, args.rate))
        return 0
    unknown = sorted(set(args.client) - set(CLIENTS))
    if unknown or args.rate <= 0:
        parser.error(f"--client takes {', '.join(CLIENTS)}; --rate must be positive")
    if "vision" in args.client and args.clients != [1]:
        parser.error("--client vision sends one request at a time: it needs --clients 1")
    for server, rate in (("instant", 0.0), ("rate", args.rate)):
        child, url = started_server(rate)
        try:
            for name in args.client:
                for clients in args.clients:
                    load = CLIENTS[name](url, clients, args.requests, clients, lambda _index: BODY)
                    summary = {"server": server, "client": name, "clients": clients, **asyncio.run(load).summary()}
                    if server == "rate":
                        summary["ideal"] = {
                            "requests_per_s": args.rate,
                            "latency_ms": round(1000 * clients / args.rate, 1),
                        }
                    if args.json:
                        print(json.dumps(summary), flush=True)
                    else:
                        ideal = (
                            f"  (ideal: {args.rate:g} req/s, {1000 * clients / args.rate:.0f} ms)"
                            if server == "rate"
                            else ""
                        )
                        print(
                            f"{server:7} {name:7} clients={clients:4d} errors={summary['errors']} "
                            f"req/s={summary['requests_per_s']:>8} p50={summary['latency_ms_p50']}ms "
                            f"p95={summary['latency_ms_p95']}ms p99={summary['latency_ms_p99']}ms{ideal}",
                            flush=True,
                        )
        finally:
            child.terminate()
            child.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
