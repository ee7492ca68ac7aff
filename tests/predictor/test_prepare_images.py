"""Images and videos prepared where bodies are prepared: the encode workers' tokenizer (no transformers
tokenizer) gives the same prompt and tensors as the engine's; multipart bodies as the TypeSafe SDK writes them,
and malformed ones."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from clef_head.encoder import EncodedRequest
from clef_head.request import DEFAULT_LIMITS
from predictor.core.errors import BadInput, Unreadable
from predictor.serving import prepare
from predictor.serving.multipart_body import read_multipart
from predictor.serving.prepare import PrepareSettings, ReleaseTokenizer, VisionSettings
from predictor.serving.request_policy import RequestPolicy
from reliability.image_files import image_file

PHOTO = image_file(200, 120, seed=3)
REQUEST = {
    "model": "clef-flash",
    "state": {"photo": "<p>"},
    "questions": {"q": {"type": "noul", "instructions": "Is it blue?"}},
    "assets": {"<p>": {"type": "image", "part": "asset-0"}},
}


def _part(boundary: str, name: str, content_type: str, data: bytes) -> bytes:
    disposition = f'form-data; name="{name}"' + ("" if name == "request" else f'; filename="{name}"')
    head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\nContent-Type: {content_type}\r\n\r\n"
    return head.encode() + data + b"\r\n"


def _multipart(request: dict, parts: dict[str, bytes], boundary: str = "b0undary") -> tuple[bytes, str]:
    """A body laid out as the TypeSafe SDK lays it out: the JSON ``request`` part first, then each image."""
    chunks = [_part(boundary, "request", "application/json", json.dumps(request).encode())]
    chunks += [_part(boundary, name, "image/png", data) for name, data in parts.items()]
    chunks.append(f"--{boundary}--\r\n".encode())
    return b"".join(chunks), f"multipart/form-data; boundary={boundary}"


def test_worker_tokenizer_prepares_images_as_the_engine_tokenizer(tiny_release: Path) -> None:
    from transformers import AutoTokenizer

    settings = PrepareSettings("clef-flash", DEFAULT_LIMITS, RequestPolicy(), 2048, VisionSettings(str(tiny_release)))
    raw, content_type = _multipart(REQUEST, {"asset-0": PHOTO})
    engine = prepare.prepare_json(AutoTokenizer.from_pretrained(tiny_release), settings, raw, content_type)[1]
    worker = prepare.prepare_json(ReleaseTokenizer(tiny_release), settings, raw, content_type)[1]
    assert engine.input_ids == worker.input_ids and engine.layout == worker.layout
    assert engine.media is not None and worker.media is not None
    assert torch.equal(engine.media.pixel_values, worker.media.pixel_values)
    assert engine.media.digest == worker.media.digest and engine.media_offset == worker.media_offset


def test_worker_tokenizer_prepares_videos_as_the_engine_tokenizer(tiny_release: Path) -> None:
    """The frame pairs' times (``<0.3 seconds>``) are tokenized by the worker's tokenizer as by the engine's."""
    from transformers import AutoTokenizer

    settings = PrepareSettings("clef-flash", DEFAULT_LIMITS, RequestPolicy(), 4096, VisionSettings(str(tiny_release)))
    frames = [base64.b64encode(image_file(64, 48, seed=index)).decode() for index in range(40)]
    body = {**REQUEST, "state": "x", "assets": None, "videos": [{"frames": frames, "fps": 7.0}, {"frames": frames[:3]}]}
    engine = prepare.prepare(AutoTokenizer.from_pretrained(tiny_release), settings, body)[1]
    worker = prepare.prepare(ReleaseTokenizer(tiny_release), settings, body)[1]
    assert engine.input_ids == worker.input_ids and engine.layout == worker.layout
    assert engine.media is not None and worker.media is not None
    assert engine.media.video_timestamps == worker.media.video_timestamps and len(engine.media.video_timestamps[0]) > 4
    assert torch.equal(engine.media.pixel_values_videos, worker.media.pixel_values_videos)
    assert engine.media.digest == worker.media.digest


def _in_each_pixel_dtype(tokenizer: Any, release: Path, body: dict[str, Any]) -> tuple[EncodedRequest, EncodedRequest]:
    """``body`` prepared with the processors' float32 pixels, then with bfloat16 ones."""
    float32, bfloat16 = (
        prepare.prepare(
            tokenizer,
            PrepareSettings(
                "clef-flash", DEFAULT_LIMITS, RequestPolicy(), 4096, VisionSettings(str(release), pixel_dtype=dtype)
            ),
            body,
        )[1]
        for dtype in (None, "bfloat16")
    )
    return float32, bfloat16


