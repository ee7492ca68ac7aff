"""``--encode-processes``: bodies read, validated and encoded in worker processes answer exactly as in the
serving process, errors included; a killed worker costs at most the requests it held (503 + Retry-After)."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from clef_tools.sample_requests import make_requests
from predictor.core.errors import (
    BadInput,
    EngineFailed,
    ModelNotServed,
    ServiceError,
    TooLarge,
    Unavailable,
    Unreadable,
)
from predictor.http.api_args import SDK_DEFAULT_MODEL, encode_processes, resolve_encode_processes
from predictor.http.errors import from_service_error
from predictor.serving.encode_pool import auto_encode_processes
from tests.predictor.conftest import (
    MODEL_NAME,
    Predictor,
    distinct_requests,
    encode_workers,
    simple_request,
    start_predictor,
    stop,
    tiny_server_args,
)

if TYPE_CHECKING:
    from predictor.engines.base import Engine
    from predictor.serving.service import SystemOneService

MAX_MODEL_LEN = 512
PROCESSES = 2

BAD_BODIES: dict[str, bytes] = {
    "malformed json": b'{"model": ',
    "missing questions": json.dumps({"model": MODEL_NAME, "state": 1}).encode(),
    "bad field": json.dumps(
        {**simple_request(), "questions": {"q": {"type": "choice", "criteria": {"a": None}}}}
    ).encode(),
    "unknown model": json.dumps(simple_request(model="gpt-9")).encode(),
    "state too long": json.dumps(simple_request(state="9" * 40000)).encode(),
}


@pytest.mark.parametrize(
    "gpus, cpus, expected", [(0, 2, 0), (0, 64, 0), (1, 2, 0), (1, 4, 1), (1, 8, 2), (8, 16, 4), (8, 128, 4)]
)
def test_auto_rule(gpus: int, cpus: int, expected: int) -> None:
    assert auto_encode_processes(gpus, cpus) == expected


def test_flag_values() -> None:
    assert encode_processes("auto") == "auto" and encode_processes("0") == 0 and encode_processes("3") == 3
    for bad in ("-1", "two", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            encode_processes(bad)
    assert resolve_encode_processes(3, gpu_count=0) == 3
    assert resolve_encode_processes("auto", gpu_count=0) == 0


@pytest.mark.parametrize(
    "error",
    [
        BadInput("bad", ("questions", "q", "criteria"), "too_short"),
        ModelNotServed("model 'x' is not served here", ("model",)),
        TooLarge("the state needs 900 tokens", ("[2]", "state")),
        Unavailable("an encode worker died", "encoder_died", 1),
        EngineFailed("boom"),
        Unreadable("not JSON", ("assets",)),
    ],
)
def test_errors_cross_processes_unchanged(error: ServiceError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error) and copy.__dict__ == error.__dict__
    http, original = from_service_error(copy), from_service_error(error)
    assert (http.status, http.body(), http.headers) == (original.status, original.body(), original.headers)


@pytest.mark.parametrize("release", ["tiny_release", "toy_release"])
def test_workers_tokenize_as_the_engine(release: str, request: pytest.FixtureRequest) -> None:
    """Qwen3.5's vocabulary, and the toy one the engine and server tests run on (its ``tokenizer.json`` must run
    Qwen3.5's text pipeline, which transformers rebuilds around any Qwen3.5 release's vocabulary)."""
    from transformers import AutoTokenizer

    from clef_head.encoder import SchemaTooLong, encode_request
    from clef_head.request import parse_request
    from clef_tools.sample_requests import make_extreme_requests
    from predictor.serving.prepare import ReleaseTokenizer

    release_dir: Path = request.getfixturevalue(release)
    engine_tokenizer, worker_tokenizer = AutoTokenizer.from_pretrained(str(release_dir)), ReleaseTokenizer(release_dir)
    import random

    bodies = [*make_requests(16, 24), *make_extreme_requests(random.Random(16))]

    def encoded(tokenizer: Any, parsed: Any, max_length: int) -> Any:
        try:
            return encode_request(tokenizer, parsed, max_length)
        except SchemaTooLong as exc:
            return exc.required

    for body in bodies:
        parsed = parse_request(body)
        for max_length in (MAX_MODEL_LEN, 1 << 20):  # cut states too
            assert encoded(worker_tokenizer, parsed, max_length) == encoded(engine_tokenizer, parsed, max_length)


def test_the_workers_module_imports_no_engine_code() -> None:
    """An encode worker imports :mod:`predictor.serving.prepare` and holds no torch, transformers or vLLM."""
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, predictor.serving.prepare; "
            "print(sorted({'torch', 'transformers', 'vllm'} & set(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert imported.stdout.strip() == "[]", "an encode worker's module imports heavy engine code"


def test_a_job_past_its_deadline_ends_its_worker_and_the_pool_recovers(toy_release: Path) -> None:
    """A hung worker is handled as a dead one: its request gets 503 ``encoder_died``, new workers answer."""
    from transformers import AutoTokenizer

    from clef_head.request import DEFAULT_LIMITS
    from predictor.serving.encode_pool import EncodePool
    from predictor.serving.prepare import PrepareSettings
    from predictor.serving.request_policy import RequestPolicy
    from tests.predictor.slow_jobs import sleep_for

    pool = EncodePool(toy_release, 1, AutoTokenizer.from_pretrained(str(toy_release)), job_deadline_s=2)

    async def scenario() -> None:
        await pool.start(PrepareSettings(MODEL_NAME, DEFAULT_LIMITS, RequestPolicy(), MAX_MODEL_LEN))
        assert await pool.run(sleep_for, 0.5) == 0.5  # within the deadline: answered
        started = time.monotonic()
        with pytest.raises(Unavailable) as hung:
            await pool.run(sleep_for, 120)
        assert hung.value.reason == "encoder_died" and time.monotonic() - started < 60
        assert await pool.run(sleep_for, 0.1) == 0.1  # a new worker

    try:
        asyncio.run(scenario())
    finally:
        pool.close()


def test_workers_of_a_vision_server_load_the_processors_before_ready(toy_release: Path) -> None:
    """With ``--vision`` every worker has read the probe's image and video when the pool has started, so no
    client's first image pays for loading the release's processors."""
    from transformers import AutoTokenizer

    from clef_head.request import DEFAULT_LIMITS
    from predictor.serving.encode_pool import EncodePool
    from predictor.serving.prepare import PrepareSettings, VisionSettings
    from predictor.serving.request_policy import RequestPolicy
    from tests.predictor.slow_jobs import loaded_processors

    pool = EncodePool(toy_release, PROCESSES, AutoTokenizer.from_pretrained(str(toy_release)))
    vision = VisionSettings(str(toy_release))

    async def scenario() -> set[tuple[int, bool, bool]]:
        await pool.start(PrepareSettings(MODEL_NAME, DEFAULT_LIMITS, RequestPolicy(), MAX_MODEL_LEN, vision))
        jobs = [pool.run(loaded_processors, str(toy_release), 0.5) for _ in range(2 * PROCESSES)]
        return set(await asyncio.gather(*jobs))

    try:
        seen = asyncio.run(scenario())
    finally:
        pool.close()
    assert len({pid for pid, _, _ in seen}) == PROCESSES
    assert all(image and video for _, image, video in seen), seen


def bodies_to_compare() -> dict[str, bytes]:
    """Varied valid bodies (answers) and bad ones (errors), by name."""
    valid = {f"sample {index}": json.dumps(body).encode() for index, body in enumerate(make_requests(14, 10))}
    return {**valid, "simple": json.dumps(simple_request()).encode(), **BAD_BODIES}


def http_result(error: ServiceError) -> tuple[int, dict[str, Any]]:
    failure = from_service_error(error)
    return int(failure.status), json.loads(json.dumps(failure.body()))


def server_like_service(toy_release: Path) -> tuple[Engine, SystemOneService]:
    """A serving service in this process with the server's engine settings and names, preparing bodies in a thread of
    this process (``--encode-processes 0``); the engine is started by the caller."""
    import torch

    from predictor.engines.transformers import TransformersEngine
    from predictor.serving.lifecycle import Lifecycle, Phase
    from predictor.serving.request_policy import RequestPolicy
    from predictor.serving.service import ModelCard, SystemOneService

    engine = TransformersEngine(toy_release, max_length=MAX_MODEL_LEN, device="cpu", dtype=torch.float32, max_batch=8)
    lifecycle = Lifecycle(MODEL_NAME)
    lifecycle.enter(Phase.OK)
    service = SystemOneService(engine, ModelCard(MODEL_NAME, "test", "1970-01-01"), lifecycle)
    service.policy = RequestPolicy(aliases=(SDK_DEFAULT_MODEL,), state_overflow="refuse")  # the server's names
    return engine, service


async def answered(service: SystemOneService, raw: bytes) -> tuple[int, Any]:
    """Status and JSON body of ``service``'s answer to the raw JSON body ``raw``, as the server would send them."""
    try:
        return 200, json.loads(json.dumps(await service.answer_json(raw, "application/json")))
    except ServiceError as error:
        return http_result(error)


