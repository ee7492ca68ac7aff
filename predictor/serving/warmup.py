"""Warm-up: run representative shapes (batch sizes × prompt lengths up to the maximum) before serving.

Each step sends ``batch`` concurrent prompts of exactly ``tokens`` tokens (the state is cut to fit,
as it is for real requests), with one question of every type, through the engine's normal path.
Every shape runs twice, at a length that is a multiple of 16 and at one token fewer: Triton compiles
a separate kernel variant for integer arguments divisible by 16, and real prompts have any length,
so warming only round lengths would leave a kernel compilation to the first real request.

The schema is the fullest of :data:`WARMUP_SCHEMAS` that fits the maximum prompt length; a maximum too short
for all of them is refused at start (:class:`WarmupDoesNotFit`): no request would fit it either.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from clef_head.encoder import EncodedRequest, encode_request
from clef_head.request import parse_request
from predictor.engines.base import Engine

log = logging.getLogger(__name__)

WARMUP_SCHEMAS: tuple[dict[str, Any], ...] = (
    {
        "urgent": {"type": "noul"},
        "topic": {"type": "choice", "criteria": {"billing": None, "other": None}},
        "tone": {"type": "score", "criteria": ["calm", "upset"]},
    },
    {"topic": {"type": "choice", "criteria": {"billing": None, "other": None}}},
)
"""Warm-up questions, fullest first: one of every type, then one two-option choice for short maximum lengths."""
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


class WarmupDoesNotFit(ValueError):
    """The maximum prompt length is shorter than every warm-up prompt. The last one, one two-option choice
    question and no state, is as short as a request can be with Qwen3.5's tokenizer (112 tokens)."""


@dataclass(frozen=True)
class WarmupSchema:
    """The warm-up's questions and the tokens of their prompt with an empty state (its shortest prompt)."""

    questions: dict[str, Any]
    tokens: int

    @property
    def full(self) -> bool:
        """Whether every question type is warmed up."""
        return self.questions == WARMUP_SCHEMAS[0]


def schema_tokens(tokenizer: Any, questions: dict[str, Any]) -> int:
    """Tokens of a prompt with ``questions`` and an empty state."""
    request = parse_request({"model": "warmup", "state": "", "questions": questions})
    return len(encode_request(tokenizer, request, max_length=1 << 30).input_ids)


def warmup_schema(tokenizer: Any, max_length: int) -> WarmupSchema:
    """The fullest of :data:`WARMUP_SCHEMAS` whose prompt fits ``max_length`` tokens."""
    for questions in WARMUP_SCHEMAS:
        tokens = schema_tokens(tokenizer, questions)
        if tokens <= max_length:
            return WarmupSchema(questions, tokens)
    smallest = schema_tokens(tokenizer, WARMUP_SCHEMAS[-1])
    raise WarmupDoesNotFit(
        f"--max-model-len {max_length} leaves no room for a System One request: a prompt with one "
        f"two-option question and no state takes {smallest} tokens with this release's tokenizer"
    )


def warmup_prompt(tokenizer: Any, schema: WarmupSchema, tokens: int) -> EncodedRequest:
    """A prompt of exactly ``tokens`` tokens (``SchemaTooLong`` when the schema alone is longer)."""
    request = parse_request(
        {"model": "warmup", "state": "warm up the kernels " * tokens, "questions": schema.questions}
    )
    return encode_request(tokenizer, request, max_length=tokens)


@dataclass(frozen=True)
class WarmupResult:
    """How long the warm-up took, and the most prompt tokens per second one of its last round's steps ran at: the
    admission's start value for the engine's rate (:class:`predictor.serving.admission.ServiceRate`), until
    requests measure it."""

    seconds: float
    tokens_per_s: float


async def run_warmup(engine: Engine, schema: WarmupSchema, plan: list[WarmupStep], rounds: int = 1) -> WarmupResult:
    """Run ``plan`` with ``schema``'s questions ``rounds`` times."""
    started = time.perf_counter()
    tokens_per_s = 0.0
    for round_index in range(rounds):
        for step in plan:
            prompt = warmup_prompt(engine.tokenizer, schema, step.tokens)
            step_started = time.perf_counter()
            logits = await asyncio.gather(*(engine.score(prompt) for _ in range(step.batch)))
            if any(value.shape != (prompt.layout.option_count,) for value in logits):
                raise RuntimeError(f"warm-up: the engine returned logits of the wrong shape for {step}")
            step_s = time.perf_counter() - step_started
            if round_index == rounds - 1:
                tokens_per_s = max(tokens_per_s, step.batch * len(prompt.input_ids) / max(step_s, 1e-9))
            log.info(
                "warm-up %d/%d: batch %d x %d tokens in %.2fs",
                round_index + 1,
                rounds,
                step.batch,
                len(prompt.input_ids),
                step_s,
            )
    return WarmupResult(time.perf_counter() - started, tokens_per_s)
