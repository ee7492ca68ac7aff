"""The backbone's FP8 GEMMs for one prompt, by the prompt's row count, on one GPU.

A lone prompt's whole-forward CUDA graph runs the backbone's linear layers on as many rows as the graph's size.
This script times exactly those GEMMs at the full shape's layer sizes (``clef_tools.fullsize.FULL_TEXT``: every
layer's MLP, every fourth layer's full attention, the others' Gated DeltaNet projections), with the kernel vLLM
runs for the FP8 release on Hopper (``vllm._custom_ops.cutlass_scaled_mm``: FP8 activations with a scale per row,
FP8 weights with a scale per output channel, BF16 out) and, beside it, PyTorch's own (``torch._scaled_mm``,
cuBLASLt, the same scales). Each layer kind has one weight tensor that all its layers read (the smaller ones may
stay in the GPU's L2 cache from one layer to the next, for both kernels alike). One forward's GEMMs are captured as
one CUDA graph per row count and kernel and replayed, so the figure is GPU time, not launches. Printed per row
count and kernel: the median milliseconds of one forward's GEMMs over ``--repeats`` timings of ``--replays``
replays each.

    python3 -m bench.fp8_gemm_rows --rows 384,448,480,512,513,544,576,640
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Gemm:
    """One linear layer kind: its output and input features, and how many layers run it per forward."""

    name: str
    out_features: int
    in_features: int
    layers: int


def backbone_gemms(text: Mapping[str, Any]) -> list[Gemm]:
    """The quantized linear layers of one forward of a Qwen3.5 text model of sizes ``text`` (vLLM's merged
    projections; every fourth layer is full attention, with its output gate)."""
    from clef_tools.tiny import layer_types

    hidden = int(text["hidden_size"])
    layers = int(text["num_hidden_layers"])
    full = layer_types(layers).count("full_attention")
    linear = layers - full
    heads, kv_heads, head_dim = (
        int(text["num_attention_heads"]),
        int(text["num_key_value_heads"]),
        int(text["head_dim"]),
    )
    key_width = int(text["linear_num_key_heads"]) * int(text["linear_key_head_dim"])
    value_heads = int(text["linear_num_value_heads"])
    value_width = value_heads * int(text["linear_value_head_dim"])
    return [
        Gemm("mlp.gate_up_proj", 2 * int(text["intermediate_size"]), hidden, layers),
        Gemm("mlp.down_proj", hidden, int(text["intermediate_size"]), layers),
        Gemm("self_attn.qkv_proj", 2 * heads * head_dim + 2 * kv_heads * head_dim, hidden, full),
        Gemm("self_attn.o_proj", hidden, heads * head_dim, full),
        Gemm("linear_attn.in_proj_qkvz", 2 * key_width + 2 * value_width, hidden, linear),
        Gemm("linear_attn.in_proj_ba", 2 * value_heads, hidden, linear),
        Gemm("linear_attn.out_proj", hidden, value_width, linear),
    ]


KERNELS = ("cutlass", "torch")
"""vLLM's CUTLASS FP8 GEMM, PyTorch's ``_scaled_mm``."""


def time_forward_gemms(gemms: list[Gemm], rows: int, kernel: str, replays: int, repeats: int) -> float:
    """Median milliseconds of one forward's GEMMs at ``rows`` rows with ``kernel`` (CUDA only)."""
    import torch
    from vllm import _custom_ops as ops

    scaled_mm = ops.cutlass_scaled_mm if kernel == "cutlass" else torch._scaled_mm

    generator = torch.Generator(device="cuda").manual_seed(rows)
    calls = []
    for gemm in gemms:
        activations = torch.randn(rows, gemm.in_features, device="cuda", generator=generator).to(torch.float8_e4m3fn)
        weight = torch.randn(gemm.out_features, gemm.in_features, device="cuda", generator=generator)
        weight_t = weight.to(torch.float8_e4m3fn).t()  # [in, out], column-major: the layout vLLM keeps
        row_scale = torch.rand(rows, 1, device="cuda", generator=generator) + 0.5
        channel_scale = torch.rand(1, gemm.out_features, device="cuda", generator=generator) + 0.5
        calls += [(activations, weight_t, row_scale, channel_scale)] * gemm.layers

    def forward() -> None:
        for activations, weight_t, row_scale, channel_scale in calls:
            scaled_mm(activations, weight_t, row_scale, channel_scale, out_dtype=torch.bfloat16)

    forward()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    graph.replay()
    torch.cuda.synchronize()
    timings = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        timings.append(start.elapsed_time(end) / replays)
    return statistics.median(timings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="384,448,480,512,513,544,576,640", help="comma list of row counts")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (vLLM's CUTLASS FP8 GEMM)")
    from clef_tools.fullsize import FULL_TEXT

    gemms = backbone_gemms(FULL_TEXT)
    for rows in (int(value) for value in args.rows.split(",")):
        ms: dict[str, float | str] = {}
        for kernel in KERNELS:
            try:
                ms[kernel] = round(time_forward_gemms(gemms, rows, kernel, args.replays, args.repeats), 3)
            except RuntimeError as exc:  # a shape the kernel refuses: said in the output, the other still timed
                ms[kernel] = f"refused: {str(exc).splitlines()[0][:160]}"
        print(json.dumps({"rows": rows, "gemm_ms_per_forward": ms}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
