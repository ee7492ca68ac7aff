"""clef_tools.local_server: the free port, start-and-poll and stop helpers the tests, benchmarks and scripts share."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clef_tools.local_server import NotReady, free_port, http_ok, listening, start_and_wait, stop_process

SERVE = (
    "import http.server, sys, time; time.sleep(float(sys.argv[2])); "
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()"
)


def test_a_server_is_returned_once_ready_and_stopped() -> None:
    port = free_port()
    assert not listening(port) and not http_ok(f"http://127.0.0.1:{port}/")
    started = time.monotonic()
    url = f"http://127.0.0.1:{port}/"
    server = start_and_wait(
        [sys.executable, "-c", SERVE, str(port), "0.5"],
        lambda: http_ok(url),
        timeout=60,
        interval=0.1,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert time.monotonic() - started >= 0.5 and listening(port) and server.poll() is None
    assert stop_process(server) == -15 and not listening(port)


def test_a_process_that_exits_first_is_reported() -> None:
    with pytest.raises(NotReady, match="the tool exited with 3 before it was ready"):
        start_and_wait([sys.executable, "-c", "raise SystemExit(3)"], lambda: False, timeout=60, what="the tool")


def test_a_process_never_ready_is_stopped_after_the_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    with pytest.raises(NotReady, match="was not ready within 5 s"):
        start_and_wait([sys.executable, "-c", script], lambda: False, timeout=5, interval=0.1)
    with pytest.raises(ProcessLookupError):  # stopped and reaped
        os.kill(int(pid_file.read_text()), 0)