def test_pixels_are_made_in_the_engines_dtype(tiny_release: Path) -> None:
    """With the engine's vision tower in bfloat16 (``VisionSettings.pixel_dtype``), image and video pixels are the
    processors' float32 values cast to it, nothing else changed."""
    tokenizer = ReleaseTokenizer(tiny_release)
    frames = [base64.b64encode(image_file(64, 48, seed=index)).decode() for index in range(4)]
    photo = base64.b64encode(PHOTO).decode()
    body = {**REQUEST, "state": "x", "assets": None, "images": [photo], "videos": [{"frames": frames}]}
    float32, bfloat16 = _in_each_pixel_dtype(tokenizer, tiny_release, body)
    assert float32.media is not None and bfloat16.media is not None
    assert float32.input_ids == bfloat16.input_ids and float32.media.digest == bfloat16.media.digest
    for made, kept in (
        (bfloat16.media.pixel_values, float32.media.pixel_values),
        (bfloat16.media.pixel_values_videos, float32.media.pixel_values_videos),
    ):
        assert made is not None and kept is not None and kept.dtype == torch.float32
        assert made.dtype == torch.bfloat16 and torch.equal(made, kept.to(torch.bfloat16))


def test_an_engine_without_videos_refuses_them_at_their_field(tiny_release: Path) -> None:
    vision = VisionSettings(str(tiny_release), videos=False)
    settings = PrepareSettings("clef-flash", DEFAULT_LIMITS, RequestPolicy(), 2048, vision)
    frames = [base64.b64encode(image_file(32, 32)).decode()] * 2
    with pytest.raises(BadInput) as caught:
        prepare.prepare(
            ReleaseTokenizer(tiny_release), settings, {**REQUEST, "assets": None, "videos": [{"frames": frames}]}
        )
    assert caught.value.loc == ("videos",) and "transformers engine reads videos" in caught.value.message
    image = {**REQUEST, "assets": {"<p>": {"format": "png", "data_base64": base64.b64encode(PHOTO).decode()}}}
    assert prepare.prepare(ReleaseTokenizer(tiny_release), settings, image)[1].media is not None


def test_text_only_settings_refuse_images_at_their_field(tiny_release: Path) -> None:
    settings = PrepareSettings("clef-flash", DEFAULT_LIMITS, RequestPolicy(), 2048)
    body = {**REQUEST, "assets": {"<p>": {"format": "png", "data_base64": base64.b64encode(PHOTO).decode()}}}
    with pytest.raises(BadInput) as caught:
        prepare.prepare(ReleaseTokenizer(tiny_release), settings, body)
    assert caught.value.loc == ("assets",) and "started without --vision" in caught.value.message
    with pytest.raises(BadInput) as caught:
        prepare.prepare(
            ReleaseTokenizer(tiny_release), settings, {**REQUEST, "assets": None, "videos": [{"frames": []}]}
        )
    assert caught.value.loc == ("videos",) and "started without --vision" in caught.value.message
    raw, content_type = _multipart(REQUEST, {"asset-0": PHOTO})
    with pytest.raises(Unreadable) as unreadable:
        prepare.prepare_json(ReleaseTokenizer(tiny_release), settings, raw, content_type)
    assert unreadable.value.loc == ("assets",)


def test_a_preparation_that_leaves_media_elsewhere_stops_at_the_first_image_video_or_part(tiny_release: Path) -> None:
    """``media_here=False`` (a vision server's lone small body in its serving process): a text-only body is prepared
    as with the media read; a body with an image, a video or multipart parts raises :class:`MediaElsewhere` once
    validated (a batch too, for one such item), so an encode worker prepares it; an invalid one gets its error."""
    tokenizer = ReleaseTokenizer(tiny_release)
    here = PrepareSettings("clef-flash", DEFAULT_LIMITS, RequestPolicy(), 2048, VisionSettings(str(tiny_release)))
    elsewhere = PrepareSettings(
        "clef-flash", DEFAULT_LIMITS, RequestPolicy(), 2048, VisionSettings(str(tiny_release), media_here=False)
    )
    text = json.dumps({**REQUEST, "state": {"note": "no picture"}, "assets": None}).encode()
    assert prepare.prepare_json(tokenizer, elsewhere, text, "application/json") == prepare.prepare_json(
        tokenizer, here, text, "application/json"
    )
    image = {**REQUEST, "assets": {"<p>": {"format": "png", "data_base64": base64.b64encode(PHOTO).decode()}}}
    frames = [base64.b64encode(image_file(32, 32)).decode()] * 2
    video = {**REQUEST, "assets": None, "videos": [{"frames": frames}]}
    multipart = _multipart(REQUEST, {"asset-0": PHOTO})
    for raw, content_type in [
        (json.dumps(image).encode(), "application/json"),
        (json.dumps(video).encode(), "application/json"),
        multipart,
    ]:
        with pytest.raises(prepare.MediaElsewhere):
            prepare.prepare_json(tokenizer, elsewhere, raw, content_type)
    batch = json.dumps([json.loads(text), image]).encode()
    with pytest.raises(prepare.MediaElsewhere):
        prepare.prepare_batch_json(tokenizer, elsewhere, batch, "application/json", 64)
    with pytest.raises(BadInput) as caught:
        prepare.prepare(tokenizer, elsewhere, {**image, "questions": {}})
    assert caught.value.loc == ("questions",)


