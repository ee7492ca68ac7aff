"""Process orchestration: each case in its own process group, killed whole past the time budget."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.gpu_benchmark.engine_args import overlay_engine_args
from bench.gpu_benchmark.http_case import case_http
from bench.gpu_benchmark.names import MODES, PRECISIONS, STOCK_CASES, base_case, variant_name
from bench.gpu_benchmark.reference_cases import case_head, case_transformers
from bench.gpu_benchmark.vision_case import case_vision
from bench.gpu_benchmark.vllm_case import case_vllm
from bench.gpu_benchmark.workdir import log, write_json
from clef_contract.predictor import COMPILE_CACHE_DIR, COMPILE_CACHE_ENV


def vllm_case(precision: str, mode: str, stock: bool = False) -> Callable[..., dict[str, Any]]:
    return lambda args, work, releases: case_vllm(args, work, releases, precision, mode, stock)


CASE_FUNCTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "transformers": case_transformers,
    "head": case_head,
    **{f"vllm-{p}-{m}": vllm_case(p, m) for p in PRECISIONS for m in MODES},
    **{f"vllm-stock-{p}-{m}": vllm_case(p, m, stock=True) for p in ("bf16", "fp8") for m in MODES},
    "vision": case_vision,
    "http": case_http,
    "http-dp2": lambda args, work, releases: case_http(args, work, releases, data_parallel=2),
}


def run_child(args: argparse.Namespace) -> int:
    """Entry of a case's own process: run it, write its result file (errors included)."""
    work = Path(args.work)
    releases = json.loads((work / "releases.json").read_text())
    result_file = work / "results" / f"{args.result_key or args.run_case}.json"
    try:
        result = CASE_FUNCTIONS[args.run_case](args, work, releases)
        status = 0
    except Exception as exc:  # noqa: BLE001 (every failure is reported in the summary, with its traceback)
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
        status = 1
    result["case"] = args.result_key or args.run_case
    write_json(result_file, result)
    return status


def child_command(args: argparse.Namespace, key: str) -> list[str]:
    case = base_case(key)
    engine_args = overlay_engine_args(json.loads(args.engine_args), args.variants.get(variant_name(key) or "", {}))
    command = [
        sys.executable,
        "-m",
        "bench.gpu_benchmark",
        "--run-case",
        case,
        "--result-key",
        key,
        "--work",
        str(args.work),
        "--device",
        args.device,
        "--max-model-len",
        str(args.max_model_len),
        "--gpu-memory-utilization",
        str(args.gpu_memory_utilization),
        "--transformers-batch-tokens",
        str(args.transformers_batch_tokens),
        "--transformers-records",
        str(args.transformers_records or 0),
        "--engine-args",
        json.dumps(engine_args),
        "--http-clients",
        ",".join(map(str, args.http_clients)),
        "--http-requests",
        str(args.http_requests),
        "--latency-records",
        str(args.latency_records),
        "--group-sizes",
        ",".join(map(str, args.group_sizes)),
        "--seed",
        str(args.seed),
        "--vision-records",
        str(args.vision_records),
        "--vision-latency-requests",
        str(args.vision_latency_requests),
        "--vision-max-model-len",
        str(args.vision_max_model_len),
        "--http-ready-timeout",
        str(args.http_ready_timeout),
        "--http-mode",
        args.http_mode,
        "--repeats",
        str(args.repeats),
        "--http-single-requests",
        str(args.http_single_requests),
        "--http-repeat-fractions",
        ",".join(map(str, args.http_repeat_fractions)),
        "--http-repeat-clients",
        str(args.http_repeat_clients),
        "--predictor-args",
        json.dumps(args.http_variants.get(variant_name(key) or "", [])),
    ] + (["--profile"] if args.profile else [])
    if args.capture_sizes:
        command += ["--capture-sizes", ",".join(map(str, args.capture_sizes))]
    for flag, value in (
        ("--max-num-batched-tokens", args.max_num_batched_tokens),
        ("--max-num-seqs", args.max_num_seqs),
    ):
        if value is not None:
            command += [flag, str(value)]
    return command


def run_process_group(command: list[str], output: Any, env: dict[str, str], timeout: float) -> int:
    """Run ``command`` in a new process group; past ``timeout`` kill the whole group and raise
    ``TimeoutExpired``, so no process it started (vLLM's engine cores, a predictor) keeps a GPU's memory."""
    process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise


def run_case_process(args: argparse.Namespace, deadline: float, key: str) -> dict[str, Any]:
    """Run one case in its own process with the time left; return its result (or why it has none).

    ``key`` names the case, its variant and repetition; the result is stored as ``results/<key>.json``.
    """
    result_file = Path(args.work) / "results" / f"{key}.json"
    result_file.unlink(missing_ok=True)
    env = dict(os.environ)
    cache = Path(args.cache_dir or Path(args.work) / "cache").resolve()
    # The layout of a predictor pod's compile-cache volume, rooted at the cache folder.
    env.update({name: value.replace(COMPILE_CACHE_DIR, str(cache)) for name, value in COMPILE_CACHE_ENV.items()})
    if base_case(key) in STOCK_CASES:
        env["VLLM_PLUGINS"] = ""  # stock vLLM: no general plugin is loaded, ours included
    if args.device == "cpu":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    timeout = max(deadline - time.time(), 1)
    log_path = Path(args.work) / f"case-{key}.log"
    log(f"case {key}: starting (at most {timeout:.0f} s, log {log_path})")
    started = time.perf_counter()
    with log_path.open("w") as log_file:
        try:
            run_process_group(child_command(args, key), log_file, env, timeout)
        except subprocess.TimeoutExpired:
            failed = {"case": key, "error": f"timed out after {timeout:.0f} s (time budget)", "log": str(log_path)}
            if result_file.is_file():  # a case that writes its figures as it goes (the vision case) keeps them
                failed["partial"] = json.loads(result_file.read_text())
            return failed
    if not result_file.is_file():
        tail = log_path.read_text()[-3000:]
        return {"case": key, "error": "the case process died without a result", "log_tail": tail}
    result = json.loads(result_file.read_text())
    result["wall_s"] = round(time.perf_counter() - started, 1)
    return result
