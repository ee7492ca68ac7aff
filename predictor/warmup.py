"""Warm-up: run representative shapes (batch sizes × prompt lengths up to the maximum) before serving.

Each step sends ``batch`` concurrent prompts of exactly ``tokens`` tokens (the state is cut to fit,
as it is for real requests), with one question of every type, through the engine's normal path.
Every shape runs twice, at a length that is a multiple of 16 and at one token fewer: Triton compiles
a separate kernel variant for integer arguments divisible by 16, and real prompts have any length,
so warming only round lengths would leave a kernel compilation to the first real request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from clef_head.encoder import EncodedRequest, encode_request
from clef_head.request import parse_request
from predictor.engines.base import Engine

log = logging.getLogger(__name__)

WARMUP_QUESTIONS = {
    "urgent": {"type": "noul"},
    "topic": {"type": "choice", "criteria": {"billing": None, "other": None}},
    "tone": {"type": "score", "criteria": ["calm", "upset"]},
}
SHORTEST = 256
BATCH_SIZES = (1, 4, 16)


@dataclass(frozen=True)
class WarmupStep:
    """``batch`` concurrent prompts of ``tokens`` tokens."""

    batch: int
    tokens: int


def warmup_plan(max_length: int, max_batch: int = 16, min_tokens: int = 0) -> list[WarmupStep]:
    """Batch sizes (1, 4, 16, capped by ``max_batch``) at a short length, then lengths x4 up to the maximum,
    each followed by the same step one token shorter (see the module docstring).

    The short length is ``SHORTEST`` or, when the warm-up schema alone is longer (``min_tokens``), the
    next power of two above it.
    """
    short = SHORTEST
    while short <= min_tokens:
        short *= 2
    short = min(short, max_length)
    steps = [WarmupStep(batch, short) for batch in BATCH_SIZES if batch <= max(1, max_batch)]
    length = short * 4
    while length < max_length:
        steps.append(WarmupStep(1, length))
        length *= 4
    if short < max_length:
        steps.append(WarmupStep(1, max_length))
    plan = []
    for step in steps:
        plan.append(step)
        if step.tokens - 1 >= max(min_tokens, 1):
            plan.append(WarmupStep(step.batch, step.tokens - 1))
    return plan


def schema_tokens(engine: Engine) -> int:
    """Tokens of a warm-up prompt with an empty state (the shortest warm-up prompt possible)."""
    request = parse_request({"model": "warmup", "state": "", "questions": WARMUP_QUESTIONS})
    return len(encode_request(engine.tokenizer, request, max_length=1 << 30).input_ids)


def warmup_prompt(engine: Engine, tokens: int) -> EncodedRequest:
    """A prompt of exactly ``tokens`` tokens (``SchemaTooLong`` when the schema alone is longer)."""
    request = parse_request(
        {"model": "warmup", "state": "warm up the kernels " * tokens, "questions": WARMUP_QUESTIONS}
    )
    return encode_request(engine.tokenizer, request, max_length=tokens)


async def run_warmup(engine: Engine, plan: list[WarmupStep], rounds: int = 1) -> float:
    """Run ``plan`` ``rounds`` times; return the seconds it took."""
    started = time.perf_counter()
    for round_index in range(rounds):
        for step in plan:
            prompt = warmup_prompt(engine, step.tokens)
            step_started = time.perf_counter()
            logits = await asyncio.gather(*(engine.score(prompt) for _ in range(step.batch)))
            if any(value.shape != (prompt.layout.option_count,) for value in logits):
                raise RuntimeError(f"warm-up: the engine returned logits of the wrong shape for {step}")
            log.info(
                "warm-up %d/%d: batch %d x %d tokens in %.2fs",
                round_index + 1,
                rounds,
                step.batch,
                len(prompt.input_ids),
                time.perf_counter() - step_started,
            )
    return time.perf_counter() - started
