"""vLLM keyword arguments of the cases: compilation modes, variants laid over them, stock vLLM."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench.gpu_benchmark.names import MODES


def mode_kwargs(mode: str, capture_sizes: list[int] | None) -> dict[str, Any]:
    """vLLM keyword arguments for a compilation mode (see the module docstring)."""
    if mode == "eager":
        return {"enforce_eager": True}
    if mode == "compile":
        return {"enforce_eager": False, "compilation_config": {"cudagraph_mode": "NONE"}}
    if mode == "graphs":  # without capture_sizes: the plugin's default, piecewise graphs at prefill sizes
        from clef_plugin.api import graph_compilation_config

        if capture_sizes is None:
            return {"enforce_eager": False}
        return {"enforce_eager": False, "compilation_config": graph_compilation_config(capture_sizes)}
    raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def overlay_engine_args(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """vLLM keyword arguments ``base`` overridden by ``extra``; two ``compilation_config`` dicts merge key by key."""
    merged = {**base, **extra}
    if "compilation_config" in base and "compilation_config" in extra:
        merged["compilation_config"] = {**base["compilation_config"], **extra["compilation_config"]}
    return merged


def merge_engine_args(
    mode: str, mode_args: dict[str, Any], extra: dict[str, Any], max_model_len: int
) -> dict[str, Any]:
    """The mode's vLLM keyword arguments overridden by ``extra``; a ``compilation_config`` in ``extra``
    is merged into the mode's (in graphs mode without one: the plugin's default prefill graphs)."""
    from clef_plugin.api import graph_compilation_config, prefill_capture_sizes

    if "compilation_config" in extra and mode == "graphs" and "compilation_config" not in mode_args:
        mode_args = {**mode_args, "compilation_config": graph_compilation_config(prefill_capture_sizes(max_model_len))}
    return overlay_engine_args(mode_args, extra)


def plugin_engine_kwargs(
    args: argparse.Namespace,
    release: str,
    mode: str,
    settings: dict[str, Any] | None = None,
    *,
    max_model_len: int | None = None,
    vision: bool = False,
) -> dict[str, Any]:
    """``clef_plugin.engine_kwargs`` of a vLLM case: the mode's arguments, ``--engine-args`` (or a variant's) and
    ``settings`` on top, the scheduler options, FLA's Triton GDN prefill on CUDA; ``max_model_len`` (default:
    ``--max-model-len``) and ``vision`` (the vision tower loaded) as the vision case asks."""
    import clef_plugin

    length = max_model_len or args.max_model_len
    extra = merge_engine_args(mode, mode_kwargs(mode, args.capture_sizes), json.loads(args.engine_args), length)
    if args.device.startswith("cuda"):
        extra.setdefault("gdn_prefill_backend", "triton")  # flashinfer's GDN kernel is not in the bundle
    extra.update(settings or {})
    return clef_plugin.engine_kwargs(
        release,
        max_model_len=extra.pop("max_model_len", length),
        gpu_memory_utilization=extra.pop("gpu_memory_utilization", args.gpu_memory_utilization),
        max_num_batched_tokens=extra.pop("max_num_batched_tokens", args.max_num_batched_tokens),
        max_num_seqs=extra.pop("max_num_seqs", args.max_num_seqs),
        vision=vision,
        **extra,
    )


def stock_engine_kwargs(plugin_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The plugin's engine arguments for stock vLLM: the release's own architecture (no override), and
    vLLM's sequence pooler (last token, ``embed``) instead of the head; every other setting unchanged."""
    from vllm.config import PoolerConfig

    stock = {key: value for key, value in plugin_kwargs.items() if key != "hf_overrides"}
    stock["pooler_config"] = PoolerConfig(task=STOCK_TASK, seq_pooling_type="LAST")
    return stock


STOCK_TASK = "embed"


def start_engine(kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``vllm.LLM(**kwargs)``, timed: the engine and its figures (start seconds, the scheduler's token and sequence
    limits and whether it schedules asynchronously, as vLLM resolved them)."""
    import vllm

    started = time.perf_counter()
    llm = vllm.LLM(**kwargs)
    start_s = round(time.perf_counter() - started, 2)
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    return llm, {
        "start_s": start_s,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "max_num_seqs": scheduler.max_num_seqs,
        "async_scheduling": scheduler.async_scheduling,
    }
