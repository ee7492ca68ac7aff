"""Clef-flash on one GPU: transformers BF16 vs vLLM + plugin BF16 / FP8 / NVFP4, same records.

    python -m bench.gpu_benchmark --work /tmp/clefbench [--cases prepare,transformers,head,vllm-fp8-graphs,
        vllm-stock-fp8-graphs,http] [--records 1400] [--tokens 512] [--repeats 3] [--time-budget 540] [--profile]
    python -m bench.gpu_benchmark --device cpu --scale tiny --records 8 --work /tmp/smoke   # CPU smoke run

Stages (each engine case runs in its own process group, killed whole past the time budget, so a crash, a
leak or a left-over engine process cannot spoil the next):
- prepare: the random-weight BF16 release (``clef_tools.fullsize``, built on the device) and its
  FP8_DYNAMIC copy (``clef_tools.quantize``) unless ``--bf16``/``--fp8`` are given, and its NVFP4 copy
  (``--scheme NVFP4``) when an nvfp4 case is asked for (or ``--nvfp4`` names one); N seeded records
  (``clef_tools.sized_records``) encoded with the release's tokenizer. Cached in ``--work`` and reused.
- transformers: the reference engine (``TransformersScorer``) in BF16, length-sorted padded batches: a
  first pass in a fresh process (each new batch shape pays its one-off costs), then ``--repeats`` passes at
  steady state (the headline), the backbone alone, and the backbone/head split (first pass and steady).
- head: the joint schema head alone on random hidden states, per record at batch sizes 1/16/64; one
  record at a time through the dynamic forward, the static bucketed pass, and (CUDA) its graph replays.
- vllm-{bf16,fp8,nvfp4}-{eager,compile,graphs}: vLLM + the plugin, one offline ``encode`` over all records
  (NVFP4 on a GPU without FP4 tensor cores, such as Hopper, runs vLLM's weight-only Marlin FP4 fallback);
  then single-record latency. eager: no torch.compile, no CUDA graphs; compile: torch.compile only;
  graphs: torch.compile + piecewise CUDA graphs (the plugin's prefill sizes, or ``--capture-sizes``). With ``--profile``, one
  throughput batch and one single record also run under vLLM's torch profiler, and the GPU kernel
  time is summed by kind (GEMM, Gated DeltaNet, attention, ...). A case named twice runs twice
  (the second start measures the warm compile cache; its result is stored as ``<case>-again``).
  Throughput is the median of ``--repeats`` passes over all records (min, max and every pass beside it).
- vllm-stock-{bf16,fp8}-{mode}: stock vLLM, no plugin loaded (``VLLM_PLUGINS`` empty): the release's own
  architecture, the same engine settings, vLLM's last-token ``embed`` pooler: the upper bound.
- http, http-dp2: ``python -m predictor`` (vLLM engine, FP8 release, ``--http-mode``; ``--dp 2`` for
  http-dp2) and closed-loop HTTP clients (``--http-clients``, default 1/8/64/256; ``--http-requests`` per
  multi-client load, default 2,000; no body sent twice, so an answer cache cannot serve any). Then, for
  each of ``--http-repeat-fractions`` (e.g. ``0,0.5,0.9``), one load at ``--http-repeat-clients`` (64) in
  which that share of the requests repeats one of 8 bodies (the answer cache and in-flight merging at
  work; its hit/merged/miss counts beside the figures, the load's warm-up included). Needs the ``serve`` extra's packages.
- ``<vllm case>+<name>``: that vLLM case again with the engine arguments of ``--variant name=JSON`` on
  top of ``--engine-args`` (a ``compilation_config`` there is merged into the mode's), e.g.
  ``--variant async='{"async_scheduling": true}' --cases prepare,vllm-fp8-graphs,vllm-fp8-graphs+async``;
  its logits are compared with the plain case's.
- ``http+<name>``, ``http-dp2+<name>``: that http case again with the extra predictor arguments of
  ``--http-args name='ARGS'`` (a shell-quoted string), e.g. ``--http-args enc4='--encode-processes 4'
  --cases prepare,http+enc0,http+enc4`` with ``--http-args enc0='--encode-processes 0'``; stored under
  its key (``http+enc4``).
Compile, Inductor and Triton caches (autotuning results included) live in ``--cache-dir`` (default:
``--work``/cache), shared by all cases, laid out as on a predictor pod's compile-cache volume.
Each case reports engine start, warm-up, records/s, prompt tokens/s and GPU memory. Agreement
(top-1 per question, mean KL(BF16 ‖ FP8), and likewise BF16 and FP8 against NVFP4) is computed from the logits the cases saved in ``--work``,
also across invocations, so the cases may run in separate calls. Weights are random: figures measure
speed, and agreement on random weights only bounds the numerical effect of FP8.
The summary goes to ``--out``/gpu_benchmark.json (default: the --work folder).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from clef_contract.predictor import COMPILE_CACHE_DIR, COMPILE_CACHE_ENV

MODES = ("eager", "compile", "graphs")
PRECISIONS = ("bf16", "fp8", "nvfp4")
PLUGIN_CASES = tuple(f"vllm-{precision}-{mode}" for precision in PRECISIONS for mode in MODES)
STOCK_CASES = tuple(f"vllm-stock-{precision}-{mode}" for precision in ("bf16", "fp8") for mode in MODES)
VLLM_CASES = (*PLUGIN_CASES, *STOCK_CASES)
HTTP_CASES = ("http", "http-dp2")
CASES = ("prepare", "transformers", "head", *VLLM_CASES, *HTTP_CASES)
ENGINE_CASES = ("transformers", *VLLM_CASES)
# Rough lower bounds (s) for a stage on the full shape; a stage does not start with less time left.
MIN_SECONDS = {"prepare": 120, "transformers": 120, "head": 30, **{case: 150 for case in HTTP_CASES},
               **{case: 120 for case in VLLM_CASES}}
VARIANT_NAME = re.compile(r"[a-z0-9_]+")
WARMUP_RECORDS = 32
PROFILE_RECORDS = 64
# Kernel kinds for the profile summary: the first pattern found in a kernel's name (lower case) wins.
KERNEL_KINDS = (
    ("gdn", ("chunk_", "gated_delta", "fused_recurrent", "solve_tril", "l2norm", "kkt", "cumsum", "fused_gdn",
             "recompute_w_u", "merge_16x16", "fused_post_conv")),
    ("conv1d", ("causal_conv1d", "conv1d")),
    ("fused (inductor)", ("triton_",)),
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "matmul", "wgmma", "cublas")),
    ("fp8 quant", ("quant",)),
    ("norm", ("norm",)),
    ("activation", ("silu", "act_and_mul", "sigmoid", "gelu", "softplus")),
    ("copy/elementwise", ("elementwise", "copy", "cat", "index", "fill", "reduce")),
)


# ----------------------------------------------------------------------------- helpers


def _log(message: str) -> None:
    print(f"[gpu_benchmark {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _write_json(path: Path, data: Any) -> None:
    """Write ``path`` whole or not at all: invocations sharing a ``--work`` folder (one per GPU) read
    ``releases.json`` and the records while another may be writing them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(data, indent=2, default=str) + "\n")
    partial.replace(path)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _gpu_memory(device: str) -> dict[str, float]:
    """Device-wide used memory (all processes, vLLM's KV cache reservation included) and this process's peak."""
    import torch

    if not device.startswith("cuda"):
        return {}
    free, total = torch.cuda.mem_get_info()
    return {
        "device_used_gib": round((total - free) / 2**30, 2),
        "process_peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
    }


