"""Command line: the options, their checks, and the run of the asked stages within the time budget."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from bench.gpu_benchmark import __doc__ as PACKAGE_DOC
from bench.gpu_benchmark.names import (
    CASES,
    HTTP_CASES,
    MIN_SECONDS,
    MODES,
    PRECISIONS,
    VARIANT_NAME,
    VLLM_CASES,
    base_case,
    result_key,
    variant_name,
)
from bench.gpu_benchmark.prepare import prepare
from bench.gpu_benchmark.processes import CASE_FUNCTIONS, run_case_process, run_child
from bench.gpu_benchmark.report import agreement, environment, summarize
from bench.gpu_benchmark.vision_case import attach_text_ratios
from bench.gpu_benchmark.workdir import log, write_json


def build_parser() -> argparse.ArgumentParser:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_benchmark", description=(PACKAGE_DOC or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--work", type=Path, default=Path("/tmp/clef-gpu-benchmark"), help="releases, records, logits, logs"
    )
    parser.add_argument("--out", type=Path, default=None, help="summary folder (default: --work)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma list from {', '.join(CASES)}")
    parser.add_argument("--device", default="cuda", help="cuda or cpu (smoke runs)")
    parser.add_argument("--scale", choices=("full", "tiny"), default="full", help="shape of the built release")
    parser.add_argument("--bf16", default=None, help="existing BF16 release (default: build one in --work)")
    parser.add_argument("--fp8", default=None, help="existing FP8 release (default: quantize the BF16 one)")
    parser.add_argument(
        "--nvfp4",
        default=None,
        help="existing NVFP4 release (default: quantize the BF16 one when an nvfp4 case is asked for)",
    )
    parser.add_argument("--records", type=int, default=1400)
    parser.add_argument("--tokens", type=int, default=512, help="mean prompt length of the records")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--time-budget", type=float, default=540.0, help="seconds; stages that would not fit are skipped"
    )
    parser.add_argument("--http-mode", choices=MODES, default="graphs", help="compilation mode of the http case")
    parser.add_argument(
        "--capture-sizes",
        type=lambda text: [int(v) for v in text.split(",")],
        default=None,
        help="CUDA-graph sizes in tokens for graphs mode (default: clef_plugin's prefill sizes)",
    )
    parser.add_argument("--profile", action="store_true", help="profile GPU kernels in the vLLM cases")
    parser.add_argument("--cache-dir", type=Path, default=None, help="compile/Triton caches (default: --work/cache)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--engine-args", default="{}", help="JSON object of extra vllm.LLM keyword arguments")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="engine arguments for the cases named <vllm case>+NAME (repeatable)",
    )
    parser.add_argument(
        "--transformers-batch-tokens", type=int, default=8192, help="padded tokens per transformers batch"
    )
    parser.add_argument(
        "--transformers-records",
        type=int,
        default=None,
        help="score only the first N records in the transformers case (default: all)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per engine case (median, min, max)")
    parser.add_argument("--latency-records", type=int, default=64, help="records sent one at a time for latency")
    parser.add_argument(
        "--group-sizes",
        type=lambda text: [int(v) for v in text.split(",") if v],
        default=[2, 4],
        help="the latency records are also sent this many at a time (one encode call each; empty: none)",
    )
    parser.add_argument(
        "--vision-records", type=int, default=64, help="records per image set in the vision case's throughput passes"
    )
    parser.add_argument(
        "--vision-latency-requests", type=int, default=16, help="lone requests per image set in the vision case"
    )
    parser.add_argument(
        "--vision-max-model-len",
        type=int,
        default=4096,
        help="the vision engine's max_model_len (at least --max-model-len): room for 4 images of 1024x768",
    )
    parser.add_argument("--http-clients", type=lambda text: [int(v) for v in text.split(",")], default=[1, 8, 64, 256])
    parser.add_argument("--http-requests", type=int, default=2000, help="requests per multi-client HTTP load")
    parser.add_argument("--http-single-requests", type=int, default=200, help="requests of the one-client HTTP load")
    parser.add_argument("--http-ready-timeout", type=float, default=300.0)
    parser.add_argument(
        "--http-repeat-fractions",
        type=lambda text: [float(v) for v in text.split(",") if v],
        default=[],
        help="after the http loads, one load per share of repeated requests (e.g. 0,0.5,0.9)",
    )
    parser.add_argument("--http-repeat-clients", type=int, default=64, help="clients of the repeated-request loads")
    parser.add_argument("--run-case", choices=sorted(CASE_FUNCTIONS), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result-key", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--http-args",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="extra predictor arguments (one shell-quoted string) for the cases http+NAME, "
        "http-dp2+NAME (repeatable), e.g. enc4='--encode-processes 4'",
    )
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
    if any(size < 1 for size in args.group_sizes):
        parser.error("--group-sizes must be whole numbers of at least 1")
    if args.vision_records < 1 or args.vision_latency_requests < 1:
        parser.error("--vision-records and --vision-latency-requests must be at least 1")
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
        if (
            name
            and base_case(case) not in HTTP_CASES
            and (base_case(case) not in VLLM_CASES or name not in args.variants)
        ):
            parser.error(f"case {case}: a variant needs a vLLM case and a --variant {name}=JSON")
    out = args.out or args.work
    deadline = time.time() + args.time_budget
    scale_factor = 1.0 if args.scale == "full" else 0.2  # tiny releases start faster
    args.work.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "note": "random weights: figures measure speed only; agreement bounds FP8's numerical effect",
        "arguments": {key: str(value) for key, value in vars(args).items()},
        "environment": environment(),
        "cases": {},
    }
    status = 0
    try:
        summary["prepare"] = prepare(args, args.work, deadline)
        write_json(
            args.work / "releases.json",
            {name: summary["prepare"][name] for name in PRECISIONS if name in summary["prepare"]},
        )
    except Exception as exc:  # noqa: BLE001 (nothing else can run without the releases and records)
        summary["prepare"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
        status = 1
    if status == 0:
        runs: Counter[str] = Counter()
        for case in cases:
            if case == "prepare":
                continue
            key = result_key(case, runs[case])
            runs[case] += 1
            left = deadline - time.time()
            needs = MIN_SECONDS[base_case(case)] * scale_factor
            if left < needs:
                summary["cases"][key] = {"skipped": f"time budget: {left:.0f} s left, needs ~{needs:.0f} s"}
                log(f"case {key}: skipped ({left:.0f} s left)")
                continue
            summary["cases"][key] = run_case_process(args, deadline, key)
            if "error" in summary["cases"][key]:
                status = 1
                log(f"case {key}: FAILED {summary['cases'][key]['error']}")
            elif "skipped" in summary["cases"][key]:
                log(f"case {key}: SKIPPED {summary['cases'][key]['skipped']}")
            else:
                log(f"case {key}: done")
        attach_text_ratios(summary["cases"], args.work)
        try:
            summary["agreement"] = agreement(args.work)
        except Exception as exc:  # noqa: BLE001
            summary["agreement_error"] = f"{type(exc).__name__}: {exc}"
            status = 1
    write_json(out / "gpu_benchmark.json", summary)
    if status == 0 or summary.get("cases"):
        print(summarize(args.work, summary), flush=True)
    if "error" in summary["prepare"]:
        print(summary["prepare"]["error"], file=sys.stderr)
    log(f"summary written to {out / 'gpu_benchmark.json'}")
    return status