@pytest.fixture(scope="module")
def in_process(toy_release: Path) -> dict[str, tuple[int, Any]]:
    """Status and JSON body of each body of :func:`bodies_to_compare`, answered by a service in this process
    (``--encode-processes 0``: the same engine settings as the server's), one at a time."""
    engine, service = server_like_service(toy_release)

    async def answer_all() -> dict[str, tuple[int, Any]]:
        await engine.start()
        results = {name: await answered(service, raw) for name, raw in bodies_to_compare().items()}
        batch = [
            json.loads(bodies_to_compare()[name])
            for name in ("simple", "missing questions", "sample 0", "unknown model")
        ]
        items = await service.answer_batch_json(json.dumps(batch).encode(), "application/json", 64)
        results["batch"] = (
            200,
            [
                item if isinstance(item, dict) else {"status": http_result(item)[0], **http_result(item)[1]}
                for item in items
            ],
        )
        return results

    try:
        return asyncio.run(answer_all())
    finally:
        engine.close()


@pytest.fixture(scope="module")
def server(toy_release: Path, tmp_path_factory: pytest.TempPathFactory, predictor_env: None) -> Iterator[Predictor]:
    running = start_predictor(
        tmp_path_factory.mktemp("predictor-encode-processes"),
        *tiny_server_args(toy_release, max_model_len=MAX_MODEL_LEN, max_batch=8),
        "--state-overflow",
        "refuse",
        "--encode-processes",
        str(PROCESSES),
        "--inline-encode-max-bytes",
        "0",  # every body through the workers, lone ones too: what this module compares with the service in process
    )
    yield running
    workers = encode_workers(running.process.pid)
    assert stop(running) == 0, running.log()[-3000:]
    deadline = time.monotonic() + 30
    while workers and time.monotonic() < deadline:
        workers = [pid for pid in workers if Path(f"/proc/{pid}").exists()]
        time.sleep(0.2)
    assert not workers, f"encode workers {workers} outlived the server"


