"""vLLM plugin on a GPU against the transformers reference: agreement, max |Δ probability|, tokens/s.

    python -m bench.plugin_gpu_parity [--workdir DIR] [--cases bf16-eager,fp8-graph,...] [--records 200]
                                      [--tokens 512] [--case-timeout 600]

Offline: builds tiny random releases itself (``clef_tools.tiny``; FP8 with ``python -m
clef_tools.quantize``), scores the same seeded records with the transformers reference (BF16, on
CUDA) and with vLLM through the plugin (``engine_kwargs`` + one ``llm.encode`` call), then prints
one JSON summary and writes it to ``WORKDIR/plugin_gpu_parity.json``.

Each stage (reference per release, every vLLM case) runs in its own subprocess with a time limit,
so a crash or hang in one case is reported and the others still run. FP8 cases are compared with
the reference on the FP8 release (same quantized weights: implementation parity) and on the BF16
release it came from (the quantization's own effect). Tokens/s count prompt tokens over the wall
time of the timed ``encode`` call (after a warm-up call), not engine start.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOLERANCE = 0.02  # max |Δ probability| the CPU tests also hold BF16 to


@dataclass(frozen=True)
class Case:
    """One vLLM configuration: which release, CUDA graphs or eager, and an optional token budget."""

    release: str  # "bf16" or "fp8"
    enforce_eager: bool
    max_num_batched_tokens: int | None = None


CASES: dict[str, Case] = {
    "bf16-eager": Case("bf16", True),
    "bf16-graph": Case("bf16", False),
    "bf16-chunked": Case("bf16", True, max_num_batched_tokens=128),
    "fp8-eager": Case("fp8", True),
    "fp8-graph": Case("fp8", False),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (the ``--stage`` options are internal: one subprocess per stage)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/clef-plugin-gpu-parity"))
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from: {', '.join(CASES)}")
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=512, help="mean prompt length of the records")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--case-timeout", type=int, default=600, help="seconds per stage subprocess")
    parser.add_argument("--stage", choices=("reference", "case"), help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [name for name in args.cases.split(",") if name not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    if args.records < 1 or args.tokens < 64:
        parser.error("--records must be >= 1 and --tokens >= 64")
    return args


def compare(layouts: list[Any], reference: list[Any], candidate: list[Any]) -> dict[str, Any]:
    """Agreement figures of ``candidate`` logits against ``reference`` (bench.agreement), plus a pass flag."""
    from bench.agreement import question_agreement

    stats: dict[str, Any] = dict(question_agreement(layouts, reference, candidate))
    stats["within_tolerance"] = stats["max_probability_diff"] <= TOLERANCE
    return stats


# --- stages (each in its own subprocess) -------------------------------------------------------


def _load_records(workdir: Path) -> tuple[list[Any], Any]:
    from transformers import AutoTokenizer

    from clef_head.encoder import encode_request
    from clef_head.request import parse_request

    bodies = json.loads((workdir / "records.json").read_text())
    release = workdir / "release-bf16"
    tokenizer = AutoTokenizer.from_pretrained(release)
    requests = [parse_request(body) for body in bodies]
    return requests, [encode_request(tokenizer, request) for request in requests]


def stage_reference(workdir: Path, release: str) -> dict[str, Any]:
    """Transformers reference logits (BF16, CUDA) for the records on one release; saves them."""
    import torch

    from predictor.engines.reference import TransformersScorer

    _, encoded = _load_records(workdir)
    scorer = TransformersScorer(workdir / f"release-{release}", device="cuda", dtype=torch.bfloat16)
    scorer.score(encoded[: min(8, len(encoded))])  # warm-up (kernels, autotuning)
    torch.cuda.synchronize()
    start = time.perf_counter()
    logits = scorer.score(encoded)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    torch.save(logits, workdir / f"reference-{release}.pt")
    tokens = sum(len(item.input_ids) for item in encoded)
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}


def stage_case(workdir: Path, name: str, max_model_len: int) -> dict[str, Any]:
    """Score the records with vLLM through the plugin under one case; saves the logits."""
    import torch
    from vllm import LLM

    import clef_plugin

    case = CASES[name]
    requests, encoded = _load_records(workdir)
    kwargs = clef_plugin.engine_kwargs(
        workdir / f"release-{case.release}",
        max_model_len=max_model_len,
        enforce_eager=case.enforce_eager,
        gpu_memory_utilization=0.5,
        max_num_batched_tokens=case.max_num_batched_tokens,
        gdn_prefill_backend="triton",
    )
    start = time.perf_counter()
    llm = LLM(**kwargs)
    engine_start = time.perf_counter() - start
    responses = clef_plugin.score_requests(llm, requests[:8])  # warm-up, and the offline API end to end
    assert len(responses) == min(8, len(requests))
    prompts = [{"prompt_token_ids": item.input_ids} for item in encoded]
    params = [clef_plugin.pooling_params(item.layout, len(item.input_ids)) for item in encoded]
    start = time.perf_counter()
    outputs = llm.encode(prompts, pooling_params=params, pooling_task=clef_plugin.POOLING_TASK, use_tqdm=False)
    seconds = time.perf_counter() - start
    logits = [clef_plugin.option_logits(output) for output in outputs]
    torch.save(logits, workdir / f"case-{name}.pt")
    tokens = sum(len(item.input_ids) for item in encoded)
    return {"engine_start_s": engine_start, "seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}


# --- driver ------------------------------------------------------------------------------------


def _run_stage(args: argparse.Namespace, stage: str, name: str) -> dict[str, Any]:
    """Run one stage in a subprocess; its JSON result, or an error entry with the log's tail."""
    log = args.workdir / f"{stage}-{name}.log"
    command = [
        sys.executable,
        "-m",
        "bench.plugin_gpu_parity",
        "--stage",
        stage,
        "--name",
        name,
        "--workdir",
        str(args.workdir),
        "--max-model-len",
        str(args.max_model_len),
        "--cases",
        args.cases,
    ]
    start = time.perf_counter()
    try:
        with log.open("w") as handle:
            subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, timeout=args.case_timeout, check=True)
        lines = [line for line in log.read_text().splitlines() if line.startswith("RESULT ")]
        if not lines:
            raise RuntimeError("the stage printed no RESULT line")
        return {"ok": True, **json.loads(lines[-1][len("RESULT ") :])}
    except subprocess.TimeoutExpired:
        error = f"timed out after {args.case_timeout} s"
    except (subprocess.CalledProcessError, RuntimeError, json.JSONDecodeError) as exc:
        error = str(exc)
    tail = log.read_text().splitlines()[-25:] if log.exists() else []
    return {"ok": False, "error": error, "wall_s": time.perf_counter() - start, "log_tail": tail}