def _environment() -> dict[str, Any]:
    info: dict[str, Any] = {"python": sys.version.split()[0]}
    for module in ("torch", "transformers", "vllm", "compressed_tensors", "fla", "causal_conv1d", "kserve"):
        spec = importlib.util.find_spec(module)
        info[module] = None if spec is None else "importable"
    try:
        import torch
        import transformers

        info["torch"], info["transformers"] = torch.__version__, transformers.__version__
    except ImportError as exc:
        info["import_error"] = str(exc)
    try:
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        info["gpu"] = subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["gpu"] = None
    return info


def _load_encoded(work: Path) -> tuple[list[list[int]], list[Any]]:
    from clef_head.layout import RecordLayout

    data = json.loads((work / "encoded.json").read_text())
    return [item["input_ids"] for item in data], [RecordLayout.from_wire(item["layout"]) for item in data]


def _save_logits(work: Path, case: str, logits: list[Any]) -> None:
    import torch

    torch.save([value.float().cpu() for value in logits], work / f"logits-{case}.pt")


def _rates(records: int, tokens: int, seconds: float) -> dict[str, float]:
    return {
        "records": records,
        "prompt_tokens": tokens,
        "seconds": round(seconds, 3),
        "records_per_s": round(records / seconds, 2),
        "prompt_tokens_per_s": round(tokens / seconds, 1),
    }


# ----------------------------------------------------------------------------- prepare (parent)


def prepare(args: argparse.Namespace, work: Path, deadline: float) -> dict[str, Any]:
    """Build or reuse the releases and the encoded records."""
    result: dict[str, Any] = {}
    bf16 = Path(args.bf16) if args.bf16 else work / f"release-{args.scale}-bf16"
    fp8 = Path(args.fp8) if args.fp8 else work / f"release-{args.scale}-fp8"
    if not (bf16 / "config.json").is_file():
        if args.bf16:
            raise FileNotFoundError(f"--bf16 {bf16}: no config.json")
        command = [sys.executable, "-m", "clef_tools.fullsize", str(bf16), "--scale", args.scale, "--device", args.device]
        result["build_bf16"] = _run_json(command, deadline)
    if not (fp8 / "config.json").is_file():
        if args.fp8:
            raise FileNotFoundError(f"--fp8 {fp8}: no config.json")
        command = [sys.executable, "-m", "clef_tools.quantize", str(bf16), str(fp8), "--device", args.device]
        result["quantize_fp8"] = _run_json(command, deadline)
    result["bf16"], result["fp8"] = str(bf16), str(fp8)
    if args.nvfp4 or any("nvfp4" in case for case in args.cases.split(",")):
        nvfp4 = Path(args.nvfp4) if args.nvfp4 else work / f"release-{args.scale}-nvfp4"
        if not (nvfp4 / "config.json").is_file():
            if args.nvfp4:
                raise FileNotFoundError(f"--nvfp4 {nvfp4}: no config.json")
            command = [sys.executable, "-m", "clef_tools.quantize", str(bf16), str(nvfp4), "--scheme", "NVFP4",
                       "--device", args.device]
            result["quantize_nvfp4"] = _run_json(command, deadline)
        result["nvfp4"] = str(nvfp4)
    meta = {"records": args.records, "seed": args.seed, "tokens": args.tokens, "tokenizer": str(bf16)}
    meta_file = work / "records-meta.json"
    if not (meta_file.is_file() and json.loads(meta_file.read_text()) == meta and (work / "encoded.json").is_file()):
        from transformers import AutoTokenizer

        from clef_tools.sized_records import make_records
        from clef_head.encoder import encode_request
        from clef_head.request import parse_request

        started = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(bf16)
        bodies = make_records(tokenizer, args.records, seed=args.seed, tokens=args.tokens)
        encoded = [encode_request(tokenizer, parse_request(body), max_length=args.max_model_len) for body in bodies]
        _write_json(work / "records.json", bodies)
        _write_json(
            work / "encoded.json", [{"input_ids": item.input_ids, "layout": item.layout.to_wire()} for item in encoded]
        )
        _write_json(meta_file, meta)
        for stale in work.glob("logits-*.pt"):  # logits of other records cannot be compared
            stale.unlink()
        result["records_s"] = round(time.perf_counter() - started, 1)
    ids, layouts = _load_encoded(work)
    lengths = [len(item) for item in ids]
    result["records"] = {
        "count": len(ids),
        "prompt_tokens": sum(lengths),
        "mean_tokens": round(statistics.mean(lengths), 1),
        "min_tokens": min(lengths),
        "max_tokens": max(lengths),
        "mean_questions": round(statistics.mean(len(layout.questions) for layout in layouts), 2),
        "mean_options": round(statistics.mean(layout.option_count for layout in layouts), 2),
    }
    return result


