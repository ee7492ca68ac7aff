"""FP8 W8A8 layers on a CPU through PyTorch's row-wise ``torch._scaled_mm`` (a kernel added to vLLM's CPU list)."""

from __future__ import annotations

import logging

import torch
import vllm

logger = logging.getLogger(__name__)


def _row_wise_scaled_mm_works() -> bool:
    """Whether this PyTorch multiplies FP8 matrices on the CPU with one scale per row of A and per column of B."""
    a = torch.ones(2, 16, dtype=torch.float8_e4m3fn)
    b = torch.ones(16, 16, dtype=torch.float8_e4m3fn)
    scale_a = torch.full((2, 1), 2.0, dtype=torch.float32)
    scale_b = torch.full((1, 16), 0.5, dtype=torch.float32)
    try:
        out = torch._scaled_mm(a, b.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return False
    return bool(torch.equal(out, torch.full((2, 16), 16.0, dtype=torch.bfloat16)))


def row_wise_fp8_on_cpu() -> type | None:
    """On a CPU, have vLLM run FP8 W8A8 layers with per-channel weight and per-token activation scales (the FP8
    release's scheme) through PyTorch's row-wise ``torch._scaled_mm``; return the kernel class added, or None.

    vLLM's CPU kernel list (``_POSSIBLE_FP8_KERNELS[CPU]`` in ``vllm.model_executor.kernels.linear``) has a native
    kernel for these layers only on CPUs with AMX-FP8; elsewhere it picks ``ChannelWiseTorchFP8ScaledMMLinearKernel``,
    which calls ``torch._scaled_mm`` with unit per-tensor scales and applies the real ones after. PyTorch's CPU
    ``_scaled_mm`` takes a reference path for per-tensor scales (1.8 s for a 190×512×512 product on an AVX-512
    Xeon) and oneDNN's for row-wise ones (4 ms), so the tiny FP8 release's prompts ran at about 27 tokens/s. vLLM's
    ``RowWiseTorchFP8ScaledMMLinearKernel`` makes the row-wise call but declares itself ROCm-only; a subclass that
    declares the CPU is placed just before the channel-wise kernel, so it takes exactly the layers that one would
    (the same products, its scaling fused into the GEMM: equal within BF16 rounding). Nothing changes on GPUs, on
    CPUs where vLLM has a native kernel for these layers, or where this PyTorch lacks the row-wise CPU product.
    Idempotent: the kernel list is vLLM's, for the whole process."""
    from vllm.platforms import PlatformEnum, current_platform

    if not current_platform.is_cpu():
        return None
    try:
        from vllm.model_executor.kernels import linear
        from vllm.model_executor.kernels.linear.scaled_mm.pytorch import (
            ChannelWiseTorchFP8ScaledMMLinearKernel,
            RowWiseTorchFP8ScaledMMLinearKernel,
        )
    except ImportError as exc:
        logger.warning("vLLM's CPU FP8 kernels left as they are: %s", exc)
        return None
    kernels: list[type] | None = getattr(linear, "_POSSIBLE_FP8_KERNELS", {}).get(PlatformEnum.CPU)
    if kernels is None:
        logger.warning("vLLM's CPU FP8 kernels left as they are: vLLM %s has no CPU kernel list", vllm.__version__)
        return None
    present = [kernel for kernel in kernels if getattr(kernel, "clef_cpu_row_wise", False)]
    if present:
        return present[0]
    if ChannelWiseTorchFP8ScaledMMLinearKernel not in kernels or not _row_wise_scaled_mm_works():
        logger.warning("vLLM's CPU FP8 kernels left as they are: no channel-wise fallback or no row-wise _scaled_mm")
        return None

    class CPURowWiseTorchFP8ScaledMMLinearKernel(RowWiseTorchFP8ScaledMMLinearKernel):
        """vLLM's row-wise ``torch._scaled_mm`` kernel, on the CPU (:func:`row_wise_fp8_on_cpu`)."""

        clef_cpu_row_wise = True

        @classmethod
        def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
            if not current_platform.is_cpu():
                return False, "requires CPU."
            return True, None

    kernels.insert(kernels.index(ChannelWiseTorchFP8ScaledMMLinearKernel), CPURowWiseTorchFP8ScaledMMLinearKernel)
    return CPURowWiseTorchFP8ScaledMMLinearKernel
