"""Real predictor processes on 127.0.0.1 (random free ports), shared per test module (the vLLM one per session)."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from clef_tools.local_server import NotReady, free_port, stop_process, wait_until_ready

REPO = Path(__file__).resolve().parents[2]
MODEL_NAME = "clef-flash"
STARTUP_TIMEOUT_S = 600.0
PROBES = ("/health", "/v2/health/ready", f"/v1/models/{MODEL_NAME}", f"/v2/models/{MODEL_NAME}/ready")


@dataclass
class Predictor:
    """A running ``python -m predictor`` process and what was seen while it started."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    stdout_path: Path
    #: Status of each probe path (and of POST /v1/systemone), per polling round, until all probes said 200.
    rounds: list[dict[str, int]] = field(default_factory=list)
    #: The server's log right after the first 200 from any probe.
    log_at_first_ready: str = ""

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        """The server's log so far."""
        return self.log_path.read_text(errors="replace")

    def stdout(self) -> str:
        """The server's stdout so far (JSON request lines with --json-logs)."""
        return self.stdout_path.read_text(errors="replace")


def start_predictor(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Predictor:
    """Start ``python -m predictor``; return once it is ready, recording probe answers seen during warm-up."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "predictor",
        "--http_port",
        str(port),
        "--model-name",
        MODEL_NAME,
        *args,
    ]
    return start_server(tmp, command, port, env)


def tiny_server_args(release: Path | None, *, max_model_len: int = 512, max_batch: int = 4) -> list[str]:
    """``python -m predictor``'s arguments for a small test server on the transformers engine: ``release`` (None:
    the demo release), prompts up to ``max_model_len`` tokens, batches of at most ``max_batch``."""
    model_dir = [] if release is None else ["--model-dir", str(release)]
    return [
        *model_dir,
        "--engine",
        "transformers",
        "--max-model-len",
        str(max_model_len),
        "--max-batch",
        str(max_batch),
    ]


USER_ABSENT_ENV = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING")
"""Settings a user of the card's command does not have: vLLM sizes its own cache and spawns its engine core."""
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
"""What an air-gapped machine sets: nothing may be looked up on the hub."""


def start_server(
    tmp: Path, command: list[str], port: int, env: dict[str, str] | None = None, drop_env: tuple[str, ...] = ()
) -> Predictor:
    """Start a predictor ``command`` listening on ``port`` with ``env`` laid over this process's environment, less
    ``drop_env``; return once it is ready (as :func:`start_predictor`)."""
    log_path, stdout_path = tmp / "server.log", tmp / "server.out"
    inherited = {name: value for name, value in os.environ.items() if name not in drop_env}
    full_env = {**inherited, **(env or {})}
    with log_path.open("wb") as log_file, stdout_path.open("wb") as out_file:
        process = subprocess.Popen(command, cwd=REPO, stdout=out_file, stderr=log_file, env=full_env)
    server = Predictor(process=process, port=port, log_path=log_path, stdout_path=stdout_path)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        try:
            wait_until_ready(process, lambda: _probe_round(server, client), STARTUP_TIMEOUT_S, what="the predictor")
        except NotReady as exc:
            stop(server)
            raise RuntimeError(f"{exc}:\n{server.log()[-5000:]}") from None
    return server


def _probe_round(server: Predictor, client: httpx.Client) -> bool:
    """One round of probes (and a request while they do not all say 200), kept in ``server.rounds``."""
    try:
        statuses = {path: client.get(path).status_code for path in PROBES}
        if not all(status == 200 for status in statuses.values()):
            statuses["POST /v1/systemone"] = client.post("/v1/systemone", json=simple_request()).status_code
    except httpx.TransportError:
        return False
    if 200 in statuses.values() and not server.log_at_first_ready:
        server.log_at_first_ready = server.log()
    server.rounds.append(statuses)
    return all(status == 200 for status in statuses.values())


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """The TCP addresses process ``pid`` listens on, from /proc (IPv4 and IPv6; ``::`` is every interface)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            host_hex, port_hex = fields[1].split(":")
            raw = bytes.fromhex(host_hex)
            # /proc writes each 32-bit word of the address in host (little-endian) order
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            address = ipaddress.ip_address(words)
            mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is 127.0.0.1
            found.add((str(mapped or address), int(port_hex, 16)))
    return found


def encode_workers(server_pid: int) -> list[int]:
    """Process ids of the encode workers (spawned children) of process ``server_pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if parent == server_pid and b"spawn_main" in command:
            found.append(int(entry.name))
    return sorted(found)