@pytest.fixture(scope="module")
def client(server: Predictor) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=300) as http:
        yield http


def test_workers_start_before_ready(server: Predictor) -> None:
    assert f"{PROCESSES} encode worker process(es) started" in server.log_at_first_ready
    assert len(encode_workers(server.process.pid)) == PROCESSES


def test_answers_and_errors_match_the_in_process_service(
    client: httpx.Client, in_process: dict[str, tuple[int, Any]]
) -> None:
    for name, raw in bodies_to_compare().items():
        for base in ("", "/jev"):
            response = client.post(f"{base}/v1/systemone", content=raw, headers={"content-type": "application/json"})
            assert (response.status_code, response.json()) == in_process[name], name
    expected_status = {
        "malformed json": 400,
        "missing questions": 422,
        "bad field": 422,
        "unknown model": 404,
        "state too long": 413,
    }
    for name, status in expected_status.items():
        assert in_process[name][0] == status, (name, in_process[name])
    assert in_process["state too long"][1]["detail"][0]["loc"] == ["body", "state"]
    compressed = client.post(
        "/v1/systemone",
        content=gzip.compress(bodies_to_compare()["sample 3"]),
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert (compressed.status_code, compressed.json()) == in_process["sample 3"]
    prepared = {
        line.split('"')[1]: float(line.split()[-1])
        for line in client.get("/metrics").text.splitlines()
        if line.startswith("clef_encode_bodies_total{")
    }
    assert prepared.get("serving", 0.0) == 0.0 and prepared["worker"] >= len(bodies_to_compare())


def test_batch_and_kserve_routes(client: httpx.Client, in_process: dict[str, tuple[int, Any]]) -> None:
    names = ("simple", "missing questions", "sample 0", "unknown model")
    batch = [json.loads(bodies_to_compare()[name]) for name in names]
    response = client.post("/v1/systemone/batch", json=batch)
    assert (response.status_code, response.json()) == in_process["batch"]
    assert response.json()[1]["detail"][0]["loc"] == ["body", 1, "questions"]
    predicted = client.post(f"/v1/models/{MODEL_NAME}:predict", json={"instances": [batch[0], batch[2]]})
    assert predicted.status_code == 200, predicted.text
    assert predicted.json()["predictions"] == [in_process["simple"][1], in_process["sample 0"][1]]
    refused = client.post(f"/v1/models/{MODEL_NAME}:predict", json={"instances": batch[:2]})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "instances", 1, "questions"]


