"""Local server processes for tests, benchmarks and the reliability scripts: a free port, start, poll, stop.

Standard library only, so every tool can use it whatever extras are installed.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any


class NotReady(RuntimeError):
    """The process exited, or did not become ready in time."""


def free_port() -> int:
    """A TCP port nobody listens on at 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_ok(url: str, timeout: float = 5.0) -> bool:
    """Whether ``GET url`` answers 200 now (False when nothing answers or another status does)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def listening(port: int) -> bool:
    """Whether something accepts TCP connections at 127.0.0.1:``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def wait_until_ready(
    process: subprocess.Popen[Any],
    ready: Callable[[], bool],
    timeout: float,
    *,
    interval: float = 0.2,
    what: str = "the server",
) -> float:
    """Call ``ready`` every ``interval`` seconds until it returns True; the seconds that took.

    Raises :class:`NotReady` when ``process`` exits first or ``timeout`` seconds pass.
    """
    started = time.monotonic()
    while True:
        if process.poll() is not None:
            raise NotReady(f"{what} exited with {process.returncode} before it was ready")
        if ready():
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise NotReady(f"{what} was not ready within {timeout:.0f} s")
        time.sleep(interval)


def stop_process(process: subprocess.Popen[Any], timeout: float = 60.0) -> int:
    """SIGTERM ``process`` (if it still runs), wait up to ``timeout`` seconds, then kill it; its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return int(process.returncode)


def start_and_wait(
    command: list[str],
    ready: Callable[[], bool],
    timeout: float,
    *,
    interval: float = 0.2,
    what: str = "the server",
    **popen: Any,
) -> subprocess.Popen[Any]:
    """Start ``command`` (``popen``: :class:`subprocess.Popen`'s keyword arguments) and return it once ``ready``.

    A process that exits first or is not ready in time is stopped, and :class:`NotReady` raised.
    """
    process = subprocess.Popen(command, **popen)
    try:
        wait_until_ready(process, ready, timeout, interval=interval, what=what)
    except BaseException:
        stop_process(process)
        raise
    return process
