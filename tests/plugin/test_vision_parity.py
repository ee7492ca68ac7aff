"""vLLM (CPU) with ``engine_kwargs(vision=True)`` against the transformers engine's scorer: prompts with one to
four images of several sizes, and a text-only prompt, answered within the parity tolerance, each run by vLLM on
exactly the token ids the predictor encoded (so the layout's spans hold)."""

from __future__ import annotations

import gc
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

import clef_plugin
from clef_head.encoder import EncodedRequest, encode_request
from clef_head.media import IMAGE_PAD, ImageSource, encode_media, media_digest, release_image_processor
from clef_head.request import parse_request
from reliability.image_files import image_file
from tests.plugin.conftest import MAX_MODEL_LEN, TOLERANCE, stop_engine
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
]


def _encoded(model_dir: Path) -> list[EncodedRequest]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    processor = release_image_processor(str(model_dir))
    request = parse_request({"model": "clef", "state": {"note": "a parcel on a doorstep"}, "questions": QUESTIONS})
    encoded = []
    for files in IMAGE_SETS:
        images = [Image.open(io.BytesIO(data)) for data in files]
        digest = media_digest([ImageSource(data, ("images", index)) for index, data in enumerate(files)])
        media = encode_media(tokenizer, images, [], digest, image_processor=processor) if files else None
        encoded.append(encode_request(tokenizer, request, max_length=MAX_MODEL_LEN, media=media))
    return encoded


@pytest.fixture(scope="module")
def reference(tiny_release: Path) -> tuple[list[EncodedRequest], list[torch.Tensor]]:
    """The records and the transformers engine's logits for them (FP32, vision tower loaded)."""
    from predictor.engines.reference import TransformersScorer

    encoded = _encoded(tiny_release)
    scorer = TransformersScorer(tiny_release, dtype=torch.float32, max_length=MAX_MODEL_LEN, vision=True)
    logits = scorer.score(encoded)
    del scorer
    gc.collect()
    return encoded, logits


@pytest.fixture(scope="module")
def llm(vllm_cpu_env: None, tiny_release: Path) -> Iterator[Any]:
    from vllm import LLM

    engine = LLM(
        **clef_plugin.engine_kwargs(tiny_release, max_model_len=MAX_MODEL_LEN, enforce_eager=True, vision=True)
    )
    yield engine
    stop_engine(engine)


def test_images_are_answered_as_the_transformers_engine_answers(
    llm: Any, reference: tuple[list[EncodedRequest], list[torch.Tensor]], tiny_release: Path
) -> None:
    encoded, expected = reference
    assert [item.media.image_count if item.media else 0 for item in encoded] == [len(files) for files in IMAGE_SETS]
    pad = int(llm.get_tokenizer().convert_tokens_to_ids(IMAGE_PAD))
    prompts = [clef_plugin.engine_prompt(item, pad) for item in encoded]
    assert [prompt["prompt_token_ids"].count(pad) for prompt in prompts] == [len(files) for files in IMAGE_SETS]
    outputs = llm.encode(
        prompts,
        pooling_params=[clef_plugin.pooling_params(item.layout, len(item.input_ids)) for item in encoded],
        pooling_task=clef_plugin.POOLING_TASK,
        use_tqdm=False,
    )
    assert [list(output.prompt_token_ids) for output in outputs] == [item.input_ids for item in encoded]
    logits = [clef_plugin.option_logits(output) for output in outputs]
    assert_parity("vllm cpu, bf16, images", encoded, expected, logits, TOLERANCE)
