"""The encode benchmark script runs, so it cannot rot between benchmark runs, and shows the template's pieces
tokenized once: a body costs fewer tokenizer calls than its prompt has pieces."""

from __future__ import annotations

import json

from tests.bench.scripts import run_bench


def test_encode_benchmark_prints_the_time_and_tokenizer_calls_per_body() -> None:
    stdout = run_bench("encode_benchmark", "--records", "8", "--repeats", "1")
    result = json.loads(stdout.splitlines()[0])
    assert result["records"] == 8 and 400 < result["prompt_tokens_mean"] < 700
    assert result["ms_per_body"] > 0
    # Each question of these records has a heading, an instruction and options: without the template's pieces
    # kept, a body asks the tokenizer for every one of them (37 calls on average at 512 tokens).
    assert result["tokenizer_calls_per_body"] < 20
