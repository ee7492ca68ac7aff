"""Keep-alive clients across a SIGTERM: every answer after it carries ``Connection: close`` and the server closes the
connection, so a client's next request opens a new one (refused once the server stops listening) instead of being
sent on a connection the server then drops (a reset, which the client cannot tell from a lost request)."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import httpx

from tests.predictor.conftest import Predictor, simple_request, start_predictor, stop, tiny_server_args

DELAY_S = 6


def exchange(sock: socket.socket, path: str, body: bytes) -> tuple[int, dict[str, str]]:
    """Send one HTTP/1.1 request on ``sock`` (kept alive: no ``Connection`` header) and read its answer."""
    request = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(request + body)
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection without an answer: {received!r}"
        received += chunk
    head, rest = received.split(b"\r\n\r\n", 1)
    status_line, *lines = head.decode().split("\r\n")
    headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
    while len(rest) < int(headers["content-length"]):
        rest += sock.recv(65536)
    return int(status_line.split()[1]), headers


def wait_until_draining(server: Predictor) -> None:
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code != 503:
        assert time.monotonic() < deadline, "readiness did not fail after SIGTERM"
        time.sleep(0.05)


def test_answers_after_sigterm_close_keep_alive_connections(
    toy_release: Path, tmp_path: Path, predictor_env: None
) -> None:
    server = start_predictor(
        tmp_path,
        *tiny_server_args(toy_release),
        "--shutdown-delay",
        str(DELAY_S),
        "--drain-timeout",
        "2",
    )
    body = json.dumps(simple_request()).encode()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            status, headers = exchange(sock, "/v1/systemone", body)
            assert status == 200 and "connection" not in headers, headers  # kept alive
            signalled = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            wait_until_draining(server)
            status, headers = exchange(sock, "/v1/systemone", body)
            assert status == 200 and headers.get("connection") == "close", headers  # answered, then closed
            assert sock.recv(65536) == b"", "the server kept the connection open after Connection: close"
        answers = []
        with httpx.Client(base_url=server.url, timeout=30) as client:  # one pooled keep-alive connection at a time
            while time.monotonic() < signalled + DELAY_S - 2:
                response = client.post("/v1/systemone", content=body, headers={"content-type": "application/json"})
                answers.append((response.status_code, response.headers.get("connection")))
        assert answers and set(answers) == {(200, "close")}, answers
        assert server.process.wait(60) == 0, server.log()[-3000:]
    finally:
        stop(server)
