"""Torch profiler traces: GPU kernel time by kind, the top kernels, busy share of the span."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Kernel kinds for the profile summary: the first pattern found in a kernel's name (lower case) wins.
KERNEL_KINDS = (
    (
        "gdn",
        (
            "chunk_",
            "gated_delta",
            "fused_recurrent",
            "solve_tril",
            "l2norm",
            "kkt",
            "cumsum",
            "fused_gdn",
            "recompute_w_u",
            "merge_16x16",
            "fused_post_conv",
        ),
    ),
    ("conv1d", ("causal_conv1d", "conv1d")),
    ("fused (inductor)", ("triton_",)),
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "matmul", "wgmma", "cublas")),
    ("fp8 quant", ("quant",)),
    ("norm", ("norm",)),
    ("activation", ("silu", "act_and_mul", "sigmoid", "gelu", "softplus")),
    ("copy/elementwise", ("elementwise", "copy", "cat", "index", "fill", "reduce")),
)


def kernel_kind(name: str) -> str:
    """The :data:`KERNEL_KINDS` kind of a GPU kernel name (``other`` when none matches)."""
    lowered = name.lower()
    for kind, patterns in KERNEL_KINDS:
        if any(pattern in lowered for pattern in patterns):
            return kind
    return "other"


def summarize_trace(trace_dir: Path, since: float) -> dict[str, Any]:
    """GPU kernel time by kind, the top kernels, and GPU-busy vs wall time from the newest torch trace."""
    import gzip

    traces = [path for path in trace_dir.rglob("*.json*") if path.stat().st_mtime >= since]
    if not traces:
        return {"error": f"no profiler trace written in {trace_dir}"}
    newest = max(traces, key=lambda path: path.stat().st_mtime)
    opener = gzip.open if newest.suffix == ".gz" else open
    with opener(newest, "rt") as handle:
        events = json.load(handle).get("traceEvents", [])
    kernels = [event for event in events if event.get("cat") == "kernel" and "dur" in event]
    if not kernels:
        return {"error": f"no GPU kernels in {newest.name}"}
    by_name: dict[str, float] = {}
    for event in kernels:
        by_name[event["name"]] = by_name.get(event["name"], 0.0) + float(event["dur"])
    by_kind: dict[str, float] = {}
    for name, micros in by_name.items():
        kind = kernel_kind(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + micros
    busy = sum(by_name.values())
    first = min(float(event["ts"]) for event in kernels)
    last = max(float(event["ts"]) + float(event["dur"]) for event in kernels)
    top = sorted(by_name.items(), key=lambda item: -item[1])[:25]
    return {
        "trace": newest.name,
        "kernels": len(kernels),
        "gpu_busy_ms": round(busy / 1000, 2),
        "kernel_span_ms": round((last - first) / 1000, 2),
        "gpu_busy_share_of_span": round(busy / max(last - first, 1e-9), 4),
        "by_kind_ms": {kind: round(value / 1000, 2) for kind, value in sorted(by_kind.items(), key=lambda i: -i[1])},
        "by_kind_share": {kind: round(value / busy, 4) for kind, value in sorted(by_kind.items(), key=lambda i: -i[1])},
        "top_kernels_ms": [
            {"name": name[:160], "kind": kernel_kind(name), "ms": round(us / 1000, 2)} for name, us in top
        ],
    }
