"""Gated DeltaNet prefill on one GPU: FlashInfer's Hopper kernel against FLA's Triton kernel.

Qwen3.5-9B's linear-attention layers (16 query/key heads, 32 value heads, head size 128) at the prefill
shapes the engine meets: one prompt of 546 or 2,048 tokens, 64 prompts of the benchmark's mean length
(the throughput batch), 32 short prompts. Both kernels get the same random inputs (L2-normalised q and k,
log-decays in [-0.5, 0) for FLA, their exponentials for FlashInfer, β in (0, 1), a random float32 initial
state). Reported per shape: each kernel's median time (``triton.testing.do_bench``), the relative
difference of the outputs and of the final states, and for the smallest shape both kernels against a
float64 recurrence (value head h reads query/key head h // 2). Both get the grouped-value layout vLLM
passes them (16 q/k heads, 32 value heads). FlashInfer's first call compiles its CuTe-DSL kernel; that
time is reported apart.

    python3 -m bench.gdn_prefill            # prints one JSON line per shape, then a table
    python3 -m bench.gdn_prefill --first-calls   # FlashInfer's compile times alone (run it twice: does a
                                                 # second process compile again?)
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

QK_HEADS = 16
V_HEADS = 32
HEAD_SIZE = 128


@dataclass(frozen=True)
class Shape:
    """A batch of prompts: its name and each prompt's length."""

    name: str
    lengths: tuple[int, ...]


def shapes(seed: int) -> list[Shape]:
    """The prefill batches measured (lengths of the 64-prompt batch drawn around 511 tokens)."""
    rng = random.Random(seed)
    return [
        Shape("1x546", (546,)),
        Shape("1x2048", (2048,)),
        Shape("64x~511", tuple(rng.randint(200, 822) for _ in range(64))),
        Shape("32x128", (128,) * 32),
    ]


def make_inputs(lengths: tuple[int, ...], seed: int) -> dict[str, torch.Tensor]:
    """Random inputs in FlashInfer's varlen layout ([tokens, heads, size])."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    tokens = sum(lengths)

    def normal(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator, device="cuda")

    q = F.normalize(normal(tokens, QK_HEADS, HEAD_SIZE), dim=-1).bfloat16()
    k = F.normalize(normal(tokens, QK_HEADS, HEAD_SIZE), dim=-1).bfloat16()
    v = normal(tokens, V_HEADS, HEAD_SIZE).bfloat16()
    log_decay = -0.5 * torch.rand(tokens, V_HEADS, generator=generator, device="cuda")
    beta = torch.sigmoid(normal(tokens, V_HEADS))
    state = 0.1 * normal(len(lengths), V_HEADS, HEAD_SIZE, HEAD_SIZE)  # [N, H, V, K]
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64, device="cuda")
    return {"q": q, "k": k, "v": v, "log_decay": log_decay, "beta": beta, "state": state, "cu_seqlens": offsets}


def run_flashinfer(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's prefill (SM90: CuTe DSL), as vLLM calls it: grouped values, decays as factors."""
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    output, state = chunk_gated_delta_rule(
        q=inputs["q"],
        k=inputs["k"],
        v=inputs["v"],
        g=torch.exp(inputs["log_decay"]),
        beta=inputs["beta"],
        initial_state=inputs["state"],
        output_final_state=True,
        cu_seqlens=inputs["cu_seqlens"],
    )
    return output, state  # [T, H, V], [N, H, V, K]