def _run_json(command: list[str], deadline: float) -> dict[str, Any]:
    """Run a command that prints one JSON line last; raise with its stderr tail on failure."""
    timeout = max(deadline - time.time(), 1)
    _log("running " + " ".join(command))
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{command[2]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- cases (child processes)


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min and max of repeated measurements (and the runs themselves, in order)."""
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2), "runs": [round(value, 2) for value in values]}


def timed_passes(run: Callable[[], Any], repeats: int, device: str) -> tuple[list[float], Any]:
    """Seconds of ``repeats`` calls of ``run`` (device work included) and the first call's result."""
    seconds, first = [], None
    for repeat in range(repeats):
        _sync(device)
        started = time.perf_counter()
        value = run()
        _sync(device)
        seconds.append(time.perf_counter() - started)
        if repeat == 0:
            first = value
    return seconds, first


def repeated_rates(records: int, tokens: int, seconds: list[float]) -> dict[str, Any]:
    """Rates of the median pass (the headline), with the spread of prompt tokens/s over all passes."""
    result: dict[str, Any] = _rates(records, tokens, statistics.median(seconds))
    result["repeats"] = len(seconds)
    result["prompt_tokens_per_s_spread"] = spread([tokens / value for value in seconds])
    return result


def case_transformers(args: argparse.Namespace, work: Path, releases: dict[str, str]) -> dict[str, Any]:
    """The transformers reference engine in BF16: a first pass over all records in a fresh process, then
    ``--repeats`` steady-state passes (every batch shape already run once), and the backbone/head split."""
    import torch

    from clef_head.encoder import EncodedRequest
    from predictor.engines.reference import TransformersScorer

    ids, layouts = _load_encoded(work)
    ids = ids[: args.transformers_records or len(ids)]
    encoded = [EncodedRequest(input_ids=i, layout=layout) for i, layout in zip(ids, layouts)]
    tokens = sum(map(len, ids))
    result: dict[str, Any] = {"fla": importlib.util.find_spec("fla") is not None}
    started = time.perf_counter()
    scorer = TransformersScorer(
        releases["bf16"], device=args.device, dtype=torch.bfloat16,
        max_length=args.max_model_len, max_batch_tokens=args.transformers_batch_tokens,
    )
    _sync(args.device)
    result["start_s"] = round(time.perf_counter() - started, 2)
    result["attention"] = getattr(scorer.backbone.config, "_attn_implementation", None)
    result["batching"] = f"length-sorted, right-padded, <= {args.transformers_batch_tokens} padded tokens per batch"
    started = time.perf_counter()
    scorer.score(encoded[:WARMUP_RECORDS])
    _sync(args.device)
    result["warmup_s"] = round(time.perf_counter() - started, 2)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    # First pass: each new batch shape pays its one-off costs (Triton JIT and autotuning, kernel plans).
    first, logits = timed_passes(lambda: scorer.score(encoded), 1, args.device)
    result["first_pass"] = _rates(len(encoded), tokens, first[0])
    _save_logits(work, "transformers", logits)
    # Steady state: the same batches again, every shape warm.
    steady, _ = timed_passes(lambda: scorer.score(encoded), args.repeats, args.device)
    result.update(repeated_rates(len(encoded), tokens, steady))
    backbone, _ = timed_passes(lambda: scorer_hidden_states(scorer, encoded), args.repeats, args.device)
    result["backbone_only"] = repeated_rates(len(encoded), tokens, backbone)
    result["memory"] = _gpu_memory(args.device)
    result["split"] = transformers_split(args, scorer, encoded)
    return result


def scorer_hidden_states(scorer: Any, encoded: list[Any]) -> None:
    """The backbone alone over the batches :meth:`TransformersScorer.score` forms (the head skipped)."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].input_ids))
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and len(encoded[order[end]].input_ids) * (end - start + 1) <= scorer.max_batch_tokens:
            end += 1
        scorer.hidden_states([encoded[i] for i in order[start:end]])
        start = end


def transformers_split(args: argparse.Namespace, scorer: Any, encoded: list[Any]) -> dict[str, Any]:
    """Backbone vs head time on length-sorted batches of a subset, first pass and again (steady)."""
    import torch

    subset = sorted(encoded[: min(len(encoded), 256)], key=lambda item: len(item.input_ids))
    per_batch = max(1, args.transformers_batch_tokens // max(len(item.input_ids) for item in subset))
    split: dict[str, Any] = {"records": len(subset), "records_per_batch": per_batch}
    for label in ("first_pass", "steady"):
        backbone_s = head_s = 0.0
        for start in range(0, len(subset), per_batch):
            batch = subset[start : start + per_batch]
            _sync(args.device)
            t0 = time.perf_counter()
            hidden = scorer.hidden_states(batch)
            _sync(args.device)
            t1 = time.perf_counter()
            with torch.inference_mode():
                scorer.head(
                    hidden, [torch.tensor(item.input_ids, device=scorer.device) for item in batch],
                    [item.layout for item in batch], scorer.lm_head_weight,
                )
            _sync(args.device)
            backbone_s, head_s = backbone_s + t1 - t0, head_s + time.perf_counter() - t1
        split[label] = {
            "backbone_ms_per_record": round(1000 * backbone_s / len(subset), 3),
            "head_ms_per_record": round(1000 * head_s / len(subset), 3),
            "head_share": round(head_s / (head_s + backbone_s), 4),
        }
    split["head_share"] = split["steady"]["head_share"]
    return split


def case_head(args: argparse.Namespace, work: Path, releases: dict[str, str]) -> dict[str, Any]:
    """The head alone on random hidden states: ms per record at several batch sizes."""
    import torch
    from safetensors import safe_open

    from clef_head.checkpoint import load_head

    ids, layouts = _load_encoded(work)
    dtype = torch.bfloat16
    head = load_head(releases["bf16"], device=args.device, dtype=dtype)
    release = Path(releases["bf16"])
    index = release / "model.safetensors.index.json"
    shard = json.loads(index.read_text())["weight_map"]["lm_head.weight"] if index.is_file() else "model.safetensors"
    with safe_open(str(release / shard), framework="pt", device=args.device) as handle:
        lm_head = handle.get_tensor("lm_head.weight").to(dtype)
    generator = torch.Generator(device=args.device).manual_seed(0)
    result: dict[str, Any] = {"dtype": "bfloat16"}
    for batch in (1, 16, 64):
        count = min(len(ids), max(batch, 64 if args.device.startswith("cuda") else batch))
        records = [
            (torch.randn(len(ids[i]), head.config.hidden_size, generator=generator, device=args.device, dtype=dtype),
             torch.tensor(ids[i], device=args.device), layouts[i])
            for i in range(count)
        ]

        def run() -> None:
            with torch.inference_mode():
                for start in range(0, count, batch):
                    chunk = records[start : start + batch]
                    head([r[0] for r in chunk], [r[1] for r in chunk], [r[2] for r in chunk], lm_head)

        run()
        _sync(args.device)
        started = time.perf_counter()
        run()
        _sync(args.device)
        result[f"batch_{batch}_ms_per_record"] = round(1000 * (time.perf_counter() - started) / count, 3)
        if batch == 1:
            result["one_record"] = one_record_head(head, records, lm_head, args.device, args.repeats)
    result["memory"] = _gpu_memory(args.device)
    return result


def one_record_head(head: Any, records: list[tuple[Any, Any, Any]], lm_head: Any, device: str, repeats: int) -> dict[str, Any]:
    """A lone record through the head: the dynamic forward, the static bucketed pass run eagerly, and (on
    CUDA) its CUDA-graph replay; ms per record (median of ``repeats`` passes over the records, each pass
    after one that captured every bucket), whether replays equal the eager static pass exactly, and the
    largest difference to the dynamic forward."""
    import torch

    from clef_head.graphs import GraphedHead

    paths = {"dynamic": head, "static_eager": GraphedHead(head, graphs=False)}
    if device.startswith("cuda"):
        paths["graphs"] = GraphedHead(head, graphs=True)
    outputs: dict[str, list[Any]] = {}
    result: dict[str, Any] = {"records": len(records)}
    for name, path in paths.items():

        def run(path: Any = path) -> list[Any]:
            with torch.inference_mode():
                return [path([hidden], [ids], [layout], lm_head)[0] for hidden, ids, layout in records]

        outputs[name] = run()  # first pass: captures every bucket's graph
        seconds, _ = timed_passes(run, repeats, device)
        result[f"{name}_ms_per_record"] = spread([1000 * value / len(records) for value in seconds])
    if "graphs" in outputs:
        result["graphs_captured"] = paths["graphs"].captures
        result["graphs_equal_static_eager"] = all(
            torch.equal(a, b) for a, b in zip(outputs["graphs"], outputs["static_eager"]))
    result["static_max_abs_diff_vs_dynamic"] = max(
        float((a.float() - b.float()).abs().max()) for a, b in zip(outputs["static_eager"], outputs["dynamic"]))
    return result


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


def merge_engine_args(mode: str, mode_args: dict[str, Any], extra: dict[str, Any], max_model_len: int) -> dict[str, Any]:
    """The mode's vLLM keyword arguments overridden by ``extra``; a ``compilation_config`` in ``extra``
    is merged into the mode's (in graphs mode without one: the plugin's default prefill graphs)."""
    from clef_plugin.api import graph_compilation_config, prefill_capture_sizes

    if "compilation_config" in extra and mode == "graphs" and "compilation_config" not in mode_args:
        mode_args = {**mode_args, "compilation_config": graph_compilation_config(prefill_capture_sizes(max_model_len))}
    return overlay_engine_args(mode_args, extra)


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
        "top_kernels_ms": [{"name": name[:160], "kind": kernel_kind(name), "ms": round(us / 1000, 2)} for name, us in top],
    }


def stock_engine_kwargs(plugin_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The plugin's engine arguments for stock vLLM: the release's own architecture (no override), and
    vLLM's sequence pooler (last token, ``embed``) instead of the head; every other setting unchanged."""
    from vllm.config import PoolerConfig

    stock = {key: value for key, value in plugin_kwargs.items() if key != "hf_overrides"}
    stock["pooler_config"] = PoolerConfig(task=STOCK_TASK, seq_pooling_type="LAST")
    return stock


