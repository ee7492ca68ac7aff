"""A predictor on the vLLM engine started with ``--vision`` (CPU, tiny release with a random vision tower): JSON
``assets``, ``images`` and ``videos`` are answered as the original release code answers the same record, within
the tolerance used for vLLM against the reference (same choices, probabilities within 0.02), and the text-only
path still answers. Before it is ready, its warm-up has sent one small image through vLLM's multimodal path. Last, its
engine core (a process of its own, as served) is killed: the predictor ends with code 3 within 5 s."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import psutil
import pytest
import torch

from predictor.serving.lifecycle import ENGINE_DEAD_EXIT_CODE
from tests.plugin.conftest import LARGEST_TEST_MEDIA, TOLERANCE
from tests.predictor.conftest import MODEL_NAME, Predictor, simple_request, start_predictor, stop
from tests.predictor.test_server_vision import (
    ASSETS_BODY,
    ASSETS_STATE,
    CLIP,
    DASHCAM,
    IMAGE_STEP,
    PHOTO,
    QUESTIONS,
    SCAN,
    Videos,
    _original_answer,
    assert_image_step_before_ready,
    metric_total,
    video_field,
)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def server(toy_release: Path, tmp_path_factory: pytest.TempPathFactory, predictor_env: None) -> Iterator[Predictor]:
    running = start_predictor(
        tmp_path_factory.mktemp("predictor-vision-vllm"),
        "--model-dir",
        str(toy_release),
        "--engine",
        "vllm",
        "--vision",
        "--max-model-len",
        "4096",
        "--kv-cache-memory-bytes",
        "1G",
        "--limit-mm-per-prompt",
        json.dumps(LARGEST_TEST_MEDIA),
    )
    yield running
    if running.process.returncode is None:  # else the last test ended it, and checked how
        assert stop(running) == 0, running.log()[-3000:]


@pytest.fixture(scope="module")
def original(toy_release: Path, reference: ModuleType) -> Any:
    return reference.load_release_model(toy_release, device="cpu", dtype=torch.float32)


def _assert_close(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert ours["usage"]["input_tokens"] == theirs["usage"]["input_tokens"]
    assert ours["answers"].keys() == theirs["answers"].keys()
    for question_id, answer in ours["answers"].items():
        wanted = theirs["answers"][question_id]
        if answer["type"] == "noul":
            assert answer["noul"] == pytest.approx(wanted["noul"], abs=TOLERANCE)
            continue
        if answer["type"] == "choice":
            assert answer["choice"] == wanted["choice"]
        for option, probability in answer["probabilities"].items():
            assert probability == pytest.approx(wanted["probabilities"][option], abs=TOLERANCE)


TEXT_STEP = re.compile(r"warm-up \d+/\d+: batch (\d+) x (\d+) tokens")
"""The warm-up's log line for one of its text shapes: the prompts sent at once and each one's tokens."""


def test_the_warm_up_sends_a_small_image_through_vllms_multimodal_path_before_ready(
    server: Predictor, toy_release: Path
) -> None:
    """Runs first, before any client's request: vLLM counted the prompt tokens of every warm-up step, the image
    step's with its image's placeholder run expanded from the one pad the predictor sends (which only vLLM's
    multimodal processing does, from the image's grid). A startup probe's request answered 200 in the round when
    the probes turned ready (they then send one while any says 503) is counted too."""
    from transformers import AutoTokenizer

    from clef_head.encoder import encode_request
    from clef_head.request import parse_request

    assert_image_step_before_ready(server)
    log = server.log_at_first_ready
    step = IMAGE_STEP.search(log)
    assert step is not None
    image_tokens, image_prompt = (int(group) for group in step.groups())
    text_tokens = sum(int(batch) * int(tokens) for batch, tokens in TEXT_STEP.findall(log))
    assert text_tokens > 0
    probe_prompt = len(
        encode_request(AutoTokenizer.from_pretrained(toy_release), parse_request(simple_request()), 4096).input_ids
    )
    answered_probes = sum(1 for statuses in server.rounds if statuses.get("POST /v1/systemone") == 200)
    counted = metric_total(server, "vllm:prompt_tokens_total")
    assert counted == text_tokens + image_prompt + answered_probes * probe_prompt
    assert image_tokens > 1  # what vLLM expanded: the image's run, not the one pad sent


def test_json_assets_and_images_are_answered_as_the_original(
    server: Predictor, original: Any, reference: ModuleType
) -> None:
    response = httpx.post(f"{server.url}/v1/systemone", json=ASSETS_BODY, timeout=300)
    assert response.status_code == 200, response.text
    theirs = _original_answer(original, reference, ASSETS_STATE, [SCAN, PHOTO])
    _assert_close(response.json(), theirs)


def test_sdk_image_is_answered_as_the_original(server: Predictor, original: Any, reference: ModuleType) -> None:
    """The TypeSafe SDK's ``Image`` in the state (a multipart body), as the transformers engine's test sends it."""
    import typesafe_sdk

    with typesafe_sdk.TypeSafeClient(
        base_url=f"{server.url}/jev", api_key="unused", model=MODEL_NAME, timeout=300
    ) as client:
        response = client.system_one(
            {"photo": typesafe_sdk.Image(PHOTO), "label": ["scanned label", typesafe_sdk.Image(SCAN)]},
            {
                "damaged": typesafe_sdk.Noul(instructions="Is the parcel damaged?"),
                "kind": typesafe_sdk.Choice(criteria={"box": "a cardboard box", "envelope": None, "tube": None}),
                "size": typesafe_sdk.Score(criteria=["small", "medium", "large"]),
            },
        )
    # Keys render sorted: "label" (the scan) is image 1, "photo" image 2.
    theirs = _original_answer(
        original, reference, {"photo": "[image 2]", "label": ["scanned label", "[image 1]"]}, [SCAN, PHOTO]
    )
    _assert_close(response.model_dump(mode="json"), theirs)


def test_videos_and_images_are_answered_as_the_original(
    server: Predictor, original: Any, reference: ModuleType
) -> None:
    videos: Videos = [(CLIP, 6.0), (DASHCAM, None)]
    body = {
        "model": MODEL_NAME,
        "state": "Parcel arrived; the van's cameras recorded the delivery.",
        "questions": QUESTIONS,
        "images": [base64.b64encode(SCAN).decode()],
        "videos": video_field(videos),
    }
    response = httpx.post(f"{server.url}/v1/systemone", json=body, timeout=300)
    assert response.status_code == 200, response.text
    state = "Parcel arrived; the van's cameras recorded the delivery."
    _assert_close(response.json(), _original_answer(original, reference, state, [SCAN], videos))


def test_text_only_requests_still_answer(server: Predictor, original: Any, reference: ModuleType) -> None:
    body = {"model": MODEL_NAME, "state": "Parcel arrived; label attached.", "questions": QUESTIONS}
    response = httpx.post(f"{server.url}/v1/systemone", json=body, timeout=300)
    assert response.status_code == 200, response.text
    _assert_close(response.json(), _original_answer(original, reference, "Parcel arrived; label attached.", []))


def test_killing_the_engine_core_ends_the_process(server: Predictor) -> None:
    """Runs last: it ends the module's server."""
    family = psutil.Process(server.process.pid).children(recursive=True)
    try:
        (core,) = [
            child for child in family if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name()
        ]
        killed = time.monotonic()
        core.kill()
        code = server.process.wait(timeout=5)
        elapsed = time.monotonic() - killed
    finally:
        stop(server)
        for process in family:  # the engine core's own workers, orphaned by the kill
            if process.is_running():
                process.kill()
    assert code == ENGINE_DEAD_EXIT_CODE, server.log()[-3000:]
    assert elapsed < 5
    log = server.log()
    assert log.count("engine died:") == 1 and "exiting with code 3" in log