def run_fla(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """FLA's Triton chunked prefill on the same inputs (grouped values too; its state is [N, H, K, V])."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    output, state = chunk_gated_delta_rule(
        q=inputs["q"].unsqueeze(0),
        k=inputs["k"].unsqueeze(0),
        v=inputs["v"].unsqueeze(0),
        g=inputs["log_decay"].unsqueeze(0),
        beta=inputs["beta"].unsqueeze(0),
        initial_state=inputs["state"].transpose(-1, -2).contiguous(),
        output_final_state=True,
        cu_seqlens=inputs["cu_seqlens"],
    )
    return output.squeeze(0), state.transpose(-1, -2)


def reference(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule token by token in float64: S ← e^g S; S ← S + β (v − S k) kᵀ; o = scale · S q."""
    repeat = V_HEADS // QK_HEADS
    q = inputs["q"].double().repeat_interleave(repeat, dim=1) / HEAD_SIZE**0.5
    k = inputs["k"].double().repeat_interleave(repeat, dim=1)
    v, decay, beta = inputs["v"].double(), inputs["log_decay"].double().exp(), inputs["beta"].double()
    offsets = inputs["cu_seqlens"].tolist()
    outputs, states = torch.empty_like(v), []
    for index in range(len(offsets) - 1):
        state = inputs["state"][index].double().clone()  # [H, V, K]
        for t in range(offsets[index], offsets[index + 1]):
            state = state * decay[t, :, None, None]
            error = v[t] - torch.einsum("hvk,hk->hv", state, k[t])
            state = state + beta[t, :, None, None] * error[:, :, None] * k[t][:, None, :]
            outputs[t] = torch.einsum("hvk,hk->hv", state, q[t])
        states.append(state)
    return outputs, torch.stack(states)


def relative(candidate: torch.Tensor, target: torch.Tensor) -> float:
    """‖candidate − target‖ / ‖target‖ (NaN when anything is not finite)."""
    difference = candidate.double() - target.double()
    return float(difference.norm() / target.double().norm())


def measure(shape: Shape, seed: int) -> dict[str, Any]:
    """Agreement and median times of both kernels on one shape."""
    import triton.testing

    inputs = make_inputs(shape.lengths, seed)
    started = time.perf_counter()
    fi_output, fi_state = run_flashinfer(inputs)
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - started
    fla_output, fla_state = run_fla(inputs)
    result: dict[str, Any] = {
        "shape": shape.name,
        "tokens": sum(shape.lengths),
        "flashinfer_first_call_s": round(first_call_s, 2),
        "output_rel_diff": relative(fi_output, fla_output),
        "state_rel_diff": relative(fi_state, fla_state),
        "finite": bool(torch.isfinite(fi_output).all() and torch.isfinite(fla_output).all()),
    }
    if sum(shape.lengths) <= 600:
        ref_output, ref_state = reference(inputs)
        result["flashinfer_vs_float64"] = [relative(fi_output, ref_output), relative(fi_state, ref_state)]
        result["fla_vs_float64"] = [relative(fla_output, ref_output), relative(fla_state, ref_state)]
    result["flashinfer_ms"] = triton.testing.do_bench(lambda: run_flashinfer(inputs), return_mode="median")
    result["fla_ms"] = triton.testing.do_bench(lambda: run_fla(inputs), return_mode="median")
    result["speedup"] = result["fla_ms"] / result["flashinfer_ms"]
    return result


FIRST_CALL_SHAPES = (Shape("1x546", (546,)), Shape("4x256", (256,) * 4))
"""One shape of each of FlashInfer's SM90 variants: a lone prompt takes the context-parallel one (one sequence × 32
value heads is under half the 132 multiprocessors), four prompts the batched one (``_FullyFusedDeltaRuleSm90``)."""


def first_calls(seed: int) -> list[dict[str, Any]]:
    """FlashInfer's first and second call on each of :data:`FIRST_CALL_SHAPES`, in this process: the first compiles
    that variant's CuTe-DSL kernels unless something kept them from an earlier process."""
    results = []
    for index, shape in enumerate(FIRST_CALL_SHAPES):
        inputs = make_inputs(shape.lengths, seed + index)
        times = []
        for _ in range(2):
            started = time.perf_counter()
            run_flashinfer(inputs)
            torch.cuda.synchronize()
            times.append(round(time.perf_counter() - started, 3))
        results.append({"shape": shape.name, "first_call_s": times[0], "second_call_s": times[1]})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first-calls", action="store_true", help="only time FlashInfer's first calls (compiles)")
    args = parser.parse_args()
    if args.first_calls:
        for result in first_calls(args.seed):
            print(json.dumps(result), flush=True)
        return
    results = []
    for index, shape in enumerate(shapes(args.seed)):
        result = measure(shape, args.seed + index)
        print(json.dumps(result), flush=True)
        results.append(result)
    print(f"{'shape':<9} {'tokens':>6} {'FLA ms':>8} {'FI ms':>8} {'speed-up':>8} {'out rel':>9} {'state rel':>9}")
    for row in results:
        print(
            f"{row['shape']:<9} {row['tokens']:>6} {row['fla_ms']:>8.3f} {row['flashinfer_ms']:>8.3f} "
            f"{row['speedup']:>8.2f} {row['output_rel_diff']:>9.2e} {row['state_rel_diff']:>9.2e}"
        )


if __name__ == "__main__":
    main()