def test_a_killed_worker_costs_only_its_requests(server: Predictor, client: httpx.Client) -> None:
    before = encode_workers(server.process.pid)
    assert len(before) == PROCESSES
    bodies = [json.dumps(body).encode() for body in distinct_requests(16)]

    def post(raw: bytes) -> httpx.Response:
        return client.post("/v1/systemone", content=raw, headers={"content-type": "application/json"})

    with ThreadPoolExecutor(8) as threads:
        in_flight = [threads.submit(post, raw) for raw in bodies]
        time.sleep(0.05)
        os.kill(before[0], signal.SIGKILL)
        responses = [future.result() for future in in_flight]
    for response in responses:
        assert response.status_code in (200, 503), response.text
        if response.status_code == 503:
            assert response.headers["retry-after"] == "1" and "encode worker" in response.json()["error"]["message"]
    assert server.process.poll() is None
    later = post(bodies[0])  # waits for the new workers to start
    assert later.status_code == 200, later.text
    after = encode_workers(server.process.pid)
    assert len(after) == PROCESSES and before[0] not in after
    assert "an encode worker process died" in server.log()


def test_a_worker_killed_while_idle_costs_no_request(server: Predictor, client: httpx.Client) -> None:
    before = encode_workers(server.process.pid)
    os.kill(before[-1], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{before[-1]}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)  # the pool notices the death
    response = client.post("/v1/systemone", json=simple_request(state="after an idle worker died"))
    assert response.status_code == 200, response.text
    assert len(encode_workers(server.process.pid)) == PROCESSES


def test_encode_stage_is_observed_per_record(client: httpx.Client) -> None:
    def encode_count() -> float:
        metrics = client.get("/metrics").text
        lines = [line for line in metrics.splitlines() if line.startswith('clef_stage_seconds_count{stage="encode"}')]
        return float(lines[0].split()[-1]) if lines else 0.0  # no line before the first observation

    before = encode_count()
    assert client.post("/v1/systemone", json=simple_request(state="counted once")).status_code == 200
    assert (
        client.post("/v1/systemone/batch", json=[simple_request(state=f"batch {i}") for i in range(3)]).status_code
        == 200
    )
    assert encode_count() == before + 4