STOCK_TASK = "embed"


def percentiles(latencies_ms: list[float]) -> dict[str, float]:
    """p50/p95/min/max of latencies (ms)."""
    ordered = sorted(latencies_ms)
    return {
        "p50": round(statistics.median(ordered), 2),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
        "min": round(ordered[0], 2),
        "max": round(ordered[-1], 2),
        "count": len(ordered),
    }


def case_vllm(
    args: argparse.Namespace, work: Path, releases: dict[str, str], precision: str, mode: str, stock: bool = False
) -> dict[str, Any]:
    """vLLM on the BF16 or FP8 release: ``--repeats`` throughput passes over all records, then
    single-record latency. With the plugin (option logits) or ``stock`` (no plugin: last-token ``embed``)."""
    import vllm

    import clef_plugin

    ids, layouts = _load_encoded(work)
    key = args.result_key or (f"vllm-stock-{precision}-{mode}" if stock else f"vllm-{precision}-{mode}")
    extra = merge_engine_args(mode, mode_kwargs(mode, args.capture_sizes), json.loads(args.engine_args), args.max_model_len)
    if args.device.startswith("cuda"):
        extra.setdefault("gdn_prefill_backend", "triton")  # flashinfer's GDN kernel is not in the bundle
    trace_dir = work / "profiles" / key
    if args.profile:
        extra["profiler_config"] = {
            "profiler": "torch", "torch_profiler_dir": str(trace_dir), "torch_profiler_with_stack": False,
            "torch_profiler_dump_cuda_time_total": False, "ignore_frontend": True,
        }
    kwargs = clef_plugin.engine_kwargs(
        releases[precision],
        max_model_len=extra.pop("max_model_len", args.max_model_len),
        gpu_memory_utilization=extra.pop("gpu_memory_utilization", args.gpu_memory_utilization),
        max_num_batched_tokens=extra.pop("max_num_batched_tokens", args.max_num_batched_tokens),
        max_num_seqs=extra.pop("max_num_seqs", args.max_num_seqs),
        **extra,
    )
    if stock:
        kwargs = stock_engine_kwargs(kwargs)
    result: dict[str, Any] = {
        "vllm": vllm.__version__,
        "mode": mode,
        "plugin": not stock,
        "engine_kwargs": {key: str(value) for key, value in kwargs.items()},
    }
    started = time.perf_counter()
    llm = vllm.LLM(**kwargs)
    result["start_s"] = round(time.perf_counter() - started, 2)
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    result["max_num_batched_tokens"], result["max_num_seqs"] = scheduler.max_num_batched_tokens, scheduler.max_num_seqs
    result["async_scheduling"] = scheduler.async_scheduling
    result["architecture"] = llm.llm_engine.model_config.architectures[0]
    prompts = [{"prompt_token_ids": item} for item in ids]
    if stock:
        params = [vllm.PoolingParams(task=STOCK_TASK) for _ in ids]
        task = STOCK_TASK
    else:
        params = [clef_plugin.pooling_params(layout, len(item)) for item, layout in zip(ids, layouts)]
        task = clef_plugin.POOLING_TASK

    def encode(indices: range | list[int]) -> list[Any]:
        outputs = llm.encode(
            [prompts[i] for i in indices], pooling_params=[params[i] for i in indices], pooling_task=task, use_tqdm=False,
        )
        if stock:
            return [output.outputs.data.float().cpu() for output in outputs]
        return [clef_plugin.option_logits(output) for output in outputs]

    started = time.perf_counter()
    encode(range(min(WARMUP_RECORDS, len(ids))))
    result["warmup_s"] = round(time.perf_counter() - started, 2)
    seconds, outputs = timed_passes(lambda: encode(range(len(ids))), args.repeats, "cpu")
    result.update(repeated_rates(len(ids), sum(map(len, ids)), seconds))
    result["memory"] = _gpu_memory(args.device)
    if stock:
        result["output_shape"] = list(outputs[0].shape)
    else:
        _save_logits(work, key, outputs)
    latencies = []
    for index in range(min(args.latency_records, len(ids))):
        started = time.perf_counter()
        encode([index])
        latencies.append(1000 * (time.perf_counter() - started))
    result["single_record_ms"] = percentiles(latencies)
    result["single_record_ms"]["all"] = [round(value, 2) for value in latencies]
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
            summary.update(records=len(indices), prompt_tokens=sum(len(ids[i]) for i in indices),
                           wall_ms_profiled=round(1000 * wall, 2))
            result["profile"][label] = summary
    del llm
    return result


