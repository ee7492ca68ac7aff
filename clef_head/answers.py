"""Option logits → System One answers and the response body."""

from __future__ import annotations

from typing import Any

import torch

from clef_head.layout import RecordLayout
from clef_head.request import ChoiceQuestion, NoulQuestion, Question, SystemOneRequest

DECIMALS = 4


def _r(value: float) -> float:
    return round(value, DECIMALS)


def answer_question(question: Question, probabilities: dict[str, float]) -> dict[str, Any]:
    """One answer from per-option probabilities (option id → probability)."""
    if isinstance(question, NoulQuestion):
        return {"type": "noul", "noul": _r(probabilities["true"])}
    if isinstance(question, ChoiceQuestion):
        labels = list(question.criteria)  # the caller's order
        best = max(labels, key=probabilities.__getitem__)
        return {
            "type": "choice",
            "choice": best,
            "confidence": _r(probabilities[best]),
            "probabilities": {label: _r(probabilities[label]) for label in labels},
        }
    levels = [str(index) for index in range(len(question.criteria))]
    return {
        "type": "score",
        "score": _r(sum(index * probabilities[level] for index, level in enumerate(levels))),
        "confidence": _r(max(probabilities[level] for level in levels)),
        "legend": dict(zip(levels, question.criteria, strict=True)),
        "probabilities": {level: _r(probabilities[level]) for level in levels},
    }


def build_response(
    request: SystemOneRequest,
    layout: RecordLayout,
    option_logits: torch.Tensor,
    input_tokens: int,
    model_name: str | None = None,
) -> dict[str, Any]:
    """The ``/v1/systemone`` response body from one record's flat option logits."""
    if option_logits.shape != (layout.option_count,):
        raise ValueError(f"expected {layout.option_count} option logits, got shape {tuple(option_logits.shape)}")
    per_question = torch.split(option_logits.float(), [len(q.option_ids) for q in layout.questions])
    answers = {}
    for question_layout, logits in zip(layout.questions, per_question, strict=True):
        probabilities = dict(zip(question_layout.option_ids, logits.softmax(-1).tolist(), strict=True))
        question = request.questions[question_layout.question_id]
        answers[question_layout.question_id] = answer_question(question, probabilities)
    return {
        "model": model_name or request.model,
        "answers": answers,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }
