"""A predictor started with ``--vision`` (transformers engine, tiny release with a random vision tower): the
TypeSafe SDK's ``Image`` in the state is answered byte for byte as the original release code answers the same
record on the same release, JSON ``assets``, ``images`` and ``videos`` too, and hostile images and videos are
refused with 4xx. Before the server is ready, its warm-up sends one small image through the engine."""

from __future__ import annotations

import base64
import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pydantic
import pytest
import torch
from PIL import Image

from reliability.image_files import image_file, png_bomb, truncated
from tests.predictor.conftest import MODEL_NAME, Predictor, start_predictor, stop, tiny_server_args

PHOTO = image_file(448, 448, seed=1)
SCAN = image_file(300, 200, file_format="JPEG", seed=2)
CLIP = [image_file(96, 64, seed=10 + index) for index in range(7)]
DASHCAM = [image_file(64, 64, file_format="JPEG", seed=30 + index) for index in range(3)]
Videos = list[tuple[list[bytes], float | None]]
"""Each video's frame files and its stated fps."""
QUESTIONS: dict[str, Any] = {
    "damaged": {"type": "noul", "instructions": "Is the parcel damaged?"},
    "kind": {"type": "choice", "criteria": {"box": "a cardboard box", "envelope": None, "tube": None}},
    "size": {"type": "score", "criteria": ["small", "medium", "large"]},
}
# JSON assets and images in one body, as the TypeSafe SDK sends them, and the state the release code reads for it.
ASSETS_BODY: dict[str, Any] = {
    "model": MODEL_NAME,
    "state": "Parcel <p> arrived; label attached.",
    "questions": QUESTIONS,
    "images": [f"data:image/jpeg;base64,{base64.b64encode(SCAN).decode()}"],
    "assets": {"<p>": {"type": "image", "format": "png", "data_base64": base64.b64encode(PHOTO).decode()}},
}
ASSETS_STATE = "Parcel [image 2] arrived; label attached."


@pytest.fixture(scope="module")
def server(toy_release: Path, tmp_path_factory: pytest.TempPathFactory, predictor_env: None) -> Iterator[Predictor]:
    running = start_predictor(
        tmp_path_factory.mktemp("predictor-vision"),
        *tiny_server_args(toy_release, max_model_len=4096),
        "--vision",
    )
    yield running
    assert stop(running) == 0, running.log()[-3000:]


@pytest.fixture(scope="module")
def original(toy_release: Path, reference: ModuleType) -> Any:
    """The original release code's model and processor on the same release (FP32, as the CPU engine runs)."""
    return reference.load_release_model(toy_release, device="cpu", dtype=torch.float32)


def _original_answer(
    original: Any, reference: ModuleType, state: Any, files: list[bytes], videos: Videos | None = None
) -> dict[str, Any]:
    model, processor = original
    images = [Image.open(io.BytesIO(data)) for data in files]
    request: dict[str, Any] = {"model": MODEL_NAME, "state": state, "questions": QUESTIONS, "images": images}
    if videos:
        # The original's processor takes a video as its RGB frames, and a clip's fps as its metadata.
        request["videos"] = [[Image.open(io.BytesIO(data)).convert("RGB") for data in frames] for frames, _ in videos]
        metadata = [{"total_num_frames": len(frames), "fps": fps} for frames, fps in videos]
        request["media_kwargs"] = {"video_metadata": metadata}
    return reference.systemone(model, processor, request)


def video_field(videos: Videos) -> list[dict[str, Any]]:
    """The request's ``videos``: each frame as bare base64, ``fps`` where stated."""
    return [
        {"frames": [base64.b64encode(data).decode() for data in frames], **({} if fps is None else {"fps": fps})}
        for frames, fps in videos
    ]


IMAGE_STEP = re.compile(r"warm-up image step: one 32 x 32 PNG \((\d+) of (\d+) prompt tokens\)")
"""The warm-up's log line for its image step: the image's tokens and the prompt's."""


def metric_total(server: Predictor, name: str) -> float | None:
    """The sum of the ``/metrics`` samples called ``name`` over all their labels, ``None`` when there are none."""
    lines = httpx.get(f"{server.url}/metrics", timeout=30).text.splitlines()
    values = [float(line.split()[-1]) for line in lines if line.startswith((name + " ", name + "{"))]
    return sum(values) if values else None


def assert_image_step_before_ready(server: Predictor) -> None:
    """The warm-up's image step ran, with an image's tokens in its prompt, before any readiness probe said 200, and
    its time is on ``/metrics``."""
    step = IMAGE_STEP.search(server.log_at_first_ready)
    assert step is not None, server.log_at_first_ready[-3000:]
    image_tokens, tokens = (int(group) for group in step.groups())
    assert 0 < image_tokens < tokens
    seconds = metric_total(server, "clef_warmup_image_seconds")
    assert seconds is not None and seconds > 0


def test_the_warm_up_sends_a_small_image_through_the_engine_before_ready(server: Predictor) -> None:
    assert_image_step_before_ready(server)


def _without_request_id(answer: dict[str, Any]) -> dict[str, Any]:
    usage = {key: value for key, value in answer["usage"].items() if key != "state_truncated"}
    return {"model": answer["model"], "answers": answer["answers"], "usage": usage}


