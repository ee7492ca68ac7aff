"""Turn a System One request into one prompt (token ids) and its question/option layout.

The prompt is a chat-formatted text: the system instruction, the state, then every question with
its numbered options, so the backbone reads the whole schema in one pass. The layout records where
each question's instruction and each option's description sit in the token sequence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from clef_head.layout import QUESTION_TYPE_IDS, QuestionLayout, RecordLayout
from clef_head.request import ChoiceQuestion, NoulQuestion, Question, ScoreQuestion, SystemOneRequest

SYSTEM_INSTRUCTION = (
    "Read the complete state and schema. Decide every field jointly. Each answer "
    "must be exactly one of that field's allowed options."
)
PROMPT_HEAD = f"<|im_start|>system\n{SYSTEM_INSTRUCTION}<|im_end|>\n<|im_start|>user\nSTATE:\n"
PROMPT_TAIL = "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:"
NOUL_DEFAULTS: dict[str, str] = {
    "true": "The proposition is true or the answer is yes.",
    "false": "The proposition is false or the answer is no.",
}
DEFAULT_MAX_LENGTH = 16384


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the encoder uses."""

    def __call__(self, text: str, add_special_tokens: bool = ...) -> Any: ...


class SchemaTooLong(ValueError):
    """The questions alone need more tokens than the prompt may hold."""

    def __init__(self, required: int, maximum: int) -> None:
        super().__init__(
            f"the schema needs {required} tokens before any state; the maximum prompt length is {maximum}"
        )
        self.required = required
        self.maximum = maximum


@dataclass(frozen=True)
class EncodedRequest:
    """Token ids of one prompt and the layout of its questions."""

    input_ids: list[int]
    layout: RecordLayout


def render_json(value: Any) -> str:
    """Text form of a value: strings as they are, anything else as compact, key-sorted JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def question_options(question: Question) -> list[tuple[str, Any]]:
    """The options of a question in prompt order, each as (option id, description or None).

    noul: true then false (caller's descriptions override the defaults); choice: labels sorted;
    score: levels by index.
    """
    if isinstance(question, NoulQuestion):
        descriptions: dict[str, Any] = dict(NOUL_DEFAULTS)
        if question.criteria is not None:
            for key in question.criteria.model_fields_set:
                descriptions[key] = getattr(question.criteria, key)
        return [("true", descriptions["true"]), ("false", descriptions["false"])]
    if isinstance(question, ChoiceQuestion):
        return sorted(question.criteria.items())
    assert isinstance(question, ScoreQuestion)
    return [(str(index), description) for index, description in enumerate(question.criteria)]


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_request(
    tokenizer: Tokenizer,
    request: SystemOneRequest,
    max_length: int = DEFAULT_MAX_LENGTH,
) -> EncodedRequest:
    """Encode a validated request. The state is cut to fit ``max_length``; the schema never is."""
    schema = _ids(tokenizer, "\n\nSCHEMA FIELDS:\n")
    relative: list[QuestionLayout] = []
    for number, (question_id, question) in enumerate(request.questions.items(), start=1):
        schema += _ids(
            tokenizer,
            f"\nFIELD {number}\nID: {question_id}\nTYPE: {question.type}\nINSTRUCTION: ",
        )
        instructions = question.instructions
        if instructions is None or instructions == "":
            instructions = question_id
        question_start = len(schema)
        schema += _ids(tokenizer, render_json(instructions))
        question_span = (question_start, len(schema))
        schema += _ids(tokenizer, "\nALLOWED OPTIONS:\n")
        spans: list[tuple[int, int]] = []
        option_ids: list[str] = []
        for option_number, (option_id, description) in enumerate(question_options(question), start=1):
            schema += _ids(tokenizer, f"OPTION {option_number}: ")
            option_start = len(schema)
            option_text: dict[str, Any] = {"option_id": option_id}
            if description is not None:
                option_text["description"] = description
            schema += _ids(tokenizer, render_json(option_text))
            spans.append((option_start, len(schema)))
            option_ids.append(option_id)
            schema += _ids(tokenizer, "\n")
        schema += _ids(tokenizer, "END FIELD\n")
        relative.append(
            QuestionLayout(
                question_id=question_id,
                type_id=QUESTION_TYPE_IDS[question.type],
                question_span=question_span,
                option_spans=tuple(spans),
                option_ids=tuple(option_ids),
            )
        )

    head = _ids(tokenizer, PROMPT_HEAD)
    tail = _ids(tokenizer, PROMPT_TAIL)
    fixed = len(head) + len(schema) + len(tail)
    if fixed > max_length:
        raise SchemaTooLong(fixed, max_length)
    state = _ids(tokenizer, render_json(request.state))[: max_length - fixed]
    offset = len(head) + len(state)
    layout = RecordLayout(
        questions=tuple(
            QuestionLayout(
                question_id=q.question_id,
                type_id=q.type_id,
                question_span=(q.question_span[0] + offset, q.question_span[1] + offset),
                option_spans=tuple((s + offset, e + offset) for s, e in q.option_spans),
                option_ids=q.option_ids,
            )
            for q in relative
        )
    )
    return EncodedRequest(input_ids=head + state + schema + tail, layout=layout)