def bodies_prepared() -> dict[str, float]:
    """``clef_encode_bodies_total`` of this process, by where the bodies were prepared."""
    from prometheus_client import REGISTRY

    return {
        where: REGISTRY.get_sample_value("clef_encode_bodies_total", {"where": where}) or 0.0
        for where in ("serving", "worker")
    }


def prepared_since(before: dict[str, float]) -> dict[str, float]:
    """How many bodies were prepared where since :func:`bodies_prepared` read ``before``."""
    return {where: count - before[where] for where, count in bodies_prepared().items()}


def test_a_lone_small_body_skips_the_workers_and_is_answered_the_same(
    toy_release: Path, in_process: dict[str, tuple[int, Any]]
) -> None:
    """With workers, a small body that comes while nothing else is prepared or answered is prepared in the serving
    process with the engine's tokenizer (its hop to a worker costs a lone request more than its encoding); a body
    that comes while another is being prepared, a body over ``--inline-encode-max-bytes`` and parsed bodies (the
    KServe routes) go to the workers. Answers and errors are the same either way."""
    from predictor.serving.encode_pool import DEFAULT_INLINE_ENCODE_MAX_BYTES, EncodePool

    engine, service = server_like_service(toy_release)
    service.preparer = pool = EncodePool(toy_release, 1, engine.tokenizer)
    assert service.inline_encode_max_bytes == DEFAULT_INLINE_ENCODE_MAX_BYTES
    raw = bodies_to_compare()

    async def scenario() -> None:
        await engine.start()
        await pool.start(service.settings)
        for lone in ("sample 0", "bad field", "state too long"):
            before = bodies_prepared()
            assert await answered(service, raw[lone]) == in_process[lone], lone
            assert prepared_since(before) == {"serving": 1.0, "worker": 0.0}, lone
        before = bodies_prepared()
        together = await asyncio.gather(answered(service, raw["sample 1"]), answered(service, raw["sample 2"]))
        assert list(together) == [in_process["sample 1"], in_process["sample 2"]]
        assert prepared_since(before) == {"serving": 1.0, "worker": 1.0}  # the second came while the first was
        service.inline_encode_max_bytes = len(raw["sample 3"]) - 1
        before = bodies_prepared()
        assert await answered(service, raw["sample 3"]) == in_process["sample 3"]
        assert prepared_since(before) == {"serving": 0.0, "worker": 1.0}
        service.inline_encode_max_bytes = DEFAULT_INLINE_ENCODE_MAX_BYTES
        before = bodies_prepared()
        [parsed] = await service.answer_many([json.loads(raw["simple"])], [""])
        assert json.loads(json.dumps(parsed)) == in_process["simple"][1]
        assert prepared_since(before) == {"serving": 0.0, "worker": 1.0}

    try:
        asyncio.run(scenario())
    finally:
        pool.close()
        engine.close()


