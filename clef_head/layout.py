"""Where each question and option sits in an encoded prompt.

The layout is plain data (ints, strings, lists) so it can travel to a vLLM engine inside
``PoolingParams.extra_kwargs`` (msgpack) and be checked again on arrival.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QUESTION_TYPE_IDS: dict[str, int] = {"noul": 0, "choice": 1, "score": 2}

Span = tuple[int, int]


class LayoutError(ValueError):
    """A layout that is malformed or does not fit the prompt it claims to describe."""


@dataclass(frozen=True)
class QuestionLayout:
    """One question: its id, type id, instruction span and one span and id per option."""

    question_id: str
    type_id: int
    question_span: Span
    option_spans: tuple[Span, ...]
    option_ids: tuple[str, ...]


@dataclass(frozen=True)
class RecordLayout:
    """All questions of one prompt, in request order."""

    questions: tuple[QuestionLayout, ...]

    @property
    def option_count(self) -> int:
        """Number of options over all questions (length of the flat logit vector)."""
        return sum(len(question.option_spans) for question in self.questions)

    def to_wire(self) -> dict[str, Any]:
        """Plain, msgpack-serializable form."""
        return {
            "questions": [
                {
                    "id": question.question_id,
                    "type": question.type_id,
                    "span": list(question.question_span),
                    "option_spans": [list(span) for span in question.option_spans],
                    "option_ids": list(question.option_ids),
                }
                for question in self.questions
            ]
        }

    @classmethod
    def from_wire(cls, data: Any, prompt_length: int | None = None) -> RecordLayout:
        """Rebuild a layout from :meth:`to_wire` output, checking every field and span."""
        if not isinstance(data, dict) or not isinstance(data.get("questions"), list):
            raise LayoutError("layout must be an object with a 'questions' list")
        if not data["questions"]:
            raise LayoutError("layout has no questions")
        questions = []
        for index, item in enumerate(data["questions"]):
            where = f"layout.questions[{index}]"
            if not isinstance(item, dict):
                raise LayoutError(f"{where} must be an object")
            type_id = item.get("type")
            if not isinstance(type_id, int) or isinstance(type_id, bool) or type_id not in QUESTION_TYPE_IDS.values():
                raise LayoutError(f"{where}.type must be 0, 1 or 2")
            spans = item.get("option_spans")
            option_ids = item.get("option_ids")
            if not isinstance(spans, list) or not spans:
                raise LayoutError(f"{where}.option_spans must be a non-empty list")
            if not isinstance(option_ids, list) or len(option_ids) != len(spans):
                raise LayoutError(f"{where}.option_ids must list one id per option span")
            if not all(isinstance(option_id, str) for option_id in option_ids):
                raise LayoutError(f"{where}.option_ids must be strings")
            if not isinstance(item.get("id"), str):
                raise LayoutError(f"{where}.id must be a string")
            questions.append(
                QuestionLayout(
                    question_id=item["id"],
                    type_id=type_id,
                    question_span=_span(item.get("span"), f"{where}.span", prompt_length),
                    option_spans=tuple(
                        _span(span, f"{where}.option_spans[{i}]", prompt_length) for i, span in enumerate(spans)
                    ),
                    option_ids=tuple(option_ids),
                )
            )
        return cls(questions=tuple(questions))


def _span(value: Any, where: str, prompt_length: int | None) -> Span:
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise LayoutError(f"{where} must be a [start, end] pair of integers")
    start, end = value
    if not 0 <= start < end:
        raise LayoutError(f"{where} must satisfy 0 <= start < end, got [{start}, {end}]")
    if prompt_length is not None and end > prompt_length:
        raise LayoutError(f"{where} ends at {end}, past the prompt's {prompt_length} tokens")
    return (start, end)
