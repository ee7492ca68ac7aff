"""Scoring encoded records through an engine and checking them against reference logits."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

import clef_plugin
from bench.agreement import question_agreement
from clef_head.encoder import EncodedRequest

TIE_ULPS = 4
"""Top-1 may differ only where the reference's two options are within this many BF16 steps.

On the tiny release with Qwen3.5's vocabulary, CPU vLLM's BF16 logits differ from the reference's by up
to ~7 BF16 steps (e.g. 0.4336 vs 0.4473), and one of the 100 parity records flips a reference gap of
3.0 steps; the max |Δ probability| bound still applies to every option."""


def encode_with_engine(llm: Any, encoded: Sequence[EncodedRequest]) -> list[torch.Tensor]:
    """Option logits of every record, all submitted in one ``llm.encode`` call."""
    outputs = llm.encode(
        [{"prompt_token_ids": item.input_ids} for item in encoded],
        pooling_params=[clef_plugin.pooling_params(item.layout, len(item.input_ids)) for item in encoded],
        pooling_task=clef_plugin.POOLING_TASK,
        use_tqdm=False,
    )
    assert len(outputs) == len(encoded)
    return [clef_plugin.option_logits(output) for output in outputs]


def bf16_step(value: float) -> float:
    """Spacing of BF16 numbers around ``value`` (the head computes its logits in BF16)."""
    magnitude = max(abs(value), torch.finfo(torch.bfloat16).tiny)
    return torch.finfo(torch.bfloat16).eps * 2.0 ** math.floor(math.log2(magnitude))


def top1_flips(
    encoded: Sequence[EncodedRequest], reference: Sequence[torch.Tensor], candidate: Sequence[torch.Tensor]
) -> tuple[list[str], list[str]]:
    """Questions whose top-1 differs: (near ties of the reference, real disagreements)."""
    ties: list[str] = []
    disagreements: list[str] = []
    for index, (item, ref, cand) in enumerate(zip(encoded, reference, candidate, strict=True)):
        sizes = [len(question.option_ids) for question in item.layout.questions]
        for question, ref_q, cand_q in zip(
            item.layout.questions, torch.split(ref, sizes), torch.split(cand, sizes), strict=True
        ):
            ours, theirs = int(cand_q.argmax()), int(ref_q.argmax())
            if ours == theirs:
                continue
            gap = float(ref_q[theirs] - ref_q[ours])
            steps = gap / bf16_step(float(ref_q[theirs]))
            note = f"record {index} {question.question_id}: reference gap {gap:.5f} ({steps:.1f} BF16 steps)"
            (ties if gap <= TIE_ULPS * bf16_step(float(ref_q[theirs])) else disagreements).append(note)
    return ties, disagreements


def assert_parity(
    label: str,
    encoded: Sequence[EncodedRequest],
    reference: Sequence[torch.Tensor],
    candidate: Sequence[torch.Tensor],
    tolerance: float,
) -> dict[str, Any]:
    """Same top-1 option on every question (reference near-ties excepted) and max |Δ probability| <= tolerance."""
    stats: dict[str, Any] = dict(question_agreement([item.layout for item in encoded], reference, candidate))
    ties, disagreements = top1_flips(encoded, reference, candidate)
    stats["near_tie_flips"] = len(ties)
    print(
        f"\n[{label}] {len(encoded)} records, {stats['questions']} questions: "
        f"top-1 agreement {stats['top1_agreement']:.4f} ({len(ties)} flips on reference near-ties "
        f"<= {TIE_ULPS} BF16 steps), max |Δp| {stats['max_probability_diff']:.5f}, max KL {stats['max_kl']:.2e}"
    )
    for note in ties:
        print(f"  near tie: {note}")
    assert not disagreements, disagreements
    assert stats["max_probability_diff"] <= tolerance, stats
    return stats
