"""Reporting: the environment, agreement between cases' logits, and the summary table."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.gpu_benchmark.names import ENGINE_CASES, HTTP_CASES, agreement_pairs, base_case
from bench.gpu_benchmark.workdir import LONE, load_encoded, logits_file, logits_kinds


def environment() -> dict[str, Any]:
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


def agreement(work: Path) -> dict[str, Any]:
    """Top-1 agreement and KL for every pair of cases whose logits exist in ``work``: their batched passes', and
    their lone records' and small groups' where both kept them (such a step may run another graph than a batch's)."""
    import torch

    from bench.agreement import question_agreement

    _, layouts = load_encoded(work)
    present = [path.name[len("logits-") : -len(".pt")] for path in work.glob("logits-*.pt")]
    found: dict[str, Any] = {}
    for reference, candidate in agreement_pairs(present):
        for kind in logits_kinds(work):
            label = f", {'lone records' if kind == LONE else kind.replace('-', ' ')}" if kind else ""
            files = [logits_file(work, name, kind) for name in (reference, candidate)]
            if not all(path.is_file() for path in files):
                continue
            first, second = (torch.load(path) for path in files)
            common = min(len(first), len(second))  # the transformers case may score a prefix only
            found[f"{reference} vs {candidate}{label}"] = question_agreement(
                layouts[:common], first[:common], second[:common]
            )
    return found


def vision_rows(cases: dict[str, Any]) -> list[str]:
    """The table's lines for the vision cases: text-only throughput (and its ratio to the text case), then per
    image set throughput, lone-request latency and preprocessing time."""
    rows = []
    for key in sorted(key for key in cases if base_case(key) == "vision"):
        result = cases[key] or {}
        if "text_only" not in result:  # failed, skipped, or cut by the time budget after its first figures
            rows.append(f"{key}: {result.get('error') or result.get('skipped') or 'no figures'}")
            result = result.get("partial") or {}
            if "text_only" not in result:
                continue
        text = result["text_only"]
        ratio = text.get("ratio_to_text_case")
        rows.append(
            f"{key}: started in {result['start_s']} s ({result['mode']}, max_model_len {result['max_model_len']}); "
            f"text only {text['records_per_s']} rec/s, {text['prompt_tokens_per_s']} tok/s "
            f"({text['prompt_tokens_per_s_spread']['min']:.0f}-{text['prompt_tokens_per_s_spread']['max']:.0f})"
            + (f" = {ratio['ratio']:.3f}x {ratio['case']} (target >= {ratio['target']})" if ratio else "")
        )
        for name, figures in result.get("images", {}).items():
            tokens = figures["prompt_tokens_per_s_spread"]
            latency = figures["single_request_ms"]
            rows.append(
                f"{key} {name}: {figures['records_per_s']} rec/s, {figures['prompt_tokens_per_s']} tok/s "
                f"({tokens['min']:.0f}-{tokens['max']:.0f}; {figures['image_tokens_per_request']} image tokens of "
                f"{figures['mean_prompt_tokens']} a request); one request p50 {latency['p50']} ms, p95 "
                f"{latency['p95']} ms; preprocessing {figures['preprocess_ms_per_image']} ms per image"
            )
    return rows


def summarize(work: Path, summary: dict[str, Any]) -> str:
    """A compact table of every case result found in ``work`` (this run's and earlier ones')."""
    rows = [
        f"{'case':<30}{'start s':>9}{'warm s':>8}{'rec/s':>9}{'tok/s':>11}{'min-max':>15}"
        f"{'GiB used':>10}{'p50 ms':>9}  note"
    ]
    keys = sorted(
        (path.stem for path in (work / "results").glob("*.json") if base_case(path.stem) in ENGINE_CASES),
        key=lambda key: (ENGINE_CASES.index(base_case(key)), key),
    )
    for case in keys:
        r = json.loads((work / "results" / f"{case}.json").read_text())
        if "error" in r:
            rows.append(f"{case:<30}{'':>71}  ERROR {r['error'][:60]}")
            continue
        p50 = r.get("single_record_ms", {}).get("p50", "")
        used = r.get("memory", {}).get("device_used_gib", "")
        note = ""
        if base_case(case) == "transformers":
            note = (
                f"fla={r['fla']} first pass {r['first_pass']['prompt_tokens_per_s']} tok/s; backbone only "
                f"{r['backbone_only']['prompt_tokens_per_s']} tok/s; steady head share {r['split']['head_share']:.1%}"
            )
        spread_text = ""
        if "prompt_tokens_per_s_spread" in r:
            spread_text = f"{r['prompt_tokens_per_s_spread']['min']:.0f}-{r['prompt_tokens_per_s_spread']['max']:.0f}"
        if "single_against_batched" in r:
            alone = r["single_against_batched"]
            note += f"lone vs batched: top-1 {alone['top1_agreement']:.3f}, mean KL {alone['mean_kl']:.2e}"
        for size, latency in r.get("group_ms", {}).items():
            note += f"; groups of {size}: p50 {latency['p50']} ms"
        for label, profile in (r.get("profile") or {}).items():
            if "by_kind_share" in profile:
                shares = ", ".join(f"{k} {v:.0%}" for k, v in list(profile["by_kind_share"].items())[:5])
                note += f" [{label}: busy {profile['gpu_busy_share_of_span']:.0%}; {shares}]"
        rows.append(
            f"{case:<30}{r['start_s']:>9}{r['warmup_s']:>8}{r['records_per_s']:>9}{r['prompt_tokens_per_s']:>11}"
            f"{spread_text:>15}{used:>10}{p50:>9}  {note}"
        )
    for pair, value in summary.get("agreement", {}).items():
        rows.append(
            f"agreement {pair}: top-1 {value['top1_agreement']:.4f}, mean KL {value['mean_kl']:.2e} "
            f"({value['questions']} questions; median top-2 margin {value['median_reference_top2_margin']:.3f}, "
            f"median |Δlogit| {value['median_abs_logit_diff']:.3f}, max {value['max_abs_logit_diff']:.3f})"
        )
    head = summary.get("cases", {}).get("head") or {}
    if "batch_16_ms_per_record" in head:
        rows.append(
            f"head alone: {head['batch_1_ms_per_record']} / {head['batch_16_ms_per_record']} / "
            f"{head['batch_64_ms_per_record']} ms per record at batch 1 / 16 / 64"
        )
        one = head.get("one_record", {})
        paths = ", ".join(
            f"{name} {one[f'{name}_ms_per_record']['median']} ms"
            for name in ("dynamic", "static_eager", "graphs")
            if f"{name}_ms_per_record" in one
        )
        rows.append(
            f"head, one record: {paths}; graphs == eager static: {one.get('graphs_equal_static_eager')}, "
            f"static vs dynamic max |Δ| {one.get('static_max_abs_diff_vs_dynamic')}"
        )
    rows += vision_rows(summary.get("cases", {}))
    for key in sorted(key for key in summary.get("cases", {}) if base_case(key) in HTTP_CASES):
        http = summary["cases"][key] or {}
        if "ready_s" in http:
            extra = " ".join(http.get("predictor_args", []))
            rows.append(
                f"{key}: ready after {http['ready_s']} s ({http.get('mode')} mode, warm-up included)"
                + (f"; predictor arguments {extra}" if extra else "")
            )
        for load in http.get("loads", []):
            server = ", ".join(f"{name} {ms}" for name, ms in load.get("server_ms_mean", {}).items())
            rows.append(
                f"{key} {load['clients']:>3} clients: {load['requests_per_s']} req/s, "
                f"{load['tokens_per_s']} tok/s, p50 {load['latency_ms_p50']} ms, p95 {load['latency_ms_p95']} ms, "
                f"errors {load['errors']}; server ms/request: {server}"
            )
        for load in http.get("repeat_loads", []):
            rows.append(
                f"{key} {load['clients']:>3} clients, {load['repeat_fraction']:.0%} repeated: "
                f"{load['requests_per_s']} req/s, {load['tokens_per_s']} tok/s, p50 {load['latency_ms_p50']} ms, "
                f"p95 {load['latency_ms_p95']} ms, errors {load['errors']}; answer cache {load['answer_cache']}"
            )
    return "\n".join(rows)
