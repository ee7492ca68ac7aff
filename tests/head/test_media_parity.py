"""Images encoded as the original release code encodes them: token ids, spans, ``mm_token_type_ids``,
``pixel_values`` and ``image_grid_thw`` equal to ``encode_record(..., processor=...)`` on a tiny release that
carries Qwen3.5's processor configuration."""

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
from clef_head.media import MAX_ASPECT_RATIO, decode_image, encode_images, files_digest
from clef_head.request import parse_request
from clef_tools.sample_requests import make_requests
from reliability.image_files import image_file
from tests.head.test_parity import _assert_same_encoding

RECORDS = make_requests(seed=11, count=12)


@pytest.fixture(scope="module")
def processor(tiny_release: Path) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_release)


def _assert_same_media(
    body: dict[str, Any],
    files: list[bytes],
    tokenizer: Any,
    processor: Any,
    reference: ModuleType,
    max_length: int = 16384,
) -> None:
    images = [decode_image(data, ("images", index)) for index, data in enumerate(files)]
    media = encode_images(tokenizer, processor.image_processor, images, files_digest(files))
    ours = encode_request(tokenizer, parse_request(body), max_length=max_length, media=media)
    originals = [Image.open(io.BytesIO(data)) for data in files]
    theirs = reference.encode_record(
        tokenizer, {**body, "images": originals}, max_length=max_length, processor=processor
    )
    _assert_same_encoding(ours, theirs)
    assert ours.media is media and ours.media_offset == theirs.media["token_offset"]
    assert media.token_type_ids == theirs.media["mm_token_type_ids"]
    assert torch.equal(media.pixel_values, theirs.media["pixel_values"])
    assert torch.equal(media.image_grid_thw, theirs.media["image_grid_thw"])
    assert set(theirs.media) == {"pixel_values", "image_grid_thw", "mm_token_type_ids", "token_offset"}


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
