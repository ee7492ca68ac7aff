"""Memory checks before an engine is built: a shortfall is one line naming the flag to change.

The transformers engine needs its weights (in the engine's dtype) once per ``--dp`` engine, plus one
batch's activations; vLLM's CPU build reserves ``--gpu-memory-utilization`` of the machine's memory when
that flag is given (else :mod:`predictor.engines.cpu_kv_cache` sizes its cache).
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil
from safetensors import safe_open

GIB = 1 << 30
ACTIVATION_MARGIN = 1.25
"""Headroom over the weights for one batch's activations and the tokenizer."""


class InsufficientMemory(RuntimeError):
    """Not enough free memory for the engine asked for; the message names the flag to change."""


def available_bytes() -> int:
    """Memory the kernel can give this process now without swapping."""
    return int(psutil.virtual_memory().available)


def release_parameters(model_dir: Path) -> int:
    """Number of stored tensor elements in the release's ``*.safetensors`` files (headers only)."""
    total = 0
    for path in sorted(model_dir.rglob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safetensors' safe_open handle is not iterable)
                count = 1
                for size in handle.get_slice(name).get_shape():
                    count *= size
                total += count
    return total


def check_transformers_memory(model_dir: Path, itemsize: int, engines: int, available: int | None = None) -> None:
    """Raise :class:`InsufficientMemory` when ``engines`` CPU copies of the release will not fit."""
    needed = int(release_parameters(model_dir) * itemsize * engines * ACTIVATION_MARGIN)
    free = available_bytes() if available is None else available
    if needed > free:
        raise InsufficientMemory(
            f"the transformers engine needs about {needed / GIB:.1f} GiB ({engines} engine(s) of "
            f"{itemsize * 8}-bit weights), {free / GIB:.1f} GiB are free: lower --dp or pass --dtype bfloat16"
        )


def check_vllm_cpu_memory(
    gpu_memory_utilization: float, kv_cache_memory_bytes: int | None, available: int | None = None
) -> None:
    """Raise :class:`InsufficientMemory` when vLLM's CPU engine would reserve more than is free."""
    if kv_cache_memory_bytes is not None or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return
    total = psutil.virtual_memory().total
    wanted = int(total * gpu_memory_utilization)
    free = available_bytes() if available is None else available
    if wanted > free:
        raise InsufficientMemory(
            f"vLLM's CPU engine would reserve {wanted / GIB:.1f} GiB (--gpu-memory-utilization "
            f"{gpu_memory_utilization} of {total / GIB:.1f} GiB), {free / GIB:.1f} GiB are free: size its cache "
            "with --kv-cache-memory-bytes (e.g. 1G) or lower --gpu-memory-utilization"
        )
