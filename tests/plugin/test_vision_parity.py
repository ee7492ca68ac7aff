"""vLLM (CPU) with ``engine_kwargs(vision=True)`` against the transformers engine's scorer: prompts with one to
four images of several sizes, videos (with and without fps, alone and after an image), and a text-only prompt,
answered within the parity tolerance, each run by vLLM on exactly the token ids the predictor encoded (so the
layout's spans hold: the videos' frame times are the predictor's)."""

from __future__ import annotations

import gc
import io
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

import clef_plugin
from clef_head.encoder import EncodedRequest, encode_request
from clef_head.media import (
    IMAGE_PAD,
    VIDEO_PAD,
    ImageSource,
    VideoSource,
    decode_videos,
    encode_media,
    media_digest,
    release_image_processor,
    release_video_processor,
)
from clef_head.request import parse_request
from reliability.image_files import image_file
from tests.plugin.conftest import LARGEST_TEST_MEDIA, MAX_MODEL_LEN, TOLERANCE, stop_engine
from tests.plugin.parity import assert_parity

pytestmark = pytest.mark.vllm

QUESTIONS: dict[str, Any] = {
    "damaged": {"type": "noul", "instructions": "Is the parcel in [image 1] damaged?"},
    "kind": {"type": "choice", "criteria": {"box": "a cardboard box", "envelope": None, "tube": None}},
    "size": {"type": "score", "criteria": ["small", "medium", "large"]},
}
IMAGE_SETS: list[list[bytes]] = [
    [image_file(448, 448, seed=1)],
    [image_file(448, 448, seed=1), image_file(300, 200, file_format="JPEG", seed=2)],
    [image_file(256, 320, seed=3 + index) for index in range(4)],
    [],
    [],
    [image_file(300, 200, file_format="JPEG", seed=2)],
    [],
]
VIDEO_SETS: list[list[tuple[list[bytes], float | None]]] = [
    [],
    [],
    [],
    [],
    [([image_file(96, 64, seed=10 + index) for index in range(30)], None)],
    [
        ([image_file(128, 96, seed=20 + index) for index in range(9)], 3.0),
        ([image_file(64, 64, file_format="JPEG", seed=40 + index) for index in range(3)], None),
    ],
    [([image_file(96, 64, seed=50 + index) for index in range(30)], None)],
]
"""Each prompt's videos (frame files, stated fps), by place in IMAGE_SETS. The last has the token ids of the
fifth and other frames: vLLM must answer the two differently (the frames reach the vision tower)."""


def _encoded(model_dir: Path) -> list[EncodedRequest]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    request = parse_request({"model": "clef", "state": {"note": "a parcel on a doorstep"}, "questions": QUESTIONS})
    encoded = []
    for files, videos in zip(IMAGE_SETS, VIDEO_SETS, strict=True):
        images = [Image.open(io.BytesIO(data)) for data in files]
        sources = [
            VideoSource(tuple(ImageSource(data, ("videos", i)) for data in frames), fps, ("videos", i))
            for i, (frames, fps) in enumerate(videos)
        ]
        digest = media_digest([ImageSource(data, ("images", index)) for index, data in enumerate(files)], sources)
        media = None
        if files or videos:
            media = encode_media(
                tokenizer,
                images,
                decode_videos(sources),
                digest,
                image_processor=release_image_processor(str(model_dir)),
                video_processor=release_video_processor(str(model_dir)),
            )
        encoded.append(encode_request(tokenizer, request, max_length=MAX_MODEL_LEN, media=media))
    return encoded


@pytest.fixture(scope="module")
def reference(toy_release: Path) -> tuple[list[EncodedRequest], list[torch.Tensor]]:
    """The records and the transformers engine's logits for them (FP32, vision tower loaded)."""
    from predictor.engines.reference import TransformersScorer

    encoded = _encoded(toy_release)
    scorer = TransformersScorer(toy_release, dtype=torch.float32, max_length=MAX_MODEL_LEN, vision=True)
    logits = scorer.score(encoded)
    del scorer
    gc.collect()
    return encoded, logits


