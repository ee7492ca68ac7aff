"""The GPU benchmark's CPU smoke mode, so the script cannot rot between GPU runs (its parts: ..._units.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
# CPU vLLM engines and a predictor: minutes. The first test's timeout covers the shared run.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]
# Every case of the smoke tests in one invocation: the tiny releases and records are built once, and each test reads
# its part of the one summary. The stock case runs as a variant (vllm-stock-bf16-eager+seqs2: max_num_seqs=2), so a
# --variant reaches a real engine without an engine of its own. One plugin case per code path: a vllm-bf16-eager case
# would run vllm-fp8-eager's code on the other release (each case is a process that imports vLLM and starts an
# engine); FP8's agreement is checked against the transformers case's BF16 logits, and the BF16-vs-FP8 and
# variant-vs-plain pairings in test_gpu_benchmark_units.py. The vision case is not here: its engine (vision tower
# loaded, multimodal profiling at start) and its four image sets would add minutes to a run that is already the suite's
# slowest; its parts that need no engine (images, names, figures, the ratio to the text case, the table) are tested
# in test_gpu_benchmark_units.py. Sizes are the smallest that still reach every code path (each engine start costs
# more than its records): 4 records, prompts up to 512 tokens, and the http case as a variant (http+lean) whose
# predictor warms up batches of at most 4 prompts (--max-batch 4) instead of 16, so --http-args reaches a predictor.
SMOKE_CASES = "prepare,transformers,head,vllm-stock-bf16-eager+seqs2,vllm-fp8-eager,http+lean"
RECORDS = 4
SMOKE_FLAGS = (
    "--variant",
    'seqs2={"max_num_seqs": 2}',
    "--http-args",
    "lean=--max-batch 4",
    "--http-mode",
    "eager",
    "--http-clients",
    "1,2",
    "--http-requests",
    "4",
    "--http-single-requests",
    "2",
    "--http-repeat-fractions",
    "0,0.5",
    "--http-repeat-clients",
    "1",
)


@dataclass(frozen=True)
class Smoke:
    """One CPU smoke run of the benchmark: its folder, summary and process."""

    work: Path
    summary: dict[str, Any]
    done: subprocess.CompletedProcess[str]

    def case(self, key: str) -> dict[str, Any]:
        """One case's result; a case that failed or was skipped fails the test with its reason."""
        result = self.summary["cases"][key]
        assert "error" not in result and "skipped" not in result, (result, self.done.stdout[-3000:])
        return result


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory, shared_compile_cache: Path, toy_release_fp8_layout: Path) -> Smoke:
    """``python -m bench.gpu_benchmark --device cpu`` over every smoke case, once for this module, on a toy-vocabulary
    BF16 release given as ``--bf16`` (the benchmark quantizes it to FP8 itself; ``clef_tools.fullsize`` builds the
    release when none is given, tested in test_fullsize_release.py). Its head is in clef_head/: the stock vLLM case
    loads every ``*.safetensors`` at the root of a release without a shard index, a head there included."""
    work = tmp_path_factory.mktemp("gpu-benchmark-smoke")
    command = [
        sys.executable,
        "-m",
        "bench.gpu_benchmark",
        "--device",
        "cpu",
        "--scale",
        "tiny",
        "--bf16",
        str(toy_release_fp8_layout),
        "--max-model-len",
        "512",
        "--records",
        str(RECORDS),
        "--tokens",
        "192",
        "--latency-records",
        "2",
        "--repeats",
        "2",
        "--work",
        str(work),
        "--out",
        str(work),
        "--cache-dir",
        str(shared_compile_cache),
        "--cases",
        SMOKE_CASES,
        "--time-budget",
        "1200",
        *SMOKE_FLAGS,
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1300)
    assert (work / "gpu_benchmark.json").is_file(), (done.stdout[-3000:], done.stderr[-3000:])
    return Smoke(work=work, summary=json.loads((work / "gpu_benchmark.json").read_text()), done=done)


def test_smoke_run_succeeds(smoke: Smoke) -> None:
    assert smoke.done.returncode == 0, (smoke.done.stdout[-3000:], smoke.done.stderr[-3000:], smoke.summary)
    assert set(smoke.summary["cases"]) == set(SMOKE_CASES.split(",")) - {"prepare"}