def _prepare(args: argparse.Namespace, releases: set[str]) -> dict[str, Any]:
    """Tiny releases and the seeded records; returns what was built (or why not)."""
    from transformers import AutoTokenizer

    from clef_tools.sized_records import make_records
    from clef_tools.tiny import build_tiny_release

    info: dict[str, Any] = {}
    bf16 = args.workdir / "release-bf16"
    if not (bf16 / "config.json").exists():
        build_tiny_release(bf16, seed=args.seed)
    info["bf16"] = str(bf16)
    if "fp8" in releases:
        fp8 = args.workdir / "release-fp8"
        if not (fp8 / "config.json").exists():
            result = subprocess.run(
                [sys.executable, "-m", "clef_tools.quantize", str(bf16), str(fp8)],
                capture_output=True,
                text=True,
                timeout=args.case_timeout,
            )
            if result.returncode != 0:
                info["fp8_error"] = (result.stdout + result.stderr).splitlines()[-25:]
            else:
                info["fp8"] = str(fp8)
        else:
            info["fp8"] = str(fp8)
    tokenizer = AutoTokenizer.from_pretrained(bf16)
    records = make_records(tokenizer, args.records, seed=args.seed, tokens=args.tokens, spread=args.tokens // 4)
    (args.workdir / "records.json").write_text(json.dumps(records))
    return info


def _environment() -> dict[str, Any]:
    import importlib.util

    import torch

    found = {name: importlib.util.find_spec(name) is not None for name in ("vllm", "fla")}
    env: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available(), **found}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    if found["vllm"]:
        import vllm

        env["vllm_version"] = vllm.__version__
    return env


def drive(args: argparse.Namespace) -> dict[str, Any]:
    """Prepare, run every stage, compare; the JSON summary."""
    import torch

    args.workdir.mkdir(parents=True, exist_ok=True)
    names = args.cases.split(",")
    summary: dict[str, Any] = {"environment": _environment(), "tolerance": TOLERANCE, "cases": {}}
    try:
        summary["prepared"] = _prepare(args, {CASES[name].release for name in names})
    except Exception:  # noqa: BLE001 (reported, nothing else can run)
        summary["prepared"] = {"error": traceback.format_exc().splitlines()[-25:]}
        return summary
    _, encoded = _load_records(args.workdir)
    layouts = [item.layout for item in encoded]
    summary["records"] = {"count": len(encoded), "tokens": sum(len(item.input_ids) for item in encoded)}
    releases = ["bf16"] + (["fp8"] if "fp8" in summary["prepared"] else [])
    summary["reference"] = {release: _run_stage(args, "reference", release) for release in releases}
    for name in names:
        case = CASES[name]
        if case.release not in summary["prepared"]:
            summary["cases"][name] = {"ok": False, "error": f"no {case.release} release (see prepared)"}
            continue
        result = _run_stage(args, "case", name)
        if result["ok"]:
            candidate = torch.load(args.workdir / f"case-{name}.pt")
            for release in dict.fromkeys([case.release, "bf16"]):
                if summary["reference"][release]["ok"]:
                    reference = torch.load(args.workdir / f"reference-{release}.pt")
                    result[f"vs_reference_{release}"] = compare(layouts, reference, candidate)
            reference_speed = summary["reference"][case.release].get("tokens_per_s")
            if reference_speed:
                result["speedup_vs_reference"] = result["tokens_per_s"] / reference_speed
        summary["cases"][name] = result
        print(f"{name}: {json.dumps(result)[:400]}", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    """Entry point: a stage (internal) or the whole run; exit status 0 only when every case passed."""
    args = parse_args(argv)
    if args.stage == "reference":
        print("RESULT " + json.dumps(stage_reference(args.workdir, args.name)), flush=True)
        return 0
    if args.stage == "case":
        print("RESULT " + json.dumps(stage_case(args.workdir, args.name, args.max_model_len)), flush=True)
        return 0
    summary = drive(args)
    text = json.dumps(summary, indent=2)
    print(text)
    args.workdir.mkdir(parents=True, exist_ok=True)
    (args.workdir / "plugin_gpu_parity.json").write_text(text + "\n")
    cases = summary["cases"].values()
    return 0 if cases and all(case.get("ok") for case in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
