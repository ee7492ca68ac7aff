"""Images and videos encoded as the original release code encodes them: token ids, spans,
``mm_token_type_ids``, ``pixel_values``, ``image_grid_thw``, ``pixel_values_videos`` and ``video_grid_thw``
equal to ``encode_record(..., processor=...)`` on a tiny release that carries Qwen3.5's processor
configuration."""

from __future__ import annotations

import io
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from clef_head.encoder import encode_request
from clef_head.media import (
    MAX_ASPECT_RATIO,
    ImageSource,
    VideoSource,
    decode_image,
    decode_videos,
    encode_media,
    media_digest,
)
from clef_head.request import parse_request
from clef_tools.sample_requests import make_requests
from reliability.image_files import image_file
from tests.head.test_parity import _assert_same_encoding

RECORDS = make_requests(seed=11, count=12)


@pytest.fixture(scope="module")
def processor(tiny_release: Path) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_release)


Videos = list[tuple[list[bytes], float | None]]
"""Each video's frame files and its stated fps."""


def _assert_same_media(
    body: dict[str, Any],
    files: list[bytes],
    tokenizer: Any,
    processor: Any,
    reference: ModuleType,
    max_length: int = 16384,
    videos: Videos | None = None,
) -> None:
    videos = videos or []
    images = [ImageSource(data, ("images", index)) for index, data in enumerate(files)]
    sources = [
        VideoSource(
            tuple(ImageSource(data, ("videos", i, "frames", j)) for j, data in enumerate(frames)), fps, ("videos", i)
        )
        for i, (frames, fps) in enumerate(videos)
    ]
    media = encode_media(
        tokenizer,
        [decode_image(image.data, image.where) for image in images],
        decode_videos(sources),
        media_digest(images, sources),
        image_processor=processor.image_processor,
        video_processor=processor.video_processor,
    )
    ours = encode_request(tokenizer, parse_request(body), max_length=max_length, media=media)
    record: dict[str, Any] = {**body, "images": [Image.open(io.BytesIO(data)) for data in files]}
    if videos:
        # The original reads frames as the video processor takes them (RGB), and a clip's fps from its metadata.
        record["videos"] = [[Image.open(io.BytesIO(data)).convert("RGB") for data in frames] for frames, _ in videos]
        if any(fps is not None for _, fps in videos):
            metadata = [{"total_num_frames": len(frames), "fps": fps} for frames, fps in videos]
            record["media_kwargs"] = {"video_metadata": metadata}
    theirs = reference.encode_record(tokenizer, record, max_length=max_length, processor=processor)
    _assert_same_encoding(ours, theirs)
    assert ours.media is media and ours.media_offset == theirs.media["token_offset"]
    assert media.token_type_ids == theirs.media["mm_token_type_ids"]
    expected = {"mm_token_type_ids", "token_offset"}
    for name, tensor in (
        ("pixel_values", media.pixel_values),
        ("image_grid_thw", media.image_grid_thw),
        ("pixel_values_videos", media.pixel_values_videos),
        ("video_grid_thw", media.video_grid_thw),
    ):
        if tensor is not None:
            assert torch.equal(tensor, theirs.media[name]), name
            expected.add(name)
    assert set(theirs.media) == expected
    assert media.image_count == len(files) and media.video_count == len(videos)


@pytest.mark.parametrize(
    ("sizes", "file_format"),
    [([(448, 448)], "PNG"), ([(1024, 768)], "JPEG"), ([(64, 40), (300, 900), (33, 33), (512, 256)], "PNG")],
)
def test_images_encode_like_release_code(sizes, file_format, processor: Any, reference: ModuleType) -> None:
    files = [image_file(w, h, file_format=file_format, seed=i) for i, (w, h) in enumerate(sizes)]
    _assert_same_media(RECORDS[0], files, processor.tokenizer, processor, reference)


def test_images_count_against_the_prompt_length_like_release_code(processor: Any, reference: ModuleType) -> None:
    """The images' tokens are part of the fixed prompt: the state is cut to the room they leave."""
    body = {**RECORDS[1], "state": "word " * 3000}
    _assert_same_media(body, [image_file(256, 256)], processor.tokenizer, processor, reference, max_length=1200)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(
        st.tuples(st.integers(1, 700), st.integers(1, 700)).filter(lambda s: max(s) <= MAX_ASPECT_RATIO * min(s)),
        min_size=1,
        max_size=4,
    ),
    mode=st.sampled_from(["RGB", "RGBA", "L", "P", "LA"]),
    file_format=st.sampled_from(["PNG", "JPEG"]),
    record=st.integers(0, len(RECORDS) - 1),
)
def test_any_images_encode_like_release_code(
    sizes, mode, file_format, record, processor: Any, reference: ModuleType
) -> None:
    rng = random.Random(record)
    files = [image_file(w, h, mode, file_format, seed=rng.randrange(1000)) for w, h in sizes]
    _assert_same_media(RECORDS[record], files, processor.tokenizer, processor, reference)


def _frames(count: int, width: int, height: int, file_format: str = "PNG", seed: int = 0) -> list[bytes]:
    return [image_file(width, height, file_format=file_format, seed=seed + index) for index in range(count)]


@pytest.mark.parametrize(
    ("files", "videos"),
    [
        ([], [(_frames(4, 64, 48), None)]),
        ([], [(_frames(2, 40, 40, "JPEG"), None)]),
        ([image_file(96, 64)], [(_frames(9, 64, 48), 3.0), (_frames(3, 48, 80, "JPEG", seed=20), None)]),
        ([image_file(33, 33), image_file(64, 40, seed=1)], [(_frames(30, 32, 32), None)]),
    ],
    ids=["one-video", "two-frames", "images-and-videos-with-fps", "sampled-frames"],
)
def test_videos_encode_like_release_code(files, videos, processor: Any, reference: ModuleType) -> None:
    _assert_same_media(RECORDS[2], files, processor.tokenizer, processor, reference, videos=videos)


def test_videos_count_against_the_prompt_length_like_release_code(processor: Any, reference: ModuleType) -> None:
    body = {**RECORDS[3], "state": "word " * 3000}
    videos: Videos = [(_frames(6, 64, 64), 2.0)]
    _assert_same_media(body, [], processor.tokenizer, processor, reference, max_length=1200, videos=videos)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    images=st.integers(0, 2),
    videos=st.lists(
        st.tuples(
            st.integers(2, 14),
            st.tuples(st.integers(1, 90), st.integers(1, 90)).filter(lambda s: max(s) <= 20 * min(s)),
            st.none() | st.floats(0.25, 60.0),
            st.sampled_from(["PNG", "JPEG"]),
        ),
        min_size=1,
        max_size=3,
    ),
    record=st.integers(0, len(RECORDS) - 1),
)
def test_any_videos_encode_like_release_code(images, videos, record, processor: Any, reference: ModuleType) -> None:
    files = [image_file(48, 32, seed=record + index) for index in range(images)]
    clips: Videos = [
        (_frames(count, width, height, file_format, seed=10 * index), fps)
        for index, (count, (width, height), fps, file_format) in enumerate(videos)
    ]
    _assert_same_media(RECORDS[record], files, processor.tokenizer, processor, reference, videos=clips)
