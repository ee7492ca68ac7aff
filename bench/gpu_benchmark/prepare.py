"""The prepare stage (in the parent process): build or reuse the releases and the encoded records."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.gpu_benchmark.workdir import load_encoded, log, write_json


def prepare(args: argparse.Namespace, work: Path, deadline: float) -> dict[str, Any]:
    """Build or reuse the releases and the encoded records."""
    result: dict[str, Any] = {}
    bf16 = Path(args.bf16) if args.bf16 else work / f"release-{args.scale}-bf16"
    fp8 = Path(args.fp8) if args.fp8 else work / f"release-{args.scale}-fp8"
    if not (bf16 / "config.json").is_file():
        if args.bf16:
            raise FileNotFoundError(f"--bf16 {bf16}: no config.json")
        command = [
            sys.executable,
            "-m",
            "clef_tools.fullsize",
            str(bf16),
            "--scale",
            args.scale,
            "--device",
            args.device,
        ]
        result["build_bf16"] = run_json(command, deadline)
    if not (fp8 / "config.json").is_file():
        if args.fp8:
            raise FileNotFoundError(f"--fp8 {fp8}: no config.json")
        command = [sys.executable, "-m", "clef_tools.quantize", str(bf16), str(fp8), "--device", args.device]
        result["quantize_fp8"] = run_json(command, deadline)
    result["bf16"], result["fp8"] = str(bf16), str(fp8)
    if args.nvfp4 or any("nvfp4" in case for case in args.cases.split(",")):
        nvfp4 = Path(args.nvfp4) if args.nvfp4 else work / f"release-{args.scale}-nvfp4"
        if not (nvfp4 / "config.json").is_file():
            if args.nvfp4:
                raise FileNotFoundError(f"--nvfp4 {nvfp4}: no config.json")
            command = [
                sys.executable,
                "-m",
                "clef_tools.quantize",
                str(bf16),
                str(nvfp4),
                "--scheme",
                "NVFP4",
                "--device",
                args.device,
            ]
            result["quantize_nvfp4"] = run_json(command, deadline)
        result["nvfp4"] = str(nvfp4)
    meta = {"records": args.records, "seed": args.seed, "tokens": args.tokens, "tokenizer": str(bf16)}
    meta_file = work / "records-meta.json"
    if not (meta_file.is_file() and json.loads(meta_file.read_text()) == meta and (work / "encoded.json").is_file()):
        from transformers import AutoTokenizer

        from clef_head.encoder import encode_request
        from clef_head.request import parse_request
        from clef_tools.sized_records import make_records

        started = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(bf16)
        bodies = make_records(tokenizer, args.records, seed=args.seed, tokens=args.tokens)
        encoded = [encode_request(tokenizer, parse_request(body), max_length=args.max_model_len) for body in bodies]
        write_json(work / "records.json", bodies)
        write_json(
            work / "encoded.json", [{"input_ids": item.input_ids, "layout": item.layout.to_wire()} for item in encoded]
        )
        write_json(meta_file, meta)
        for stale in work.glob("*logits-*.pt"):  # other records' logits
            stale.unlink()
        result["records_s"] = round(time.perf_counter() - started, 1)
    ids, layouts = load_encoded(work)
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


def run_json(command: list[str], deadline: float) -> dict[str, Any]:
    """Run a command that prints one JSON line last; raise with its stderr tail on failure."""
    timeout = max(deadline - time.time(), 1)
    log("running " + " ".join(command))
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{command[2]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
