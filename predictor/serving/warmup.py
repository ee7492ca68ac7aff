"""Warm-up: run representative shapes (batch sizes × prompt lengths up to the maximum) before serving.

Each step sends ``batch`` concurrent prompts of exactly ``tokens`` tokens (the state is cut to fit,
as it is for real requests), with one question of every type, through the engine's normal path.
Every shape runs twice, at a length that is a multiple of 16 and at one token fewer: Triton compiles
a separate kernel variant for integer arguments divisible by 16, and real prompts have any length,
so warming only round lengths would leave a kernel compilation to the first real request.

The schema is the fullest of :data:`WARMUP_SCHEMAS` that fits the maximum prompt length; a maximum too short
for all of them is refused at start (:class:`WarmupDoesNotFit`): no request would fit it either.

On a server that reads images (``--vision``), one more step follows (:func:`run_image_warmup`): one small
synthetic image request, prepared where bodies are prepared and scored by the engine, as a user's image is. A
vLLM engine's front end does work of its own on its first prompt with an image (R32: 26 s of CPU in the serving
process on Clef-flash's release), which this step takes before ready instead of a client's first image.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from clef_head.encoder import EncodedRequest, encode_request
from clef_head.request import parse_request
from predictor.core.errors import BadInput
from predictor.engines.base import Engine
from predictor.serving.encode_pool import PROBE_IMAGE_SIDE, Preparer, probe_image
from predictor.serving.prepare import PrepareSettings, prepare

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


IMAGE_STEP_QUESTIONS = WARMUP_SCHEMAS[-1]
"""The image step's questions: the shortest schema, so the step fits wherever an image request can."""


@dataclass(frozen=True)
class ImageWarmup:
    """The image step: its prompt's tokens, the image's share of them, the time to prepare the body (decode, the
    release's image processor, the prompt) and the time in the engine."""

    tokens: int
    image_tokens: int
    prepare_s: float
    engine_s: float

    @property
    def seconds(self) -> float:
        """The whole step."""
        return self.prepare_s + self.engine_s


def image_warmup_body(served_name: str) -> dict[str, Any]:
    """A request to the served model: :data:`IMAGE_STEP_QUESTIONS`, no state and the encode workers' small probe
    image."""
    return {"model": served_name, "state": "", "questions": IMAGE_STEP_QUESTIONS, "images": [probe_image(0)]}


async def run_image_warmup(engine: Engine, preparer: Preparer, settings: PrepareSettings) -> ImageWarmup | None:
    """One small synthetic image request through the path a user's image takes: prepared by ``preparer`` with the
    server's ``settings``, then scored by ``engine``.

    ``None`` (logged) when no image fits the engine's longest prompt: every image request is then refused before it
    reaches the engine, so none would pay what this step warms."""
    started = time.perf_counter()
    try:
        _request, prompt = await preparer.run(prepare, settings, image_warmup_body(settings.served_name))
    except BadInput as exc:
        log.warning(
            "warm-up: no image fits --max-model-len %d (%s); image requests will be refused, the image path is "
            "not warmed up",
            settings.max_length,
            exc.message,
        )
        return None
    if prompt.media is None or prompt.media.image_count != 1:
        raise RuntimeError("warm-up: the image step's body was prepared without its image")
    prepared = time.perf_counter()
    logits = await engine.score(prompt)
    if logits.shape != (prompt.layout.option_count,):
        raise RuntimeError("warm-up: the engine returned logits of the wrong shape for the image step")
    step = ImageWarmup(
        len(prompt.input_ids), len(prompt.media.token_ids), prepared - started, time.perf_counter() - prepared
    )
    log.info(
        "warm-up image step: one %d x %d PNG (%d of %d prompt tokens) prepared in %.2fs, scored by the engine in %.2fs",
        PROBE_IMAGE_SIDE,
        PROBE_IMAGE_SIDE,
        step.image_tokens,
        step.tokens,
        step.prepare_s,
        step.engine_s,
    )
    return step
