"""Lifecycle under load: start a predictor, load it, then SIGTERM it or kill its engine process.

    python -m reliability.lifecycle --event sigterm -- --model-dir DIR --engine transformers
    python -m reliability.lifecycle --event engine-kill -- --model-dir DIR --engine vllm

Everything after ``--`` is passed to ``python -m predictor`` (which listens on a free loopback port).
While ``--clients`` clients send valid requests, the event happens; the script records every answer's
status until the process exits, and how long the exit took. A request must never get a 500 (requests during the
shutdown delay are answered; 503 with ``Retry-After`` is the drain timeout's answer; a refused connection comes
after the socket closed). Exit
status 1 on a 500, an answer without status, or a process still alive after ``--exit-timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from clef_tools.local_server import NotReady, free_port, http_ok, wait_until_ready
from reliability.common import MODEL_NAME, valid_request


def engine_processes(pid: int, name: str) -> list[int]:
    """Descendants of ``pid`` whose command name contains ``name``."""
    found, pending = [], [pid]
    while pending:
        parent = pending.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
            for child in children:
                pending.append(child)
                try:
                    command = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    command += Path(f"/proc/{child}/comm").read_text()
                except OSError:
                    continue
                if name in command:
                    found.append(child)
    return found


async def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait for ``GET /health`` to say 200."""
    try:
        await asyncio.to_thread(
            wait_until_ready, process, lambda: http_ok(f"{url}/health"), timeout, interval=0.5, what="the predictor"
        )
    except NotReady as exc:
        raise SystemExit(str(exc)) from None


async def run(
    event: str,
    predictor_args: list[str],
    clients: int,
    load_seconds: float,
    exit_timeout: float,
    engine_name: str,
    startup_timeout: float,
    log_path: Path,
) -> dict[str, Any]:
    """Start, load, trigger ``event``, and record what the clients saw."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "predictor", "--http_port", str(port), "--enable_grpc", "false", *predictor_args]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    statuses: Counter[str] = Counter()
    missing_retry_after = 0
    try:
        await wait_ready(url, process, startup_timeout)

        async def client_loop(index: int, http: httpx.AsyncClient) -> None:
            nonlocal missing_retry_after
            sent = 0
            while process.poll() is None:
                sent += 1
                try:
                    response = await http.post("/v1/systemone", json=valid_request(index * 31 + sent), timeout=120)
                except httpx.ConnectError:
                    statuses["refused"] += 1
                    await asyncio.sleep(0.1)
                    continue
                except httpx.HTTPError as exc:
                    statuses[type(exc).__name__] += 1
                    continue
                statuses[str(response.status_code)] += 1
                if response.status_code == 503 and "retry-after" not in response.headers:
                    missing_retry_after += 1

        async def trigger() -> float:
            await asyncio.sleep(load_seconds)
            if event == "sigterm":
                process.send_signal(signal.SIGTERM)
            else:
                targets = engine_processes(process.pid, engine_name)
                if not targets:
                    raise SystemExit(f"no child process named like {engine_name!r}: is the engine in-process?")
                for target in targets:
                    os.kill(target, signal.SIGKILL)
            triggered = time.monotonic()
            while process.poll() is None and time.monotonic() - triggered < exit_timeout:
                await asyncio.sleep(0.05)
            return time.monotonic() - triggered

        async with httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=clients)) as http:
            loops = [asyncio.create_task(client_loop(index, http)) for index in range(clients)]
            exit_seconds = await trigger()
            if process.poll() is None:
                process.kill()
            await asyncio.gather(*loops)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    server_errors = sum(count for status, count in statuses.items() if status.startswith("5") and status != "503")
    return {
        "event": event,
        "exit_seconds": round(exit_seconds, 2),
        "exit_code": process.returncode,
        "statuses": dict(statuses),
        "503_without_retry_after": missing_retry_after,
        "ok": server_errors == 0 and exit_seconds < exit_timeout and "RemoteProtocolError" not in statuses,
    }


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m reliability.lifecycle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--event", choices=("sigterm", "engine-kill"), required=True)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--load-seconds", type=float, default=5, help="load before the event")
    parser.add_argument("--exit-timeout", type=float, default=60, help="the process must exit within this")
    parser.add_argument("--engine-process-name", default="EngineCore", help="engine-kill: the child process to kill")
    parser.add_argument("--startup-timeout", type=float, default=900)
    parser.add_argument(
        "--log", type=Path, default=Path(tempfile.gettempdir()) / "lifecycle-predictor.log", help="the predictor's log"
    )
    parser.add_argument("predictor_args", nargs=argparse.REMAINDER, help="after --: arguments of python -m predictor")
    args = parser.parse_args(argv)
    predictor_args = [arg for arg in args.predictor_args if arg != "--"] or ["--model-name", MODEL_NAME]
    result = asyncio.run(
        run(
            args.event,
            predictor_args,
            args.clients,
            args.load_seconds,
            args.exit_timeout,
            args.engine_process_name,
            args.startup_timeout,
            args.log,
        )
    )
    print(json.dumps(result, indent=2))
    raise SystemExit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