def stop(server: Predictor, timeout: float = 60) -> int:
    """SIGTERM the server and wait for it to exit; return its exit code."""
    return stop_process(server.process, timeout)


def without_timing(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer less what differs between two servers' answers to one request (its id, timings)."""
    return {key: value for key, value in answer.items() if key not in ("id", "created", "usage", "timing")}


def simple_request(state: object = "I was charged twice for my subscription", model: str = MODEL_NAME) -> dict:
    """A small valid System One request with one question of each type."""
    return {
        "model": model,
        "state": state,
        "questions": {
            "urgent": {"type": "noul", "instructions": "Is this urgent?"},
            "topic": {"type": "choice", "criteria": {"billing": "money", "bug": None, "other": None}},
            "tone": {"type": "score", "criteria": ["calm", "annoyed", "angry"]},
        },
    }


def distinct_requests(count: int) -> list[dict]:
    """``count`` requests that differ in state and in question ids (a mixed-up answer cannot pass)."""
    bodies = []
    for i in range(count):
        body = simple_request(state={"ticket": f"customer {i} writes about case {i * 7}" + " again" * i})
        body["questions"] = {f"{key}_{i}": question for key, question in body["questions"].items()}
        bodies.append(body)
    return bodies


def assert_concurrent_answers_match_single(client: httpx.Client, atol: float = 2e-4) -> None:
    """64 concurrent requests (8 distinct bodies) all succeed, each equal to its body's single answer."""
    import asyncio

    bodies = distinct_requests(8)
    alone = [client.post("/v1/systemone", json=body).json() for body in bodies]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=client.base_url, timeout=600) as http:
            return await asyncio.gather(*(http.post("/v1/systemone", json=bodies[i % 8]) for i in range(64)))

    responses = asyncio.run(burst())
    assert [response.status_code for response in responses] == [200] * 64
    for index, response in enumerate(responses):
        assert_same_answer(response.json(), alone[index % 8], atol)


def assert_same_answer(actual: dict, expected: dict, atol: float = 2e-4) -> None:
    """Equal responses; numbers (rounded to 4 decimals) may differ by ``atol`` (batched vs single float sums)."""
    assert actual["model"] == expected["model"]
    assert actual["usage"] == expected["usage"]
    assert actual["answers"].keys() == expected["answers"].keys()
    for key, answer in expected["answers"].items():
        _close(actual["answers"][key], answer, atol, f"answers.{key}")


def _close(actual: object, expected: object, atol: float, where: str) -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), where
        for key in expected:
            _close(actual[key], expected[key], atol, f"{where}.{key}")
    elif isinstance(expected, float):
        assert isinstance(actual, (int, float)) and abs(actual - expected) <= atol, (where, actual, expected)
    else:
        assert actual == expected, (where, actual, expected)


@pytest.fixture(scope="session")
def vllm_server(
    toy_release: Path, tmp_path_factory: pytest.TempPathFactory, predictor_env: None
) -> Iterator[Predictor]:
    """One predictor on CPU vLLM (toy-vocabulary release, prompts up to 512 tokens) started the FP8 model card's
    way: the installed ``clef-systemone``, offline, in a user's environment (vLLM's engine core in its own process,
    the KV cache the predictor's default size, vLLM's cache folder empty). test_server_vllm.py and
    test_systemone_cli.py share it."""
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "clef-systemone"),
        "--model", str(toy_release), "--port", str(port), "--served-model-name", MODEL_NAME,
        "--max-model-len", "512", "--enable_grpc", "false",
    ]  # fmt: skip
    tmp = tmp_path_factory.mktemp("predictor-vllm")
    # A first start: vLLM's cache folder empty (not the run's shared one), so its model inspection runs offline too.
    env = {**OFFLINE_ENV, "VLLM_CACHE_ROOT": str(tmp / "vllm-cache")}
    running = start_server(tmp, command, port, env=env, drop_env=USER_ABSENT_ENV)
    yield running
    assert stop(running) == 0, running.log()[-3000:]


@pytest.fixture(scope="module")
def client(server: Predictor) -> Iterator[httpx.Client]:
    """HTTP client for the module's shared ``server`` (each server test module defines that fixture)."""
    with httpx.Client(base_url=server.url, timeout=300) as http:
        yield http