def test_multipart_as_written_by_the_sdk() -> None:
    raw, content_type = _multipart(REQUEST, {"asset-0": PHOTO, "asset-1": b"\r\n--not a boundary\r\n"})
    body = read_multipart(raw, content_type, max_parts=4)
    assert json.loads(body.request) == REQUEST
    assert body.parts == {"asset-0": PHOTO, "asset-1": b"\r\n--not a boundary\r\n"}


@pytest.mark.parametrize(
    ("raw", "content_type", "rule"),
    [
        (b"--b\r\n", "multipart/form-data; boundary=b", "no opening or closing boundary"),
        (b"x", "multipart/form-data", "no boundary"),
        (b"--b\r\nno headers\r\n--b--\r\n", "multipart/form-data; boundary=b", "no headers"),
        (b"--b\r\nContent-Type: x\r\n\r\ny\r\n--b--\r\n", "multipart/form-data; boundary=b", "no Content-Disposition"),
        (_multipart({}, {})[0], "multipart/mixed; boundary=b0undary", "must be multipart/form-data"),
        (
            b'--b\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n--b--\r\n',
            "multipart/form-data; boundary=b",
            "no part named 'request'",
        ),
    ],
)
def test_malformed_multipart_is_unreadable(raw: bytes, content_type: str, rule: str) -> None:
    with pytest.raises(Unreadable, match=rule):
        read_multipart(raw, content_type, max_parts=4)


def test_thousands_of_parts_are_refused_before_they_are_split() -> None:
    raw, content_type = _multipart(REQUEST, {f"asset-{i}": b"\x89PNG" for i in range(5000)})
    with pytest.raises(BadInput) as caught:
        read_multipart(raw, content_type, max_parts=16)
    assert caught.value.loc == ("assets",) and "at most 16 images" in caught.value.message


def test_an_encode_worker_process_prepares_images(tiny_release: Path) -> None:
    """A multipart body prepared in a worker process: the prompt and tensors (in a bfloat16 engine's dtype) come back
    equal to the engine's."""
    import asyncio

    from transformers import AutoTokenizer

    from predictor.serving.encode_pool import EncodePool

    tokenizer = AutoTokenizer.from_pretrained(tiny_release)
    vision = VisionSettings(str(tiny_release), pixel_dtype="bfloat16")
    settings = PrepareSettings("clef-flash", DEFAULT_LIMITS, RequestPolicy(), 2048, vision)
    raw, content_type = _multipart(REQUEST, {"asset-0": PHOTO})
    pool = EncodePool(tiny_release, 1, tokenizer)

    async def scenario() -> Any:
        await pool.start(settings)
        return await pool.run(prepare.prepare_json, settings, raw, content_type)

    try:
        request, encoded = asyncio.run(scenario())
    finally:
        pool.close()
    expected = prepare.prepare_json(tokenizer, settings, raw, content_type)[1]
    assert request.state == {"photo": "[image 1]"} and encoded.input_ids == expected.input_ids
    assert encoded.media is not None and expected.media is not None
    assert torch.equal(encoded.media.pixel_values, expected.media.pixel_values)
    assert encoded.media.pixel_values.dtype == torch.bfloat16


def test_the_transformers_engine_answers_pixels_in_its_dtype_to_the_bit(tiny_release: Path) -> None:
    """A bfloat16 transformers engine's vision tower casts its pixels to bfloat16 first: pixels made in that dtype
    (its ``pixel_dtype``) are answered exactly as float32 ones."""
    from predictor.engines.reference import TransformersScorer

    scorer = TransformersScorer(tiny_release, dtype=torch.bfloat16, max_length=2048, vision=True)
    assert scorer.pixel_dtype == torch.bfloat16
    photo = base64.b64encode(PHOTO).decode()
    body = {**REQUEST, "state": "x", "assets": None, "images": [photo]}
    float32, bfloat16 = scorer.score(list(_in_each_pixel_dtype(scorer.tokenizer, tiny_release, body)))
    assert torch.equal(float32, bfloat16)
