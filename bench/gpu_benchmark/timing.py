"""Timed passes and the figures made of them: rates, medians and spreads, latency percentiles, memory."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

WARMUP_RECORDS = 32


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def gpu_memory(device: str) -> dict[str, float]:
    """Device-wide used memory (all processes, vLLM's KV cache reservation included) and this process's peak."""
    import torch

    if not device.startswith("cuda"):
        return {}
    free, total = torch.cuda.mem_get_info()
    return {
        "device_used_gib": round((total - free) / 2**30, 2),
        "process_peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
    }


def rates(records: int, tokens: int, seconds: float) -> dict[str, float]:
    return {
        "records": records,
        "prompt_tokens": tokens,
        "seconds": round(seconds, 3),
        "records_per_s": round(records / seconds, 2),
        "prompt_tokens_per_s": round(tokens / seconds, 1),
    }


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min and max of repeated measurements (and the runs themselves, in order)."""
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
        "runs": [round(value, 2) for value in values],
    }


def timed_passes(run: Callable[[], Any], repeats: int, device: str) -> tuple[list[float], Any]:
    """Seconds of ``repeats`` calls of ``run`` (device work included) and the first call's result."""
    seconds, first = [], None
    for repeat in range(repeats):
        sync(device)
        started = time.perf_counter()
        value = run()
        sync(device)
        seconds.append(time.perf_counter() - started)
        if repeat == 0:
            first = value
    return seconds, first


def repeated_rates(records: int, tokens: int, seconds: list[float]) -> dict[str, Any]:
    """Rates of the median pass (the headline), with the spread of prompt tokens/s over all passes."""
    result: dict[str, Any] = rates(records, tokens, statistics.median(seconds))
    result["repeats"] = len(seconds)
    result["prompt_tokens_per_s_spread"] = spread([tokens / value for value in seconds])
    return result


def percentiles(latencies_ms: list[float]) -> dict[str, float]:
    """p50/mean/p95/min/max of latencies (ms). The mean beside the p50: a lone prompt's time is two-valued (at the
    512 → 513-token step), and a p50 falls in one mode or the other with the mix of prompts (BENCHMARKS.md, R45)."""
    ordered = sorted(latencies_ms)
    return {
        "p50": round(statistics.median(ordered), 2),
        "mean": round(statistics.fmean(ordered), 2),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
        "min": round(ordered[0], 2),
        "max": round(ordered[-1], 2),
        "count": len(ordered),
    }