@pytest.fixture(scope="module")
def llm(vllm_cpu_env: None, toy_release: Path) -> Iterator[Any]:
    from vllm import LLM

    engine = LLM(
        **clef_plugin.engine_kwargs(
            toy_release,
            max_model_len=MAX_MODEL_LEN,
            enforce_eager=True,
            vision=True,
            limit_mm_per_prompt=LARGEST_TEST_MEDIA,
        )
    )
    yield engine
    stop_engine(engine)


def test_images_and_videos_are_answered_as_the_transformers_engine_answers(
    llm: Any, reference: tuple[list[EncodedRequest], list[torch.Tensor]], toy_release: Path
) -> None:
    encoded, expected = reference
    assert [item.media.image_count if item.media else 0 for item in encoded] == [len(files) for files in IMAGE_SETS]
    assert [item.media.video_count if item.media else 0 for item in encoded] == [len(videos) for videos in VIDEO_SETS]
    tokenizer = llm.get_tokenizer()
    pad, video_pad = (int(tokenizer.convert_tokens_to_ids(token)) for token in (IMAGE_PAD, VIDEO_PAD))
    prompts = [clef_plugin.engine_prompt(item, pad, video_pad) for item in encoded]
    assert [prompt["prompt_token_ids"].count(pad) for prompt in prompts] == [len(files) for files in IMAGE_SETS]
    assert [prompt["prompt_token_ids"].count(video_pad) for prompt in prompts] == [len(v) for v in VIDEO_SETS]
    outputs = llm.encode(
        prompts,
        pooling_params=[clef_plugin.pooling_params(item.layout, len(item.input_ids)) for item in encoded],
        pooling_task=clef_plugin.POOLING_TASK,
        use_tqdm=False,
    )
    assert [list(output.prompt_token_ids) for output in outputs] == [item.input_ids for item in encoded]
    logits = [clef_plugin.option_logits(output) for output in outputs]
    assert_parity("vllm cpu, bf16, images and videos", encoded, expected, logits, TOLERANCE)
    assert encoded[4].input_ids == encoded[-1].input_ids and not torch.equal(logits[4], logits[-1])


def test_pixels_in_the_models_dtype_are_answered_to_the_bit_as_float32_pixels(
    llm: Any, reference: tuple[list[EncodedRequest], list[torch.Tensor]]
) -> None:
    """The predictor makes pixels in the engine's dtype (``Engine.pixel_dtype``: the model's): vLLM's vision tower
    casts float32 pixels to it before anything else, so the answers are the same to the bit. Each variant's media
    is named apart (its digest), so vLLM's encoder cache cannot answer one with the other's embeddings."""
    encoded, _ = reference
    dtype = llm.llm_engine.vllm_config.model_config.dtype
    assert dtype == torch.bfloat16
    chosen = [encoded[1], encoded[5]]  # two images; an image and two videos
    variants = []
    for digest, cast in ((b"\x01" * 32, None), (b"\x02" * 32, dtype)):
        for item in chosen:
            media = item.media
            assert media is not None and media.pixel_values is not None
            media = replace(
                media,
                digest=digest + media.digest,
                pixel_values=media.pixel_values if cast is None else media.pixel_values.to(cast),
                pixel_values_videos=(
                    media.pixel_values_videos
                    if cast is None or media.pixel_values_videos is None
                    else media.pixel_values_videos.to(cast)
                ),
            )
            variants.append(replace(item, media=media))
    assert variants[3].media is not None and variants[3].media.pixel_values_videos is not None
    assert variants[3].media.pixel_values_videos.dtype == torch.bfloat16
    tokenizer = llm.get_tokenizer()
    pad, video_pad = (int(tokenizer.convert_tokens_to_ids(token)) for token in (IMAGE_PAD, VIDEO_PAD))
    outputs = llm.encode(
        [clef_plugin.engine_prompt(item, pad, video_pad) for item in variants],
        pooling_params=[clef_plugin.pooling_params(item.layout, len(item.input_ids)) for item in variants],
        pooling_task=clef_plugin.POOLING_TASK,
        use_tqdm=False,
    )
    logits = [clef_plugin.option_logits(output) for output in outputs]
    assert all(torch.equal(logits[index], logits[index + 2]) for index in range(2))