TIMERS = (
    "clef_stage_seconds", "clef_request_latency_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds", "vllm:request_inference_time_seconds",
)


def _metric_samples(url: str) -> list[Any]:
    """Every sample the server's ``/metrics`` exposes now."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def _scrape_timers(url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of every histogram series in :data:`TIMERS` from the server's ``/metrics``."""
    found: dict[str, list[float]] = {}
    for sample in _metric_samples(url):
        base = sample.name.rsplit("_", 1)[0]
        if base not in TIMERS or not sample.name.endswith(("_sum", "_count")):
            continue
        labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k in ("stage", "route"))
        key = f"{base}{{{labels}}}" if labels else base
        pair = found.setdefault(key, [0.0, 0.0])
        pair[0 if sample.name.endswith("_sum") else 1] += sample.value
    return {key: (value[0], value[1]) for key, value in found.items()}


def _timer_means(previous: dict[str, tuple[float, float]], current: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Mean milliseconds per observation of each timer between two scrapes."""
    means = {}
    for key, (total, count) in current.items():
        old_total, old_count = previous.get(key, (0.0, 0.0))
        if count > old_count:
            means[key] = round(1000 * (total - old_total) / (count - old_count), 2)
    return means


def _answer_cache_counts(url: str) -> dict[str, float]:
    """``clef_answer_cache_total`` by outcome (hit, merged, miss) from the server's ``/metrics``."""
    return {sample.labels["outcome"]: sample.value for sample in _metric_samples(url) if sample.name == "clef_answer_cache_total"}


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
    """Request bodies of which a share ``fraction`` repeats one of :data:`predictor.bench.HOT_BODIES` bodies
    (the same seeded draw per request index as ``python -m predictor.bench --repeat-fraction``), the others
    from ``unique`` (never sent before). The repeated bodies are marked with ``label``, so another load's
    repeated bodies are not already cached."""

    def __init__(self, unique: UniqueBodies, fraction: float, label: str) -> None:
        self.unique = unique
        self.fraction = fraction
        self.label = label

    def __call__(self, index: int) -> dict[str, Any]:
        from predictor.bench import repeated_index

        chosen = repeated_index(index, self.fraction)
        if chosen >= 0:
            return self.unique(index)
        hot = -1 - chosen
        body = self.unique.bodies[hot]
        return {**body, "state": f"#{self.label}-{hot} {body['state']}"}


def predictor_command(args: argparse.Namespace, release: str, port: int, data_parallel: int) -> list[str]:
    """``python -m predictor`` serving ``release`` with the vLLM engine as the http cases start it."""
    command = [
        sys.executable, "-m", "predictor", "--model-dir", release, "--model-name", "clef-flash",
        "--engine", "vllm", "--http_port", str(port), "--max-model-len", str(args.max_model_len),
        "--gpu-memory-utilization", str(args.gpu_memory_utilization),
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
    import socket
    import urllib.error
    import urllib.request

    for module in ("kserve", "httpx", "predictor"):
        if importlib.util.find_spec(module) is None:  # an http case asked for cannot run: a failure
            raise ModuleNotFoundError(f"{module} is not importable here: install the 'serve' extra's packages")
    from predictor.bench import http_load

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = predictor_command(args, releases["fp8"], port, data_parallel)
    log_path = work / f"{args.result_key or 'http'}-predictor.log"
    log_file = log_path.open("w")
    started = time.perf_counter()
    server = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    result: dict[str, Any] = {"command": " ".join(command)}
    try:
        ready_url = f"http://127.0.0.1:{port}/v1/models/clef-flash"
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"predictor exited with {server.returncode}; see {log_path}")
            try:
                with urllib.request.urlopen(ready_url, timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.perf_counter() - started > args.http_ready_timeout:
                raise TimeoutError(f"predictor not ready within {args.http_ready_timeout} s")
            time.sleep(1)
        result["ready_s"] = round(time.perf_counter() - started, 1)
        result["mode"] = args.http_mode
        result["predictor_args"] = list(args.predictor_args)
        result["data_parallel"] = data_parallel
        bodies = UniqueBodies(json.loads((work / "records.json").read_text()))
        url = f"http://127.0.0.1:{port}"
        result["loads"] = []
        previous = _scrape_timers(url)
        for clients in args.http_clients:
            count = max(args.http_requests, 4 * clients) if clients > 1 else args.http_single_requests
            _log(f"http: {clients} clients, {count} requests")
            load = asyncio.run(http_load(url, clients, count, warmup=min(max(8, clients), count), body=bodies))
            current = _scrape_timers(url)  # server-side means include the load's few warm-up requests
            result["loads"].append({"clients": clients, **load.summary(), "server_ms_mean": _timer_means(previous, current)})
            previous = current
        result["repeat_loads"] = []
        for fraction in args.http_repeat_fractions:
            clients, count = args.http_repeat_clients, max(args.http_requests, 4 * args.http_repeat_clients)
            _log(f"http: {clients} clients, {count} requests, {fraction:.0%} repeated")
            counts_before = _answer_cache_counts(url)
            repeated = RepeatedBodies(bodies, fraction, label=f"r{len(result['repeat_loads'])}")
            load = asyncio.run(http_load(url, clients, count, warmup=min(max(8, clients), count), body=repeated))
            counts = _answer_cache_counts(url)
            result["repeat_loads"].append({
                "repeat_fraction": fraction, "clients": clients, **load.summary(),
                "answer_cache": {outcome: int(counts[outcome] - counts_before.get(outcome, 0.0)) for outcome in counts},
            })
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log_file.close()
    return result


def _vllm_case(precision: str, mode: str, stock: bool = False) -> Callable[..., dict[str, Any]]:
    return lambda args, work, releases: case_vllm(args, work, releases, precision, mode, stock)


CASE_FUNCTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "transformers": case_transformers,
    "head": case_head,
    **{f"vllm-{p}-{m}": _vllm_case(p, m) for p in PRECISIONS for m in MODES},
    **{f"vllm-stock-{p}-{m}": _vllm_case(p, m, stock=True) for p in ("bf16", "fp8") for m in MODES},
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
    _write_json(result_file, result)
    return status


# ----------------------------------------------------------------------------- parent


def base_case(key: str) -> str:
    """The case a result key belongs to: ``vllm-fp8-graphs+async-again`` → ``vllm-fp8-graphs``."""
    return key.split("+")[0].removesuffix("-again")


def variant_name(key: str) -> str | None:
    """The ``--variant`` a case key names, if any: ``vllm-fp8-graphs+async-again`` → ``async``."""
    return key.partition("+")[2].removesuffix("-again") or None


def _child_command(args: argparse.Namespace, key: str) -> list[str]:
    case = base_case(key)
    engine_args = overlay_engine_args(json.loads(args.engine_args), args.variants.get(variant_name(key) or "", {}))
    command = [sys.executable, "-m", "bench.gpu_benchmark", "--run-case", case, "--result-key", key, "--work", str(args.work),
               "--device", args.device, "--max-model-len", str(args.max_model_len),
               "--gpu-memory-utilization", str(args.gpu_memory_utilization),
               "--transformers-batch-tokens", str(args.transformers_batch_tokens),
               "--transformers-records", str(args.transformers_records or 0),
               "--engine-args", json.dumps(engine_args), "--http-clients", ",".join(map(str, args.http_clients)),
               "--http-requests", str(args.http_requests), "--latency-records", str(args.latency_records),
               "--http-ready-timeout", str(args.http_ready_timeout), "--http-mode", args.http_mode,
               "--repeats", str(args.repeats), "--http-single-requests", str(args.http_single_requests),
               "--http-repeat-fractions", ",".join(map(str, args.http_repeat_fractions)),
               "--http-repeat-clients", str(args.http_repeat_clients),
               "--predictor-args", json.dumps(args.http_variants.get(variant_name(key) or "", [])),
               ] + (["--profile"] if args.profile else [])
    if args.capture_sizes:
        command += ["--capture-sizes", ",".join(map(str, args.capture_sizes))]
    for flag, value in (("--max-num-batched-tokens", args.max_num_batched_tokens), ("--max-num-seqs", args.max_num_seqs)):
        if value is not None:
            command += [flag, str(value)]
    return command


def run_process_group(command: list[str], log: Any, env: dict[str, str], timeout: float) -> int:
    """Run ``command`` in a new process group; past ``timeout`` kill the whole group and raise
    ``TimeoutExpired``, so no process it started (vLLM's engine cores, a predictor) keeps a GPU's memory."""
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
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
    _log(f"case {key}: starting (at most {timeout:.0f} s, log {log_path})")
    started = time.perf_counter()
    with log_path.open("w") as log:
        try:
            run_process_group(_child_command(args, key), log, env, timeout)
        except subprocess.TimeoutExpired:
            return {"case": key, "error": f"timed out after {timeout:.0f} s (time budget)", "log": str(log_path)}
    if not result_file.is_file():
        tail = log_path.read_text()[-3000:]
        return {"case": key, "error": "the case process died without a result", "log_tail": tail}
    result = json.loads(result_file.read_text())
    result["wall_s"] = round(time.perf_counter() - started, 1)
    return result


def agreement_pairs(cases: list[str]) -> list[tuple[str, str]]:
    """(reference, candidate) pairs: BF16 vs FP8, BF16 vs NVFP4 and FP8 vs NVFP4 in the same mode, transformers
    vs every vLLM case, eager vs compiled modes of the same precision, and every variant vs its plain case."""
    vllm_cases = [case for case in PLUGIN_CASES if case in cases]
    pairs = [(f"vllm-{a}-{m}", f"vllm-{b}-{m}") for a, b in (("bf16", "fp8"), ("bf16", "nvfp4"), ("fp8", "nvfp4"))
             for m in MODES if f"vllm-{a}-{m}" in cases and f"vllm-{b}-{m}" in cases]
    pairs += [("transformers", case) for case in vllm_cases if "transformers" in cases]
    pairs += [(f"vllm-{p}-eager", f"vllm-{p}-{m}") for p in PRECISIONS for m in MODES[1:]
              if f"vllm-{p}-eager" in cases and f"vllm-{p}-{m}" in cases]
    pairs += [(base_case(case), case) for case in sorted(cases) if variant_name(case) and base_case(case) in cases]
    return pairs


def agreement(work: Path) -> dict[str, Any]:
    """Top-1 agreement and KL for every pair of cases whose logits exist in ``work``."""
    import torch

    from bench.agreement import question_agreement

    _, layouts = _load_encoded(work)
    present = [path.name[len("logits-"):-len(".pt")] for path in work.glob("logits-*.pt")]
    found: dict[str, Any] = {}
    for reference, candidate in agreement_pairs(present):
        first, second = (torch.load(work / f"logits-{name}.pt") for name in (reference, candidate))
        common = min(len(first), len(second))  # the transformers case may score a prefix only
        found[f"{reference} vs {candidate}"] = question_agreement(layouts[:common], first[:common], second[:common])
    return found


def summarize(work: Path, summary: dict[str, Any]) -> str:
    """A compact table of every case result found in ``work`` (this run's and earlier ones')."""
    rows = [f"{'case':<30}{'start s':>9}{'warm s':>8}{'rec/s':>9}{'tok/s':>11}{'min-max':>15}{'GiB used':>10}{'p50 ms':>9}  note"]
    keys = sorted((path.stem for path in (work / "results").glob("*.json") if base_case(path.stem) in ENGINE_CASES),
                  key=lambda key: (ENGINE_CASES.index(base_case(key)), key))
    for case in keys:
        r = json.loads((work / "results" / f"{case}.json").read_text())
        if "error" in r:
            rows.append(f"{case:<30}{'':>71}  ERROR {r['error'][:60]}")
            continue
        p50 = r.get("single_record_ms", {}).get("p50", "")
        used = r.get("memory", {}).get("device_used_gib", "")
        note = ""
        if base_case(case) == "transformers":
            note = (f"fla={r['fla']} first pass {r['first_pass']['prompt_tokens_per_s']} tok/s; backbone only "
                    f"{r['backbone_only']['prompt_tokens_per_s']} tok/s; steady head share {r['split']['head_share']:.1%}")
        spread_text = ""
        if "prompt_tokens_per_s_spread" in r:
            spread_text = f"{r['prompt_tokens_per_s_spread']['min']:.0f}-{r['prompt_tokens_per_s_spread']['max']:.0f}"
        for label, profile in (r.get("profile") or {}).items():
            if "by_kind_share" in profile:
                shares = ", ".join(f"{k} {v:.0%}" for k, v in list(profile["by_kind_share"].items())[:5])
                note += f" [{label}: busy {profile['gpu_busy_share_of_span']:.0%}; {shares}]"
        rows.append(
            f"{case:<30}{r['start_s']:>9}{r['warmup_s']:>8}{r['records_per_s']:>9}{r['prompt_tokens_per_s']:>11}"
            f"{spread_text:>15}{used:>10}{p50:>9}  {note}"
        )
    for pair, value in summary.get("agreement", {}).items():
        rows.append(f"agreement {pair}: top-1 {value['top1_agreement']:.4f}, mean KL {value['mean_kl']:.2e} "
                    f"({value['questions']} questions; median top-2 margin {value['median_reference_top2_margin']:.3f}, "
                    f"median |Δlogit| {value['median_abs_logit_diff']:.3f})")
    head = summary.get("cases", {}).get("head") or {}
    if "batch_16_ms_per_record" in head:
        rows.append(f"head alone: {head['batch_1_ms_per_record']} / {head['batch_16_ms_per_record']} / "
                    f"{head['batch_64_ms_per_record']} ms per record at batch 1 / 16 / 64")
        one = head.get("one_record", {})
        paths = ", ".join(f"{name} {one[f'{name}_ms_per_record']['median']} ms"
                          for name in ("dynamic", "static_eager", "graphs") if f"{name}_ms_per_record" in one)
        rows.append(f"head, one record: {paths}; graphs == eager static: {one.get('graphs_equal_static_eager')}, "
                    f"static vs dynamic max |Δ| {one.get('static_max_abs_diff_vs_dynamic')}")
    for key in sorted(key for key in summary.get("cases", {}) if base_case(key) in HTTP_CASES):
        http = summary["cases"][key] or {}
        if "ready_s" in http:
            extra = " ".join(http.get("predictor_args", []))
            rows.append(f"{key}: ready after {http['ready_s']} s ({http.get('mode')} mode, warm-up included)"
                        + (f"; predictor arguments {extra}" if extra else ""))
        for load in http.get("loads", []):
            server = ", ".join(f"{name} {ms}" for name, ms in load.get("server_ms_mean", {}).items())
            rows.append(f"{key} {load['clients']:>3} clients: {load['requests_per_s']} req/s, "
                        f"{load['tokens_per_s']} tok/s, p50 {load['latency_ms_p50']} ms, p95 {load['latency_ms_p95']} ms, "
                        f"errors {load['errors']}; server ms/request: {server}")
        for load in http.get("repeat_loads", []):
            rows.append(f"{key} {load['clients']:>3} clients, {load['repeat_fraction']:.0%} repeated: "
                        f"{load['requests_per_s']} req/s, {load['tokens_per_s']} tok/s, p50 {load['latency_ms_p50']} ms, "
                        f"p95 {load['latency_ms_p95']} ms, errors {load['errors']}; answer cache {load['answer_cache']}")
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_benchmark", description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/clef-gpu-benchmark"), help="releases, records, logits, logs")
    parser.add_argument("--out", type=Path, default=None, help="summary folder (default: --work)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma list from {', '.join(CASES)}")
    parser.add_argument("--device", default="cuda", help="cuda or cpu (smoke runs)")
    parser.add_argument("--scale", choices=("full", "tiny"), default="full", help="shape of the built release")
    parser.add_argument("--bf16", default=None, help="existing BF16 release (default: build one in --work)")
    parser.add_argument("--fp8", default=None, help="existing FP8 release (default: quantize the BF16 one)")
    parser.add_argument("--nvfp4", default=None, help="existing NVFP4 release (default: quantize the BF16 one when an "
                        "nvfp4 case is asked for)")
    parser.add_argument("--records", type=int, default=1400)
    parser.add_argument("--tokens", type=int, default=512, help="mean prompt length of the records")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget", type=float, default=540.0, help="seconds; stages that would not fit are skipped")
    parser.add_argument("--http-mode", choices=MODES, default="graphs", help="compilation mode of the http case")
    parser.add_argument("--capture-sizes", type=lambda text: [int(v) for v in text.split(",")], default=None,
                        help="CUDA-graph sizes in tokens for graphs mode (default: clef_plugin's prefill sizes)")
    parser.add_argument("--profile", action="store_true", help="profile GPU kernels in the vLLM cases")
    parser.add_argument("--cache-dir", type=Path, default=None, help="compile/Triton caches (default: --work/cache)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--engine-args", default="{}", help="JSON object of extra vllm.LLM keyword arguments")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                        help="engine arguments for the cases named <vllm case>+NAME (repeatable)")
    parser.add_argument("--transformers-batch-tokens", type=int, default=8192, help="padded tokens per transformers batch")
    parser.add_argument("--transformers-records", type=int, default=None,
                        help="score only the first N records in the transformers case (default: all)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per engine case (median, min, max)")
    parser.add_argument("--latency-records", type=int, default=64, help="records sent one at a time for latency")
    parser.add_argument("--http-clients", type=lambda text: [int(v) for v in text.split(",")], default=[1, 8, 64, 256])
    parser.add_argument("--http-requests", type=int, default=2000, help="requests per multi-client HTTP load")
    parser.add_argument("--http-single-requests", type=int, default=200, help="requests of the one-client HTTP load")
    parser.add_argument("--http-ready-timeout", type=float, default=300.0)
    parser.add_argument("--http-repeat-fractions", type=lambda text: [float(v) for v in text.split(",") if v], default=[],
                        help="after the http loads, one load per share of repeated requests (e.g. 0,0.5,0.9)")
    parser.add_argument("--http-repeat-clients", type=int, default=64, help="clients of the repeated-request loads")
    parser.add_argument("--run-case", choices=sorted(CASE_FUNCTIONS), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result-key", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--http-args", action="append", default=[], metavar="NAME=ARGS",
                        help="extra predictor arguments (one shell-quoted string) for the cases http+NAME, "
                             "http-dp2+NAME (repeatable), e.g. enc4='--encode-processes 4'")
    parser.add_argument("--predictor-args", type=json.loads, default=[], help=argparse.SUPPRESS)
    return parser


