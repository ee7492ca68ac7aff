"""Case names: the cases, their variants and repetitions, and which pairs of them are compared."""

from __future__ import annotations

import re

MODES = ("eager", "compile", "graphs")


PRECISIONS = ("bf16", "fp8", "nvfp4")


PLUGIN_CASES = tuple(f"vllm-{precision}-{mode}" for precision in PRECISIONS for mode in MODES)


STOCK_CASES = tuple(f"vllm-stock-{precision}-{mode}" for precision in ("bf16", "fp8") for mode in MODES)


VLLM_CASES = (*PLUGIN_CASES, *STOCK_CASES)


HTTP_CASES = ("http", "http-dp2")


CASES = ("prepare", "transformers", "head", *VLLM_CASES, "vision", *HTTP_CASES)


ENGINE_CASES = ("transformers", *VLLM_CASES)


# Rough lower bounds (s) for a stage on the full shape; a stage does not start with less time left.
MIN_SECONDS = {
    "prepare": 120,
    "transformers": 120,
    "head": 30,
    **dict.fromkeys(HTTP_CASES, 90),  # a warm start, 200 one-client and 2,000 64-client requests: ~75 s (R29)
    **dict.fromkeys(VLLM_CASES, 120),
    "vision": 180,
}


VARIANT_NAME = re.compile(r"[a-z0-9_]+")


REPETITION = re.compile(r"-again\d*$")


def result_key(case: str, runs_before: int) -> str:
    """The result key of a case's run after ``runs_before`` earlier runs of it in the same invocation: ``http``,
    then ``http-again``, ``http-again3``, ``http-again4``, ... (every run keeps its own result and logs)."""
    if runs_before == 0:
        return case
    return f"{case}-again" if runs_before == 1 else f"{case}-again{runs_before + 1}"


def base_case(key: str) -> str:
    """The case a result key belongs to: ``vllm-fp8-graphs+async-again`` → ``vllm-fp8-graphs``."""
    return REPETITION.sub("", key.split("+")[0])


def variant_name(key: str) -> str | None:
    """The ``--variant`` a case key names, if any: ``vllm-fp8-graphs+async-again3`` → ``async``."""
    return REPETITION.sub("", key.partition("+")[2]) or None


def agreement_pairs(cases: list[str]) -> list[tuple[str, str]]:
    """(reference, candidate) pairs: BF16 vs FP8, BF16 vs NVFP4 and FP8 vs NVFP4 in the same mode, transformers
    vs every vLLM case, eager vs compiled modes of the same precision, and every variant vs its plain case."""
    vllm_cases = [case for case in PLUGIN_CASES if case in cases]
    pairs = [
        (f"vllm-{a}-{m}", f"vllm-{b}-{m}")
        for a, b in (("bf16", "fp8"), ("bf16", "nvfp4"), ("fp8", "nvfp4"))
        for m in MODES
        if f"vllm-{a}-{m}" in cases and f"vllm-{b}-{m}" in cases
    ]
    pairs += [("transformers", case) for case in vllm_cases if "transformers" in cases]
    pairs += [
        (f"vllm-{p}-eager", f"vllm-{p}-{m}")
        for p in PRECISIONS
        for m in MODES[1:]
        if f"vllm-{p}-eager" in cases and f"vllm-{p}-{m}" in cases
    ]
    pairs += [(base_case(case), case) for case in sorted(cases) if variant_name(case) and base_case(case) in cases]
    return pairs