def test_a_vision_servers_lone_small_body_is_prepared_in_the_serving_process_unless_it_holds_media(
    toy_release: Path,
) -> None:
    """On a ``--vision`` server with workers, a lone small text body is prepared in the serving process; a lone
    small body with an image (a small body can hold a large image) is prepared by a worker. Answers are
    those of the same service preparing every body in a thread of this process."""
    import torch

    from predictor.engines.transformers import TransformersEngine
    from predictor.serving.encode_pool import EncodePool, probe_image
    from predictor.serving.lifecycle import Lifecycle, Phase
    from predictor.serving.prepare import VisionSettings
    from predictor.serving.service import ModelCard, SystemOneService

    engine = TransformersEngine(
        toy_release, max_length=MAX_MODEL_LEN, device="cpu", dtype=torch.float32, max_batch=8, vision=True
    )
    lifecycle = Lifecycle(MODEL_NAME)
    lifecycle.enter(Phase.OK)
    vision = VisionSettings(str(toy_release))
    card = ModelCard(MODEL_NAME, "test", "1970-01-01")
    in_thread = SystemOneService(engine, card, lifecycle, vision=vision)
    with_workers = SystemOneService(engine, card, lifecycle, vision=vision)
    with_workers.preparer = pool = EncodePool(toy_release, 1, engine.tokenizer)
    text = json.dumps(simple_request()).encode()
    image = json.dumps({**simple_request(), "images": [probe_image(40)]}).encode()

    async def scenario() -> None:
        await engine.start()
        await pool.start(with_workers.settings)
        for raw, where in ((text, "serving"), (image, "worker")):
            expected = await answered(in_thread, raw)
            assert expected[0] == 200, expected
            before = bodies_prepared()
            assert await answered(with_workers, raw) == expected
            assert prepared_since(before) == {"serving": 0.0, "worker": 0.0, where: 1.0}

    try:
        asyncio.run(scenario())
    finally:
        pool.close()
        engine.close()


def test_a_vision_service_makes_pixels_in_its_engines_dtype(toy_release: Path) -> None:
    import torch

    from predictor.serving.lifecycle import Lifecycle
    from predictor.serving.prepare import VisionSettings
    from predictor.serving.service import ModelCard, SystemOneService

    class Engine:
        tokenizer = None
        capacity = 1
        max_length = MAX_MODEL_LEN
        pixel_dtype: torch.dtype | None = torch.bfloat16

    def service(vision: VisionSettings | None) -> SystemOneService:
        return SystemOneService(
            Engine(),  # type: ignore[arg-type]
            ModelCard(MODEL_NAME, "test", "1970-01-01"),
            Lifecycle(MODEL_NAME),
            vision=vision,
        )

    vision = VisionSettings(str(toy_release))
    made = service(vision).settings.vision
    assert made is not None and made.pixel_dtype == "bfloat16" and made.release_dir == str(toy_release)
    assert service(None).settings.vision is None  # a text server reads no pixels
    Engine.pixel_dtype = None  # an engine that keeps the processors' float32
    kept = service(vision).settings.vision
    assert kept is not None and kept.pixel_dtype is None


def test_which_bodies_are_prepared_in_the_serving_process(toy_release: Path) -> None:
    from predictor.serving.lifecycle import Lifecycle
    from predictor.serving.prepare import VisionSettings
    from predictor.serving.service import ModelCard, SystemOneService

    class Engine:
        tokenizer = None
        capacity = 1
        max_length = MAX_MODEL_LEN
        pixel_dtype = None

    service = SystemOneService(
        Engine(),  # type: ignore[arg-type]
        ModelCard(MODEL_NAME, "test", "1970-01-01"),
        Lifecycle(MODEL_NAME),
        inline_encode_max_bytes=100,
    )
    assert service.prepares_in_process(100) and service.prepares_in_process(0)
    assert not service.prepares_in_process(101)  # larger
    assert not service.prepares_in_process(None)  # parsed bodies (size unknown)
    service.preparing = 1
    assert not service.prepares_in_process(10)  # another body is being prepared
    service.preparing, service.queued = 0, 1
    assert not service.prepares_in_process(10)  # a record is being answered
    service.queued, service.vision = 0, VisionSettings(str(toy_release))
    assert service.prepares_in_process(10)  # a vision server's too: its images and videos, if any, go to a worker
    assert service.settings_in_process.vision == VisionSettings(str(toy_release), media_here=False)
    service.vision, service.inline_encode_max_bytes = None, 0
    assert not service.prepares_in_process(0)
    with pytest.raises(ValueError, match="inline_encode_max_bytes"):
        SystemOneService(
            Engine(),  # type: ignore[arg-type]
            ModelCard(MODEL_NAME, "test", "1970-01-01"),
            Lifecycle(MODEL_NAME),
            inline_encode_max_bytes=-1,
        )