def test_sdk_image_is_answered_as_the_original_answers(server: Predictor, original: Any, reference: ModuleType) -> None:
    import typesafe_sdk

    with typesafe_sdk.TypeSafeClient(
        base_url=f"{server.url}/jev", api_key="unused", model=MODEL_NAME, timeout=300
    ) as client:
        photo, scan = typesafe_sdk.Image(PHOTO), typesafe_sdk.Image(SCAN)
        response = client.system_one(
            {"photo": photo, "label": ["scanned label", scan]},
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
    assert response.usage.input_tokens == theirs["usage"]["input_tokens"]
    answers = pydantic.TypeAdapter(dict[str, typesafe_sdk.Answer])
    expected = answers.validate_json(json.dumps(theirs["answers"]))  # as the SDK reads a response
    assert answers.dump_python(response.answers, mode="json") == answers.dump_python(expected, mode="json")


def test_json_assets_and_images_are_answered_byte_for_byte(
    server: Predictor, original: Any, reference: ModuleType
) -> None:
    response = httpx.post(f"{server.url}/v1/systemone", json=ASSETS_BODY, timeout=300)
    assert response.status_code == 200, response.text
    theirs = _original_answer(original, reference, ASSETS_STATE, [SCAN, PHOTO])
    assert _without_request_id(response.json()) == theirs


def test_videos_and_images_are_answered_byte_for_byte(server: Predictor, original: Any, reference: ModuleType) -> None:
    videos: Videos = [(CLIP, 6.0), (DASHCAM, None)]
    body = {
        "model": MODEL_NAME,
        "state": "Parcel <p> arrived; the van's cameras recorded the delivery.",
        "questions": QUESTIONS,
        "videos": video_field(videos),
        "assets": {"<p>": {"type": "image", "format": "png", "data_base64": base64.b64encode(PHOTO).decode()}},
    }
    response = httpx.post(f"{server.url}/v1/systemone", json=body, timeout=300)
    assert response.status_code == 200, response.text
    state = "Parcel [image 1] arrived; the van's cameras recorded the delivery."
    assert _without_request_id(response.json()) == _original_answer(original, reference, state, [PHOTO], videos)


def test_videos_are_not_confused_by_the_cache(server: Predictor) -> None:
    """Same token ids, other frames or another fps: each is answered for its own video."""
    variants: list[Videos] = [[(CLIP[:4], None)], [(CLIP[3:7], None)], [(CLIP[:4], None)], [(CLIP[:4], 1000.0)]]
    answers = []
    for videos in variants:
        body = {"model": MODEL_NAME, "state": "x", "questions": QUESTIONS, "videos": video_field(videos)}
        answers.append(httpx.post(f"{server.url}/v1/systemone", json=body, timeout=300).json()["answers"])
    assert answers[0] == answers[2] and answers[0] != answers[1] and answers[0] != answers[3]


def test_two_images_of_one_size_are_not_confused_by_the_cache(server: Predictor) -> None:
    answers = []
    for seed in (5, 6, 5):
        body = {
            "model": MODEL_NAME,
            "state": "x",
            "questions": QUESTIONS,
            "images": [base64.b64encode(image_file(64, 64, seed=seed)).decode()],
        }
        answers.append(httpx.post(f"{server.url}/v1/systemone", json=body, timeout=300).json()["answers"])
    assert answers[0] == answers[2] and answers[0] != answers[1]


HOSTILE = [
    ("bomb", {"images": [base64.b64encode(png_bomb()).decode()]}, 422, "images[0]"),
    ("truncated", {"images": [base64.b64encode(truncated(image_file(300, 300))).decode()]}, 422, "images[0]"),
    ("too many", {"images": [base64.b64encode(image_file(8, 8)).decode()] * 17}, 422, "images"),
    ("unreferenced asset", {"assets": {"<q>": {"format": "png", "data_base64": "aGk="}}}, 422, "assets.<q>"),
    ("box", {"questions": {"where": {"type": "box"}}}, 422, "questions.where.type"),
    ("video bomb frame", {"videos": video_field([([CLIP[0], png_bomb()], None)])}, 422, "videos[0].frames[1]"),
    ("video of 65 frames", {"videos": video_field([([CLIP[0]] * 65, None)])}, 422, "videos[0].frames"),
    ("five videos", {"videos": video_field([(CLIP[:2], None)] * 5)}, 422, "videos"),
    ("empty video", {"videos": [{"frames": []}]}, 422, "videos[0].frames"),
    ("frames of two sizes", {"videos": video_field([([CLIP[0], DASHCAM[0]], None)])}, 422, "videos[0].frames[1]"),
]


@pytest.mark.parametrize(("case", "fields", "status", "param"), HOSTILE, ids=[case[0] for case in HOSTILE])
def test_hostile_images_are_refused_quickly(
    server: Predictor, case: str, fields: dict[str, Any], status: int, param: str
) -> None:
    body = {"model": MODEL_NAME, "state": "x", "questions": QUESTIONS, **fields}
    started = time.perf_counter()
    response = httpx.post(f"{server.url}/v1/systemone", json=body, timeout=300)
    assert time.perf_counter() - started < 0.5
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_multipart_parts_must_all_be_claimed(server: Predictor) -> None:
    files = {"asset-0": ("asset-0", PHOTO, "image/png"), "asset-1": ("asset-1", SCAN, "image/jpeg")}
    request = {"model": MODEL_NAME, "state": "<a>", "questions": QUESTIONS, "assets": {"<a>": {"part": "asset-0"}}}
    response = httpx.post(
        f"{server.url}/v1/systemone",
        files={"request": (None, json.dumps(request), "application/json"), **files},
        timeout=300,
    )
    assert response.status_code == 422 and response.json()["error"]["param"] == "assets"
    assert "'asset-1' of the body is claimed by no asset" in response.json()["error"]["message"]


def test_hostile_image_family_is_refused_and_the_server_unharmed(server: Predictor) -> None:
    from reliability.hostile_images import run

    result = run(server.url, MODEL_NAME, bound_s=0.5)
    assert result["valid_request_unharmed"]
    assert {name: case["status"] for name, case in result["cases"].items() if not case["ok"]} == {}
