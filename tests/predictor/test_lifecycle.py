"""The demo release (no --model-dir), --dp 2 on the CPU, and SIGTERM: readiness drops, new requests get 503,
in-flight requests finish."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.predictor.conftest import MODEL_NAME, Predictor, simple_request, start_predictor, stop, tiny_server_args


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory, predictor_env: None) -> Iterator[Predictor]:
    """The demo predictor (builds the random release into a fresh cache), two transformers engines."""
    tmp = tmp_path_factory.mktemp("predictor-demo")
    running = start_predictor(
        tmp,
        *tiny_server_args(None),
        "--dp",
        "2",
        "--demo-cache-dir",
        str(tmp / "cache"),
        "--drain-timeout",
        "120",
        "--shutdown-delay",
        "10",
    )
    yield running
    stop(running)


def test_demo_release_is_built_and_said_to_be_random(demo_server: Predictor) -> None:
    cache = Path(demo_server.log().split("building the tiny random demo release in ")[1].split(" ")[0])
    assert (cache / "RANDOM_WEIGHTS.txt").is_file()
    assert "RANDOM WEIGHTS" in demo_server.log()
    with httpx.Client(base_url=demo_server.url, timeout=300) as client:
        model, alias = client.get("/jev/v1/models").json()["models"]
        assert alias["name"] == "jev-latest"  # the TypeSafe SDK's default, always served
        assert model["name"] == MODEL_NAME and model["description"].startswith("RANDOM WEIGHTS")
        assert client.post("/v1/systemone", json=simple_request()).status_code == 200


def test_data_parallel_engines_share_the_load(demo_server: Predictor) -> None:
    def ask(index: int) -> int:
        return httpx.post(f"{demo_server.url}/v1/systemone", json=simple_request(index), timeout=600).status_code

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(ask, range(16)))
    assert statuses == [200] * 16
    metrics = httpx.get(f"{demo_server.url}/metrics").text
    for engine in ("transformers-0", "transformers-1"):
        line = next(
            line for line in metrics.splitlines() if line.startswith(f'clef_batch_size_count{{engine="{engine}"}}')
        )
        assert float(line.split()[-1]) > 0, engine


def _queued(server: Predictor) -> float:
    metrics = httpx.get(f"{server.url}/metrics").text
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("clef_queue_depth "))


def test_sigterm_drains_in_flight_requests(demo_server: Predictor) -> None:
    bodies = [simple_request(state={"ticket": "x " * (50 + i)}) for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(httpx.post, f"{demo_server.url}/v1/systemone", json=body, timeout=600) for body in bodies
        ]
        deadline = time.monotonic() + 60
        admitted = 0.0
        while admitted < 1 and time.monotonic() < deadline:
            admitted = _queued(demo_server)
        assert admitted >= 1, "no request was admitted"
        demo_server.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        # the shutdown delay: readiness fails (the endpoints go) while requests, in flight or new, are answered
        assert httpx.get(f"{demo_server.url}/v1/models/{MODEL_NAME}", timeout=30).status_code == 503
        assert httpx.get(f"{demo_server.url}/v2/health/ready", timeout=30).json() == {"ready": False}
        assert httpx.get(f"{demo_server.url}/health", timeout=30).json() == {"status": "draining"}
        assert httpx.get(f"{demo_server.url}/health/live", timeout=30).status_code == 200
        late = httpx.post(f"{demo_server.url}/v1/systemone", json=simple_request(), timeout=30)
        assert late.status_code == 200 and late.headers["connection"] == "close", late.text
        responses = [future.result() for future in futures]
    # every request, admitted before SIGTERM or sent during the delay, was answered
    assert all(response.status_code == 200 and json.loads(response.text)["answers"] for response in responses)
    assert demo_server.process.wait(120) == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{demo_server.url}/health", timeout=5)
