"""Fixtures for the plugin tests: CPU vLLM engines (one per module), records and reference logits."""

from __future__ import annotations

import gc
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from clef_head.encoder import EncodedRequest
from clef_head.request import SystemOneRequest, parse_request
from clef_tools.sample_requests import make_request

PARITY_RECORDS = 100
MAX_MODEL_LEN = 4096
TOLERANCE = 0.02  # max |Δ probability| allowed between vLLM and the transformers reference
LARGEST_TEST_MEDIA: dict[str, dict[str, int]] = {
    "image": {"width": 448, "height": 448},
    "video": {"num_frames": 32, "width": 128, "height": 96},
}
"""The largest image and video the vision tests send: vLLM engines of those tests profile and warm up with media
of this size (``limit_mm_per_prompt``'s dummy sizes) instead of a 4096 × 4096 image, which took about a minute
of each CPU start; answers do not depend on it."""


@dataclass(frozen=True)
class Scored:
    """Records, their encodings and the transformers reference's option logits."""

    requests: list[SystemOneRequest]
    encoded: list[EncodedRequest]
    logits: list[torch.Tensor]


def parity_requests(seed: int, count: int) -> list[dict[str, Any]]:
    """Seeded System One requests with 1–2 questions each (short prompts keep CPU time low)."""
    rng = random.Random(seed)
    return [make_request(rng, questions=rng.randint(1, 2)) for _ in range(count)]


def reference_scores(model_dir: Path, bodies: list[dict[str, Any]]) -> Scored:
    """Encode ``bodies`` with the release's tokenizer and score them with the transformers reference."""
    from predictor.engines.reference import TransformersScorer

    scorer = TransformersScorer(model_dir, dtype=torch.bfloat16, max_length=MAX_MODEL_LEN)
    requests = [parse_request(body) for body in bodies]
    encoded = [scorer.encode(request) for request in requests]
    logits = scorer.score(encoded)
    del scorer
    gc.collect()
    return Scored(requests=requests, encoded=encoded, logits=logits)


@pytest.fixture(scope="session")
def vllm_cpu_env() -> Iterator[None]:
    """In-process CPU engines: small KV cache, no engine subprocess (the cache folder: ``shared_compile_cache``)."""
    settings = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def parity_reference(tiny_release: Path) -> Scored:
    """The reference's logits for the 100 parity records on the release-layout tiny release."""
    return reference_scores(tiny_release, parity_requests(seed=2026, count=PARITY_RECORDS))


def start_engine(model_dir: Path, **overrides: Any) -> Any:
    """A CPU ``vllm.LLM`` for ``model_dir`` built from :func:`clef_plugin.engine_kwargs`."""
    from vllm import LLM

    import clef_plugin

    kwargs = clef_plugin.engine_kwargs(model_dir, max_model_len=MAX_MODEL_LEN, enforce_eager=True)
    kwargs.update(overrides)
    return LLM(**kwargs)


def stop_engine(llm: Any) -> None:
    """Shut an in-process engine down and free its distributed state, so the next module can start one."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    llm.llm_engine.engine_core.shutdown()
    del llm
    cleanup_dist_env_and_memory()