def http_variants(texts: list[str]) -> dict[str, list[str]]:
    """``--http-args NAME=ARGS`` values: the extra predictor arguments of each http variant, by name."""
    found: dict[str, list[str]] = {}
    for text in texts:
        name, _, value = text.partition("=")
        if not VARIANT_NAME.fullmatch(name) or not value.strip():
            raise ValueError(f"--http-args {text!r}: expected NAME=ARGS, NAME of a-z, 0-9, _")
        try:
            found[name] = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"--http-args {name}: {exc}") from None
    return found


def main(argv: list[str] | None = None) -> int:
    """Run the asked stages within the time budget; print a table and write the JSON summary."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.work = args.work.resolve()
    if args.run_case:
        return run_child(args)
    try:
        json.loads(args.engine_args)
    except json.JSONDecodeError as exc:
        parser.error(f"--engine-args is not JSON: {exc}")
    args.variants = {}
    for text in args.variant:
        name, _, value = text.partition("=")
        try:
            engine_args = json.loads(value)
        except json.JSONDecodeError as exc:
            parser.error(f"--variant {name}: not JSON: {exc}")
        if not VARIANT_NAME.fullmatch(name) or not isinstance(engine_args, dict):
            parser.error(f"--variant {text!r}: expected NAME=JSON object, NAME of a-z, 0-9, _")
        args.variants[name] = engine_args
    try:
        args.http_variants = http_variants(args.http_args)
    except ValueError as exc:
        parser.error(str(exc))
    if not all(0.0 <= fraction <= 1.0 for fraction in args.http_repeat_fractions):
        parser.error("--http-repeat-fractions: each share must be between 0 and 1")
    cases = [case.strip() for case in args.cases.split(",") if case.strip()]
    unknown = sorted({case for case in cases if case.split("+")[0] not in CASES})
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    for case in cases:
        name = variant_name(case)
        if name and base_case(case) in HTTP_CASES and name not in args.http_variants:
            parser.error(f"case {case}: an http variant needs --http-args {name}='ARGS'")
        if name and base_case(case) not in HTTP_CASES and (base_case(case) not in VLLM_CASES or name not in args.variants):
            parser.error(f"case {case}: a variant needs a vLLM case and a --variant {name}=JSON")
    out = args.out or args.work
    deadline = time.time() + args.time_budget
    scale_factor = 1.0 if args.scale == "full" else 0.2  # tiny releases start faster
    args.work.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "note": "random weights: figures measure speed only; agreement bounds FP8's numerical effect",
        "arguments": {key: str(value) for key, value in vars(args).items()},
        "environment": _environment(),
        "cases": {},
    }
    status = 0
    try:
        summary["prepare"] = prepare(args, args.work, deadline)
        _write_json(args.work / "releases.json",
                    {name: summary["prepare"][name] for name in PRECISIONS if name in summary["prepare"]})
    except Exception as exc:  # noqa: BLE001 (nothing else can run without the releases and records)
        summary["prepare"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
        status = 1
    if status == 0:
        seen: set[str] = set()
        for case in cases:
            if case == "prepare":
                continue
            key = f"{case}-again" if case in seen else case
            seen.add(case)
            left = deadline - time.time()
            needs = MIN_SECONDS[base_case(case)] * scale_factor
            if left < needs:
                summary["cases"][key] = {"skipped": f"time budget: {left:.0f} s left, needs ~{needs:.0f} s"}
                _log(f"case {key}: skipped ({left:.0f} s left)")
                continue
            summary["cases"][key] = run_case_process(args, deadline, key)
            if "error" in summary["cases"][key]:
                status = 1
                _log(f"case {key}: FAILED {summary['cases'][key]['error']}")
            elif "skipped" in summary["cases"][key]:
                _log(f"case {key}: SKIPPED {summary['cases'][key]['skipped']}")
            else:
                _log(f"case {key}: done")
        try:
            summary["agreement"] = agreement(args.work)
        except Exception as exc:  # noqa: BLE001
            summary["agreement_error"] = f"{type(exc).__name__}: {exc}"
            status = 1
    _write_json(out / "gpu_benchmark.json", summary)
    if status == 0 or summary.get("cases"):
        print(summarize(args.work, summary), flush=True)
    if "error" in summary["prepare"]:
        print(summary["prepare"]["error"], file=sys.stderr)
    _log(f"summary written to {out / 'gpu_benchmark.json'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