def test_smoke_transformers_and_head(smoke: Smoke) -> None:
    records = smoke.summary["prepare"]["records"]
    assert records["count"] == RECORDS and records["mean_questions"] >= 1
    transformers = smoke.case("transformers")
    assert transformers["records"] == RECORDS and transformers["prompt_tokens_per_s"] > 0
    # Steady state (the headline: median of the repeats) beside the first pass and the backbone alone.
    spread = transformers["prompt_tokens_per_s_spread"]
    assert (
        transformers["repeats"] == 2 and len(spread["runs"]) == 2 and spread["min"] <= spread["median"] <= spread["max"]
    )
    assert (
        transformers["first_pass"]["prompt_tokens_per_s"] > 0
        and transformers["backbone_only"]["prompt_tokens_per_s"] > 0
    )
    for label in ("first_pass", "steady"):
        assert 0 < transformers["split"][label]["head_share"] < 1
    assert transformers["split"]["head_share"] == transformers["split"]["steady"]["head_share"]
    head = smoke.case("head")
    assert head["batch_16_ms_per_record"] > 0
    one = head["one_record"]  # no CUDA here: the dynamic forward and the eager static pass only
    assert one["dynamic_ms_per_record"]["median"] > 0 and one["static_eager_ms_per_record"]["median"] > 0
    # A BF16 head: the static pass sums in another order than the dynamic one, so they may differ by a few BF16
    # steps (2**-7 at |logit| in [1, 2)); tests/head/test_head_graphs.py checks the two agree closely in FP32.
    assert "graphs_ms_per_record" not in one and one["static_max_abs_diff_vs_dynamic"] <= 4 * 2**-7
    assert (smoke.work / "logits-transformers.pt").is_file()


def test_smoke_stock_vllm_case_runs_without_the_plugin(smoke: Smoke) -> None:
    """The upper bound: the same release and engine settings, no plugin, last-token ``embed``; run as a variant, whose
    engine arguments reach the engine and its report."""
    stock = smoke.case("vllm-stock-bf16-eager+seqs2")
    assert stock["plugin"] is False and stock["architecture"] == "Qwen3_5ForConditionalGeneration"
    assert stock["records"] == RECORDS and stock["repeats"] == 2 and stock["single_record_ms"]["count"] == 2
    assert "single_against_batched" not in stock  # embeddings, not option logits
    assert stock["output_shape"] == [128]  # one hidden-size vector per record (the tiny release's hidden size)
    assert stock["max_num_seqs"] == 2 and smoke.case("vllm-fp8-eager")["max_num_seqs"] != 2
    assert (smoke.work / "results" / "vllm-stock-bf16-eager+seqs2.json").is_file()
    assert not (smoke.work / "logits-vllm-stock-bf16-eager+seqs2.pt").is_file()


def test_smoke_http_case_with_repeated_requests(smoke: Smoke) -> None:
    """The http case end to end on CPU vLLM: the predictor started as on the GPU (with a variant's extra
    argument: warm-up batches of at most 4 prompts), its loads through the load tool's client, and the
    repeated-request loads with the answer cache's counts."""
    http = smoke.case("http+lean")
    assert http["ready_s"] > 0 and http["mode"] == "eager"
    assert http["command"].endswith("--max-model-len 512 --gpu-memory-utilization 0.85 --enforce-eager --max-batch 4")
    assert [(load["clients"], load["requests"], load["errors"]) for load in http["loads"]] == [(1, 2, 0), (2, 8, 0)]
    assert all(
        load["tokens_per_s"] > 0 and "clef_stage_seconds{stage=encode}" in load["server_ms_mean"]
        for load in http["loads"]
    )
    # no encode workers on a CPU engine: every body prepared in the serving process, the warm-up's (as many as the
    # load's requests here: at most 8) and the load's
    assert [load["encode_bodies"] for load in http["loads"]] == [{"serving": 2 + 2}, {"serving": 8 + 8}]
    unique, repeated = http["repeat_loads"]
    assert (unique["repeat_fraction"], repeated["repeat_fraction"]) == (0.0, 0.5)
    assert unique["errors"] == repeated["errors"] == 0 and unique["requests"] == repeated["requests"] == 4
    # counts include each load's warm-up, which sends the same request indices first
    assert unique["answer_cache"].get("hit", 0) == unique["answer_cache"].get("merged", 0) == 0
    assert repeated["answer_cache"].get("hit", 0) + repeated["answer_cache"].get("merged", 0) > 0


def test_smoke_with_vllm_reports_fp8_agreement(smoke: Smoke) -> None:
    result = smoke.case("vllm-fp8-eager")
    assert result["records"] == RECORDS and result["start_s"] > 0 and result["single_record_ms"]["p50"] > 0
    assert result["mode"] == "eager" and result["plugin"] is True and result["repeats"] == 2
    alone = result["single_against_batched"]  # the lone records' logits against the same records' batched ones
    assert alone["questions"] > 0 and 0 <= alone["mean_kl"] < 1e-2
    assert (smoke.work / "results" / "vllm-fp8-eager.json").is_file()
    assert (smoke.work / "logits-vllm-fp8-eager.pt").is_file()
    agreement = smoke.summary["agreement"]["transformers vs vllm-fp8-eager"]  # the BF16 release's logits vs FP8's
    assert agreement["questions"] >= RECORDS and 0 <= agreement["mean_kl"] < 1e-2
    assert set(smoke.summary["agreement"]) == {"transformers vs vllm-fp8-eager"}
