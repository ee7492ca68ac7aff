"""HTTP edges a proxy in front turns into attacks: request smuggling (Content-Length + Transfer-Encoding), a
connection flood past ``--max-connections`` (probes must still answer), and the repository API's unload + load."""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.predictor.conftest import MODEL_NAME, Predictor, simple_request, start_predictor, stop, tiny_server_args

KEY = "edge-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
FLOOD = 1100  # connections, past the default --max-connections of 1,024
SERVER_SOFT_FILE_LIMIT = 1024  # a common default outside containers: the server must raise its own


@pytest.fixture(scope="module")
def server(toy_release: Path, tmp_path_factory: pytest.TempPathFactory, predictor_env: None) -> Iterator[Predictor]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < FLOOD + 1600:
        pytest.fail(f"the hard limit on open files ({hard}) is too low for a {FLOOD}-connection test")
    resource.setrlimit(resource.RLIMIT_NOFILE, (SERVER_SOFT_FILE_LIMIT, hard))  # inherited by the server
    try:
        running = start_predictor(
            tmp_path_factory.mktemp("predictor-edges"),
            *tiny_server_args(toy_release),
            "--enable-model-repository",
            "--shutdown-delay",
            "0",
            env={"CLEF_API_KEYS": KEY},
        )
    finally:
        resource.setrlimit(
            resource.RLIMIT_NOFILE,
            (max(soft, FLOOD + 512) if hard == resource.RLIM_INFINITY else min(max(soft, FLOOD + 512), hard), hard),
        )
    yield running
    assert stop(running) == 0, running.log()[-3000:]


def read_until_closed(sock: socket.socket, timeout: float = 30) -> bytes:
    """Everything the server sends until it closes the connection (fails if it keeps it open)."""
    sock.settimeout(timeout)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_content_length_with_transfer_encoding_is_refused_and_the_hidden_request_never_runs(server: Predictor) -> None:
    hidden = (
        f"POST /v2/repository/models/{MODEL_NAME}/unload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Length: 0\r\n\r\n"
    )
    body = "0\r\n\r\n" + hidden  # a proxy honouring Content-Length sends all of it as one body
    request = (
        "POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n{body}"
    )
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request.encode())
        received = read_until_closed(sock)
    assert received.startswith(b"HTTP/1.1 400 "), received[:200]
    assert received.count(b"HTTP/1.1 ") == 1, received  # the hidden request got no answer: it was not read
    assert b"Content-Length and Transfer-Encoding" in received
    assert httpx.get(f"{server.url}/v1/models/{MODEL_NAME}", timeout=30).status_code == 200, "the model was unloaded"


def test_probes_answer_past_the_connection_limit(server: Predictor) -> None:
    flood: list[socket.socket] = []
    try:
        for _ in range(FLOOD):  # slowloris: each connection sends part of a request line and waits
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(b"GET /health/live HTTP/1.1\r\n")
            flood.append(sock)
        with httpx.Client(base_url=server.url, timeout=30, headers=AUTH) as client:
            deadline = time.monotonic() + 60
            refused = client.post("/v1/systemone", json=simple_request())
            while refused.status_code != 429 and time.monotonic() < deadline:
                time.sleep(0.2)
                refused = client.post("/v1/systemone", json=simple_request())
            assert refused.status_code == 429, "the connection limit was never reached"
            probes = ("/health/live", f"/v1/models/{MODEL_NAME}", f"/v2/models/{MODEL_NAME}/ready", "/health")
            for path in (*probes, "/jev/health"):
                assert client.get(path).status_code == 200, path
    finally:
        for sock in flood:
            sock.close()
    assert "Too many open files" not in server.log()


def test_server_metadata_lists_the_repository_extension_when_it_is_enabled(server: Predictor) -> None:
    metadata = httpx.get(f"{server.url}/v2", headers=AUTH, timeout=30).json()
    assert metadata["extensions"] == ["model_repository_extension"], metadata


def test_repository_load_after_unload_restores_the_model(server: Predictor) -> None:
    with httpx.Client(base_url=server.url, timeout=60, headers=AUTH) as client:
        assert client.post(f"/v2/repository/models/{MODEL_NAME}/unload").json() == {"name": MODEL_NAME, "unload": True}
        assert client.get(f"/v1/models/{MODEL_NAME}").status_code == 503
        unloaded = client.post("/v1/systemone", json=simple_request())
        assert unloaded.status_code == 503 and "/load" in unloaded.json()["error"]["message"], unloaded.text
        assert client.get("/health/live").status_code == 200
        assert client.post(f"/v2/repository/models/{MODEL_NAME}/load").json() == {"name": MODEL_NAME, "load": True}
        assert client.get(f"/v1/models/{MODEL_NAME}").status_code == 200
        assert client.post("/v1/systemone", json=simple_request()).status_code == 200
        assert client.post(f"/v2/repository/models/{MODEL_NAME}/load").status_code == 200  # loading twice is fine
        missing = client.post("/v2/repository/models/not-served/load")
        assert missing.status_code == 404, missing.text
