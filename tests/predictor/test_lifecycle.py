"""The demo release (no --model-dir), --dp 2 on the CPU, and SIGTERM draining in-flight requests."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.predictor.conftest import MODEL_NAME, Predictor, simple_request, start_predictor, stop


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory, predictor_env: None) -> Iterator[Predictor]:
    """The demo predictor (builds the random release into a fresh cache), two transformers engines."""
    tmp = tmp_path_factory.mktemp("predictor-demo")
    running = start_predictor(
        tmp,
        "--engine", "transformers",
        "--dp", "2",
        "--max-model-len", "512",
        "--max-batch", "4",
        "--demo-cache-dir", str(tmp / "cache"),
        "--drain-timeout", "120",
    )
    yield running
    stop(running)


def test_demo_release_is_built_and_said_to_be_random(demo_server: Predictor) -> None:
    cache = Path(demo_server.log().split("building the tiny random demo release in ")[1].split(" ")[0])
    assert (cache / "RANDOM_WEIGHTS.txt").is_file()
    assert "RANDOM WEIGHTS" in demo_server.log()
    with httpx.Client(base_url=demo_server.url, timeout=300) as client:
        (model,) = client.get("/jev/v1/models").json()["models"]
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
        line = next(line for line in metrics.splitlines() if line.startswith(f'clef_batch_size_count{{engine="{engine}"}}'))
        assert float(line.split()[-1]) > 0, engine


def _in_flight(server: Predictor) -> float:
    metrics = httpx.get(f"{server.url}/metrics").text
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("clef_engine_in_flight{"))


def test_sigterm_drains_in_flight_requests(demo_server: Predictor) -> None:
    bodies = [simple_request(state={"ticket": "x " * (50 + i)}) for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(httpx.post, f"{demo_server.url}/v1/systemone", json=body, timeout=600) for body in bodies]
        deadline = time.monotonic() + 60
        while _in_flight(demo_server) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _in_flight(demo_server) >= 1, "no request reached the engines"
        demo_server.process.send_signal(signal.SIGTERM)
        responses = [future.result() for future in futures]
    assert [response.status_code for response in responses] == [200] * 8
    assert all(json.loads(response.text)["answers"] for response in responses)
    assert demo_server.process.wait(120) == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{demo_server.url}/health", timeout=5)
