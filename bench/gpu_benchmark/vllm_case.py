"""The vLLM cases (plugin or stock): throughput passes, single-record latency, optional kernel profile."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from bench.gpu_benchmark.engine_args import STOCK_TASK, plugin_engine_kwargs, start_engine, stock_engine_kwargs
from bench.gpu_benchmark.timing import WARMUP_RECORDS, gpu_memory, percentiles, repeated_rates, timed_passes
from bench.gpu_benchmark.traces import summarize_trace
from bench.gpu_benchmark.workdir import LONE, group_kind, load_encoded, save_logits

PROFILE_RECORDS = 64


def case_vllm(
    args: argparse.Namespace, work: Path, releases: dict[str, str], precision: str, mode: str, stock: bool = False
) -> dict[str, Any]:
    """vLLM on the BF16 or FP8 release: ``--repeats`` throughput passes over all records, then
    single-record latency and the latency of the same records sent a few at a time (``--group-sizes``), and
    (plugin) those records' logits against the same records' in the batched pass.
    With the plugin (option logits) or ``stock`` (no plugin: last-token ``embed``)."""
    import vllm

    import clef_plugin
    from bench.agreement import question_agreement

    ids, layouts = load_encoded(work)
    key = args.result_key or (f"vllm-stock-{precision}-{mode}" if stock else f"vllm-{precision}-{mode}")
    trace_dir = work / "profiles" / key
    profiler: dict[str, Any] = {}
    if args.profile:
        profiler["profiler_config"] = {
            "profiler": "torch",
            "torch_profiler_dir": str(trace_dir),
            "torch_profiler_with_stack": False,
            "torch_profiler_dump_cuda_time_total": False,
            "ignore_frontend": True,
        }
    kwargs = plugin_engine_kwargs(args, releases[precision], mode, profiler)
    if stock:
        kwargs = stock_engine_kwargs(kwargs)
    result: dict[str, Any] = {
        "vllm": vllm.__version__,
        "mode": mode,
        "plugin": not stock,
        "engine_kwargs": {key: str(value) for key, value in kwargs.items()},
    }
    llm, figures = start_engine(kwargs)
    result.update(figures)
    result["architecture"] = llm.llm_engine.model_config.architectures[0]
    prompts = [{"prompt_token_ids": item} for item in ids]
    if stock:
        params = [vllm.PoolingParams(task=STOCK_TASK) for _ in ids]
        task = STOCK_TASK
    else:
        params = [clef_plugin.pooling_params(layout, len(item)) for item, layout in zip(ids, layouts, strict=True)]
        task = clef_plugin.POOLING_TASK

    def encode(indices: range | list[int]) -> list[Any]:
        outputs = llm.encode(
            [prompts[i] for i in indices],
            pooling_params=[params[i] for i in indices],
            pooling_task=task,
            use_tqdm=False,
        )
        if stock:
            return [output.outputs.data.float().cpu() for output in outputs]
        return [clef_plugin.option_logits(output) for output in outputs]

    started = time.perf_counter()
    encode(range(min(WARMUP_RECORDS, len(ids))))
    encode([0])  # a lone record too, as the predictor's warm-up: the plugin captures its lone-prompt graphs here
    result["warmup_s"] = round(time.perf_counter() - started, 2)
    seconds, outputs = timed_passes(lambda: encode(range(len(ids))), args.repeats, "cpu")
    result.update(repeated_rates(len(ids), sum(map(len, ids)), seconds))
    result["memory"] = gpu_memory(args.device)
    if stock:
        result["output_shape"] = list(outputs[0].shape)
    else:
        save_logits(work, key, outputs)

    def timed_groups(size: int) -> tuple[list[float], list[Any]]:
        """The latency records sent ``size`` at a time, one encode call each: ms per call, and their outputs."""
        latencies, answered = [], []
        count = min(args.latency_records, len(ids)) // size * size
        for first in range(0, count, size):
            started = time.perf_counter()
            answered += encode(range(first, first + size))
            latencies.append(1000 * (time.perf_counter() - started))
        return latencies, answered

    latencies, alone = timed_groups(1)
    result["single_record_ms"] = percentiles(latencies)
    result["single_record_ms"]["all"] = [round(value, 2) for value in latencies]
    if not stock and alone:  # a lone record's step may run another graph than its batch's (whole-forward graphs)
        result["single_against_batched"] = question_agreement(layouts[: len(alone)], outputs[: len(alone)], alone)
        save_logits(work, key, alone, LONE)
    for size in args.group_sizes:  # one encode call of `size` records each: vLLM may run them in one step or more
        latencies, grouped = timed_groups(size)
        if not latencies:
            continue
        result.setdefault("group_ms", {})[str(size)] = percentiles(latencies)
        if not stock:
            agreement = question_agreement(layouts[: len(grouped)], outputs[: len(grouped)], grouped)
            result.setdefault("groups_against_batched", {})[str(size)] = agreement
            save_logits(work, key, grouped, group_kind(size))
    if args.profile:
        result["profile"] = {}
        for label, indices in (("batch", list(range(min(PROFILE_RECORDS, len(ids))))), ("single", [0])):
            since = time.time()
            llm.start_profile()
            started = time.perf_counter()
            encode(indices)
            wall = time.perf_counter() - started
            llm.stop_profile()
            summary = summarize_trace(trace_dir, since)
            summary.update(
                records=len(indices),
                prompt_tokens=sum(len(ids[i]) for i in indices),
                wall_ms_profiled=round(1000 * wall, 2),
            )
            result["profile"][label] = summary
    return result
