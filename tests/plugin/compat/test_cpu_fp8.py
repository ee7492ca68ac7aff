"""FP8 W8A8 layers on a CPU run PyTorch's row-wise ``_scaled_mm`` (clef_plugin.compat.cpu_fp8).

These pin the vLLM internals the function edits (its CPU FP8 kernel list and the kernels it places ours between),
check which kernel vLLM then selects for the FP8 release's scheme and for others, and that the row-wise kernel's
products equal the channel-wise kernel's it replaces. test_quantize.py serves a whole FP8 release through it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.vllm


@pytest.fixture
def cpu_fp8_kernels() -> Iterator[list[type]]:
    """vLLM's own CPU FP8 kernel list (without the kernel an engine built earlier in this process added), restored
    after the test (the function edits it for the whole process)."""
    from vllm.model_executor.kernels import linear
    from vllm.platforms import PlatformEnum

    kernels: list[type] = linear._POSSIBLE_FP8_KERNELS[PlatformEnum.CPU]
    saved = list(kernels)
    kernels[:] = [kernel for kernel in saved if not getattr(kernel, "clef_cpu_row_wise", False)]
    yield kernels
    kernels[:] = saved


def layer_config(activation: Any, weight: Any, shape: tuple[int, int] = (64, 32)) -> Any:
    """A BF16 layer's FP8 config, as vLLM's compressed-tensors scheme builds it."""
    from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import FP8ScaledMMLinearLayerConfig

    return FP8ScaledMMLinearLayerConfig(
        weight_quant_key=weight,
        activation_quant_key=activation,
        input_dtype=torch.bfloat16,
        out_dtype=torch.bfloat16,
        weight_shape=shape,
    )


def chosen(config: Any) -> type:
    from vllm.model_executor.kernels import linear

    return linear.choose_scaled_mm_linear_kernel(
        config=config, possible_kernels=linear._POSSIBLE_FP8_KERNELS, quantization="fp8_w8a8"
    )


def test_vllm_cpu_list_still_falls_back_to_the_channel_wise_kernel(cpu_fp8_kernels: list[type]) -> None:
    """What the function relies on: the CPU list ends in the channel-wise Torch kernel, and vLLM's row-wise kernel
    makes one fused ``_scaled_mm`` call (its scales of shape (m, 1) and (1, n))."""
    import inspect

    from vllm.model_executor.kernels.linear.scaled_mm.pytorch import (
        ChannelWiseTorchFP8ScaledMMLinearKernel,
        RowWiseTorchFP8ScaledMMLinearKernel,
    )

    assert cpu_fp8_kernels[-1] is ChannelWiseTorchFP8ScaledMMLinearKernel, cpu_fp8_kernels
    assert RowWiseTorchFP8ScaledMMLinearKernel not in cpu_fp8_kernels, "vLLM lists it on CPUs now: drop ours"
    assert "scale_b=scale_b" in inspect.getsource(RowWiseTorchFP8ScaledMMLinearKernel.apply_scaled_mm)


def test_the_fp8_release_scheme_gets_the_row_wise_kernel_and_others_keep_theirs(
    cpu_fp8_kernels: list[type],
) -> None:
    from vllm.model_executor.kernels.linear.scaled_mm.pytorch import ChannelWiseTorchFP8ScaledMMLinearKernel
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        kFp8DynamicTokenSym,
        kFp8StaticChannelSym,
        kFp8StaticTensorSym,
    )

    from clef_plugin.compat.cpu_fp8 import row_wise_fp8_on_cpu

    release_scheme = layer_config(kFp8DynamicTokenSym, kFp8StaticChannelSym)  # FP8_DYNAMIC: clef_tools.quantize
    others = [
        layer_config(kFp8StaticTensorSym, kFp8StaticChannelSym),
        layer_config(kFp8StaticTensorSym, kFp8StaticTensorSym),
    ]
    assert chosen(release_scheme) is ChannelWiseTorchFP8ScaledMMLinearKernel  # vLLM's own choice
    before = [chosen(config) for config in others]  # per-tensor scales: a CPU kernel of vLLM's on AMX machines

    kernel = row_wise_fp8_on_cpu()
    assert kernel is not None
    assert row_wise_fp8_on_cpu() is kernel  # a second engine in the process: the list is edited once
    assert cpu_fp8_kernels.count(kernel) == 1
    assert cpu_fp8_kernels.index(kernel) == cpu_fp8_kernels.index(ChannelWiseTorchFP8ScaledMMLinearKernel) - 1

    assert chosen(release_scheme) is kernel
    assert [chosen(config) for config in others] == before


def test_row_wise_products_equal_the_channel_wise_kernel(cpu_fp8_kernels: list[type]) -> None:
    """Per-token activation and per-channel weight scales, padded rows as vLLM pads them: the fused product equals
    the channel-wise kernel's (FP32 product, scaled, rounded to BF16) within BF16 rounding, and the FP32 reference."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.kernels.linear.scaled_mm.pytorch import ChannelWiseTorchFP8ScaledMMLinearKernel
    from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8DynamicTokenSym, kFp8StaticChannelSym

    from clef_plugin.compat.cpu_fp8 import row_wise_fp8_on_cpu

    kernel = row_wise_fp8_on_cpu()
    assert kernel is not None
    tokens, padded, k, n = 5, 17, 64, 32
    generator = torch.Generator().manual_seed(0)
    a = (torch.randn(padded, k, generator=generator) * 4).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, generator=generator).to(torch.float8_e4m3fn)
    a_scales = torch.rand(padded, 1, generator=generator) + 0.5
    w_scales = torch.rand(n, 1, generator=generator) * 0.01 + 0.005  # compressed-tensors' (n, 1)
    config = layer_config(kFp8DynamicTokenSym, kFp8StaticChannelSym, (n, k))
    names = ["weight", "weight_scale", "input_scale", "input_scale_ub"]
    arguments = {
        "A": a,
        "B": w.t(),
        "out_dtype": torch.bfloat16,
        "As": a_scales,
        "Bs": w_scales,
        "bias": None,
        "output_shape": [tokens, n],
    }
    with set_current_vllm_config(VllmConfig()):  # the kernels read the compilation mode when built
        row_wise = kernel(config, layer_param_names=names).apply_scaled_mm(**arguments)
        channel_wise = ChannelWiseTorchFP8ScaledMMLinearKernel(config, layer_param_names=names)
        channel_wise = channel_wise.apply_scaled_mm(**arguments)
    reference = (a.float() @ w.float().t() * a_scales * w_scales.t())[:tokens]

    assert row_wise.dtype == channel_wise.dtype == torch.bfloat16
    assert row_wise.shape == channel_wise.shape == (tokens, n)
    tolerance = reference.abs().max().item() * 2**-7  # one BF16 rounding of the largest value
    torch.testing.assert_close(row_wise.float(), reference, rtol=0, atol=tolerance)
    torch.testing.assert_close(row_wise.float(), channel_wise.float(), rtol=0, atol=tolerance)
