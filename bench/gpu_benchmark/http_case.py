"""The http cases: ``python -m predictor`` started as on the GPU, then closed-loop HTTP loads."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.gpu_benchmark.engine_args import mode_kwargs
from bench.gpu_benchmark.metrics import answer_cache_counts, count_changes, encode_bodies, scrape_timers, timer_means
from bench.gpu_benchmark.workdir import log
from clef_tools.local_server import NotReady, free_port, http_ok, stop_process, wait_until_ready


class UniqueBodies:
    """Request bodies for HTTP loads, none sent twice in a case: the records in order, then again with a
    repetition marker at the start of the state (a few tokens), so an answer cache never serves them.
    Called with the load's request index, which repeats between loads and warm-ups, and ignored."""

    def __init__(self, bodies: list[dict[str, Any]]) -> None:
        self.bodies = bodies
        self.sent = 0

    def __call__(self, _index: int) -> dict[str, Any]:
        rounds, position = divmod(self.sent, len(self.bodies))
        self.sent += 1
        body = self.bodies[position]
        return body if rounds == 0 else {**body, "state": f"#{rounds} {body['state']}"}


class RepeatedBodies:
    """Request bodies of which a share ``fraction`` repeats one of :data:`bench.load.HOT_BODIES` bodies
    (the same seeded draw per request index as ``python -m bench.load --repeat-fraction``), the others
    from ``unique`` (never sent before). The repeated bodies are marked with ``label``, so another load's
    repeated bodies are not already cached."""

    def __init__(self, unique: UniqueBodies, fraction: float, label: str) -> None:
        self.unique = unique
        self.fraction = fraction
        self.label = label

    def __call__(self, index: int) -> dict[str, Any]:
        from bench.load import repeated_index

        chosen = repeated_index(index, self.fraction)
        if chosen >= 0:
            return self.unique(index)
        hot = -1 - chosen
        body = self.unique.bodies[hot]
        return {**body, "state": f"#{self.label}-{hot} {body['state']}"}


def predictor_command(args: argparse.Namespace, release: str, port: int, data_parallel: int) -> list[str]:
    """``python -m predictor`` serving ``release`` with the vLLM engine as the http cases start it."""
    command = [
        sys.executable,
        "-m",
        "predictor",
        "--model-dir",
        release,
        "--model-name",
        "clef-flash",
        "--engine",
        "vllm",
        "--http_port",
        str(port),
        "--max-model-len",
        str(args.max_model_len),
        "--gpu-memory-utilization",
        str(args.gpu_memory_utilization),
    ]
    if args.max_num_batched_tokens is not None:
        command += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if data_parallel > 1:
        command += ["--dp", str(data_parallel)]
    mode = mode_kwargs(args.http_mode, args.capture_sizes)
    if mode["enforce_eager"]:
        command.append("--enforce-eager")
    elif "compilation_config" in mode:
        command += ["--compilation-config", json.dumps(mode["compilation_config"])]
    return command + list(args.predictor_args)


def case_http(args: argparse.Namespace, work: Path, releases: dict[str, str], data_parallel: int = 1) -> dict[str, Any]:
    """``python -m predictor`` on the FP8 release with the vLLM engine (``--dp data_parallel``), then
    closed-loop HTTP clients; no request body is sent twice (:class:`UniqueBodies`)."""
    for module in ("kserve", "httpx", "predictor"):
        if importlib.util.find_spec(module) is None:  # an http case asked for cannot run: a failure
            raise ModuleNotFoundError(f"{module} is not importable here: install the 'serve' extra's packages")
    from bench.load import http_load

    port = free_port()
    command = predictor_command(args, releases["fp8"], port, data_parallel)
    log_path = work / f"{args.result_key or 'http'}-predictor.log"
    log_file = log_path.open("w")
    started = time.perf_counter()
    server = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    result: dict[str, Any] = {"command": " ".join(command)}
    try:
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_ready(
                server,
                lambda: http_ok(f"{url}/v1/models/clef-flash"),
                args.http_ready_timeout,
                interval=0.5,
                what="the predictor",
            )
        except NotReady as exc:
            raise RuntimeError(f"{exc}; see {log_path}") from None
        result["ready_s"] = round(time.perf_counter() - started, 1)
        result["mode"] = args.http_mode
        result["predictor_args"] = list(args.predictor_args)
        result["data_parallel"] = data_parallel
        bodies = UniqueBodies(json.loads((work / "records.json").read_text()))
        result["loads"] = []
        previous, prepared = scrape_timers(url), encode_bodies(url)
        for clients in args.http_clients:
            count = max(args.http_requests, 4 * clients) if clients > 1 else args.http_single_requests
            log(f"http: {clients} clients, {count} requests")
            load = asyncio.run(http_load(url, clients, count, warmup=min(max(8, clients), count), body=bodies))
            # server-side figures include the load's few warm-up requests
            current, now_prepared = scrape_timers(url), encode_bodies(url)
            result["loads"].append(
                {
                    "clients": clients,
                    **load.summary(),
                    "server_ms_mean": timer_means(previous, current),
                    "encode_bodies": count_changes(prepared, now_prepared),
                }
            )
            previous, prepared = current, now_prepared
        result["repeat_loads"] = []
        for fraction in args.http_repeat_fractions:
            clients, count = args.http_repeat_clients, max(args.http_requests, 4 * args.http_repeat_clients)
            log(f"http: {clients} clients, {count} requests, {fraction:.0%} repeated")
            counts_before = answer_cache_counts(url)
            repeated = RepeatedBodies(bodies, fraction, label=f"r{len(result['repeat_loads'])}")
            load = asyncio.run(http_load(url, clients, count, warmup=min(max(8, clients), count), body=repeated))
            counts = answer_cache_counts(url)
            result["repeat_loads"].append(
                {
                    "repeat_fraction": fraction,
                    "clients": clients,
                    **load.summary(),
                    "answer_cache": count_changes(counts_before, counts),
                }
            )
    finally:
        stop_process(server)
        log_file.close()
    return result
