"""Engines behind one interface (:class:`Engine`), and how ``--engine auto|vllm|transformers`` picks one.

The layer above :mod:`predictor.core` only: engines know neither the pipeline nor HTTP.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from predictor.engines.base import Engine, EngineDead
from predictor.engines.config import ENGINE_CHOICES, EngineConfig
from predictor.engines.cpu_kv_cache import default_kv_cache_bytes, kv_layout, weights_bytes
from predictor.engines.memory import GIB, check_transformers_memory, check_vllm_cpu_memory

if TYPE_CHECKING:
    from vllm import AsyncEngineArgs

log = logging.getLogger(__name__)

TORCH_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "float": torch.float32,
}

__all__ = [
    "ENGINE_CHOICES",
    "Engine",
    "EngineConfig",
    "EngineDead",
    "build_engine",
    "choose_engine",
    "visible_gpus",
    "vllm_can_serve",
]


def visible_gpus() -> int:
    """GPUs this process sees, counted without initialising CUDA here (torch counts them through NVML).

    ``torch.cuda.is_available()`` would initialise the CUDA driver (``cudaGetDeviceCount``), after which a forked
    child cannot use CUDA, and vLLM forks its engine core from this process when CUDA is not initialised here
    (``clef_plugin.compat.cuda_probes.cuda_left_uninitialised``).
    """
    return torch.cuda.device_count()


def _plugin_ready() -> bool:
    import clef_plugin

    return all(hasattr(clef_plugin, name) for name in ("engine_kwargs", "pooling_params", "option_logits"))


def choose_engine(requested: str, vllm_available: bool | None = None, gpu_count: int | None = None) -> tuple[str, str]:
    """The engine to build for ``requested`` and why.

    ``auto`` is vLLM when vLLM (with the clef plugin) is installed and a GPU is visible, else the
    transformers engine: on a CPU, vLLM's engine reserves a share of the machine's memory
    (``--gpu-memory-utilization``) and starts in tens of seconds, while the transformers engine needs
    the weights and one batch's activations. ``vllm_available`` and ``gpu_count`` default to what
    this machine has.
    """
    if requested not in ENGINE_CHOICES:
        raise ValueError(f"engine must be one of {', '.join(ENGINE_CHOICES)}, got {requested!r}")
    if requested != "auto":
        return requested, f"--engine {requested} was requested"
    if vllm_available is None:
        vllm_available = importlib.util.find_spec("vllm") is not None and _plugin_ready()
    if gpu_count is None:
        gpu_count = visible_gpus()
    if not vllm_available:
        return "transformers", "vLLM (with the clef plugin) is not installed"
    if gpu_count:
        return "vllm", f"vLLM is installed and {gpu_count} GPU(s) are visible"
    return "transformers", "no GPU is visible (use --engine vllm for vLLM's CPU build)"


def vllm_can_serve(requested: str) -> bool:
    """Whether ``--engine requested`` ends on the vLLM engine on this machine (``auto`` as :func:`choose_engine`
    decides): only then are vLLM's flags read (vLLM's parser imports vLLM, seconds of every start)."""
    return choose_engine(requested)[0] == "vllm"


def build_transformers(config: EngineConfig) -> Engine:
    """``config.data_parallel_size`` transformers engines (one per GPU, or all on the CPU)."""
    from predictor.engines.pool import EnginePool
    from predictor.engines.transformers import TransformersEngine

    gpus = torch.cuda.device_count()
    count = config.data_parallel_size
    if gpus and count > gpus:
        raise ValueError(f"--dp {count} needs {count} GPUs, {gpus} are visible")
    devices = [f"cuda:{i}" if gpus else "cpu" for i in range(count)]
    if config.dtype not in ("auto", *TORCH_DTYPES):
        raise ValueError(f"--dtype {config.dtype} is not supported by the transformers engine")
    # auto: BF16 on GPUs; FP32 on CPUs, where BF16 matmuls are slow and batched results drift more.
    dtype = TORCH_DTYPES.get(config.dtype, torch.bfloat16 if gpus else torch.float32)
    if not gpus:
        check_transformers_memory(config.release_dir, dtype.itemsize, count)
    engines: list[Engine] = [
        TransformersEngine(
            config.release_dir,
            max_length=config.max_model_len,
            device=device,
            dtype=dtype,
            max_batch=config.max_batch,
            max_wait_s=config.batch_wait_s,
            label=f"transformers-{index}",
            vision=config.vision,
        )
        for index, device in enumerate(devices)
    ]
    return engines[0] if len(engines) == 1 else EnginePool(engines)


def with_cpu_kv_cache(engine_args: AsyncEngineArgs, model_dir: Path) -> AsyncEngineArgs:
    """vLLM's CPU engine arguments with ``kv_cache_memory_bytes`` sized by :mod:`predictor.engines.cpu_kv_cache`,
    unless ``--kv-cache-memory-bytes``, ``VLLM_CPU_KVCACHE_SPACE`` or ``--gpu-memory-utilization`` sizes it
    (the last one checked against the free memory by :func:`check_vllm_cpu_memory`)."""
    from vllm import AsyncEngineArgs
    from vllm.config import SchedulerConfig

    if engine_args.kv_cache_memory_bytes is not None or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return engine_args
    if engine_args.gpu_memory_utilization != AsyncEngineArgs.gpu_memory_utilization:
        check_vllm_cpu_memory(engine_args.gpu_memory_utilization, None)
        return engine_args
    layout = kv_layout(
        model_dir, str(engine_args.dtype), str(engine_args.kv_cache_dtype), str(engine_args.mamba_ssm_cache_dtype)
    )
    size = default_kv_cache_bytes(
        layout,
        max_model_len=int(engine_args.max_model_len),
        max_num_seqs=engine_args.max_num_seqs or SchedulerConfig.DEFAULT_MAX_NUM_SEQS,
        weights=weights_bytes(model_dir),
        engines=engine_args.data_parallel_size,
    )
    log.info(
        "vLLM CPU KV cache: %.2f GiB per engine (attention blocks of %d tokens; --kv-cache-memory-bytes overrides)",
        size / GIB,
        layout.block_tokens,
    )
    return dataclasses.replace(engine_args, kv_cache_memory_bytes=size)


def build_engine(config: EngineConfig) -> Engine:
    """The engine ``config.kind`` names (``auto`` resolved by :func:`choose_engine`, logged).

    vLLM's engine arguments come from ``config`` (vLLM's own flags) with the plugin's settings laid over them
    (:func:`predictor.engines.engine_args.vllm_engine_args`). On a CPU, the KV cache is sized to fit the machine
    first (:func:`with_cpu_kv_cache`; :class:`predictor.engines.memory.InsufficientMemory` names the flag to change).
    """
    kind, reason = choose_engine(config.kind)
    log.info("engine: %s (%s), data parallel %d", kind, reason, config.data_parallel_size)
    if kind == "vllm":
        from predictor.engines.engine_args import vllm_engine_args
        from predictor.engines.vllm import VllmEngine

        on_gpu = visible_gpus() > 0
        engine_args = vllm_engine_args(config, on_gpu=on_gpu)
        if not on_gpu:
            engine_args = with_cpu_kv_cache(engine_args, config.release_dir)
        return VllmEngine(engine_args)
    return build_transformers(config)
