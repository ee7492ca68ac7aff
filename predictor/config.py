"""The predictor's configuration as one frozen value, grouped by concern, and the one function that builds it
from the parsed command line (:func:`config_from_args`). Tests and tools build the groups directly.

Adding a flag: declare it in its group's parser function (:func:`predictor.cli.build_parser`,
:func:`predictor.http.api_args.add_api_args` or :func:`predictor.engines.engine_args.add_engine_args`), give
the group's dataclass a field for it (:class:`~predictor.engines.config.EngineConfig`,
:class:`~predictor.serving.options.ServingOptions`, :class:`~predictor.http.api_config.ApiConfig`) and read it
here (or in :func:`predictor.http.api_args.api_config` for the API). vLLM's own engine arguments need none of
this: vLLM's parser declares them and :func:`predictor.engines.engine_args.given_vllm_flags` carries them over.
"""

from __future__ import annotations

import argparse
import datetime
from dataclasses import dataclass
from pathlib import Path

from predictor.demo import RANDOM_WARNING
from predictor.engines.config import DEFAULT_MAX_MODEL_LEN, EngineConfig
from predictor.engines.engine_args import engine_reads_videos, given_vllm_flags
from predictor.http.api_args import api_config, request_policy, resolve_encode_processes
from predictor.http.api_config import ApiConfig
from predictor.serving.options import ServingOptions
from predictor.serving.prepare import VisionSettings
from predictor.serving.service import ModelCard

DEMO_MAX_MODEL_LEN = 1024
DESCRIPTION = (
    "Clef-flash, Cloudflare's decision model (Qwen3.5-9B backbone + joint schema head): "
    "answers noul, choice and score questions about a JSON state."
)
WARMUP_MAX_BATCH = 16
"""The largest batch the warm-up runs (less with a smaller ``--max-batch``)."""


@dataclass(frozen=True)
class PredictorConfig:
    """What the predictor serves (``card``), with which engine, how the service admits and answers requests
    (``serving``), and how the API is offered (``api``)."""

    card: ModelCard
    engine: EngineConfig
    serving: ServingOptions
    api: ApiConfig


def model_card(args: argparse.Namespace, release_dir: Path, random: bool) -> ModelCard:
    """Name, description (with the RANDOM warning when it applies) and release date."""
    description = args.description or DESCRIPTION
    if random:
        description = f"{RANDOM_WARNING} {description}"
    release_date = args.release_date
    if release_date is None:
        config = release_dir / "config.json"
        stamp = config.stat().st_mtime if config.exists() else release_dir.stat().st_mtime
        release_date = datetime.datetime.fromtimestamp(stamp, tz=datetime.UTC).date().isoformat()
    return ModelCard(name=args.model_name, description=description, release_date=release_date)


def engine_config(args: argparse.Namespace, release_dir: Path) -> EngineConfig:
    """The engine the parsed command line ``args`` asks for, serving the release in ``release_dir``.

    Without ``--max-model-len``, prompts up to :data:`DEMO_MAX_MODEL_LEN` tokens for the demo release (no
    ``--model-dir``), else :data:`~predictor.engines.config.DEFAULT_MAX_MODEL_LEN`.
    """
    default_max_model_len = DEMO_MAX_MODEL_LEN if args.model_dir is None else DEFAULT_MAX_MODEL_LEN
    return EngineConfig(
        release_dir=release_dir,
        kind=args.engine,
        data_parallel_size=args.data_parallel_size,
        max_model_len=default_max_model_len if args.max_model_len is None else args.max_model_len,
        dtype=args.dtype,
        max_batch=args.max_batch,
        batch_wait_s=args.batch_wait_ms / 1000,
        vision=args.vision,
        vllm_flags=given_vllm_flags(args),
    )


def config_from_args(args: argparse.Namespace, release_dir: Path, random: bool, gpu_count: int) -> PredictorConfig:
    """The configuration the parsed (and checked) command line ``args`` asks for, serving the release in
    ``release_dir`` (``random``: its weights are random) on a machine with ``gpu_count`` GPUs."""
    serving = ServingOptions(
        warmup_rounds=args.warmup_rounds,
        warmup_max_batch=min(WARMUP_MAX_BATCH, args.max_batch),
        max_queued=args.max_queued_requests,
        answer_cache_bytes=args.answer_cache_bytes,
        exit_on_engine_death=args.exit_on_engine_death,
        encode_processes=resolve_encode_processes(args.encode_processes, gpu_count),
        release_dir=release_dir,
        inline_encode_max_bytes=args.inline_encode_max_bytes,
        max_batch_items=args.max_batch_items,
        max_queue_wait_s=args.max_queue_wait_s,
        policy=request_policy(args),
        vision=VisionSettings(str(release_dir), videos=engine_reads_videos(args.engine)) if args.vision else None,
    )
    card = model_card(args, release_dir, random)
    return PredictorConfig(card, engine_config(args, release_dir), serving, api_config(args))
