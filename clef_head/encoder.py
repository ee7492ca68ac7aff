"""Turn a System One request into one prompt (token ids) and its question/option layout.

The prompt is a chat-formatted text: the system instruction, the state, then every question with
its numbered options, so the backbone reads the whole schema in one pass. The layout records where
each question's instruction and each option's description sit in the token sequence.

Work is bounded before it is done: the state's text is rendered piece by piece (:func:`json_pieces`, the
same text as :func:`render_json`) only as far as it is read, and a state longer than the prompt can hold is
tokenized from a prefix of that text (two characters per token of room, widened by the ratio seen until the
prefix yields enough tokens), never in full. Where the state fits, the whole text is tokenized, so prompts are
unchanged; where it is cut, the kept tokens come from well before the prefix's end (``STATE_MARGIN_TOKENS``),
where the cut cannot reach; the rest of the state is never rendered. Tokenizer calls hold one lock: a fast
tokenizer shared across threads can fail with "Already borrowed" when two threads use it at once.

The template's own pieces (the prompt's head and tail, the schema's headings, ``OPTION n:`` and line ends: about
half of a record's tokenizer calls) are tokenized once per tokenizer and kept (:func:`template_ids`); pieces are
tokenized one by one either way, so a prompt's ids do not depend on it.
"""

from __future__ import annotations

import json
import math
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from clef_head.layout import QUESTION_TYPE_IDS, QuestionLayout, RecordLayout
from clef_head.request import ChoiceQuestion, NoulQuestion, Question, ScoreQuestion, SystemOneRequest

if TYPE_CHECKING:
    from clef_head.media import EncodedMedia

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
#: Tokens tokenized past the state's room, so that cutting the text cannot change the kept tokens.
STATE_MARGIN_TOKENS = 64
#: First guess of characters per token when sizing the state's text prefix; a prefix that yields too few
#: tokens is widened by the ratio it showed (and at least doubled).
CHARS_PER_TOKEN_GUESS = 2
StateOverflow = Literal["truncate", "refuse"]
STATE_OVERFLOW_CHOICES: tuple[str, ...] = ("truncate", "refuse")
_tokenizer_lock = threading.Lock()
_template_cache: weakref.WeakKeyDictionary[Any, dict[str, tuple[int, ...]]] = weakref.WeakKeyDictionary()


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the encoder uses."""

    def __call__(self, text: str, add_special_tokens: bool = ...) -> Any: ...


class SchemaTooLong(ValueError):
    """The questions alone need more tokens than the prompt may hold."""

    def __init__(self, required: int, maximum: int) -> None:
        super().__init__(f"the schema needs {required} tokens before any state; the maximum prompt length is {maximum}")
        self.required = required
        self.maximum = maximum


class StateTooLong(ValueError):
    """The state does not fit the room the questions leave (raised only when overflow is refused)."""

    def __init__(self, state_tokens: int, exact: bool, room: int, maximum: int) -> None:
        needed = f"{state_tokens}" if exact else f"more than {state_tokens}"
        super().__init__(f"the state needs {needed} tokens; {room} of the {maximum}-token prompt are left for it")
        self.state_tokens = state_tokens
        self.exact = exact
        self.room = room
        self.maximum = maximum


@dataclass(frozen=True)
class EncodedRequest:
    """Token ids of one prompt, the layout of its questions, whether the state was cut to fit, and its images
    (their token ids start at ``media_offset``, right after ``STATE:\\n``)."""

    input_ids: list[int]
    layout: RecordLayout
    state_truncated: bool = False
    media: EncodedMedia | None = None
    media_offset: int = 0


def render_json(value: Any) -> str:
    """Text form of a value: strings as they are, anything else as compact, key-sorted JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


#: How ``json.dumps(..., ensure_ascii=False)`` writes a string (the standard library's own function).
_json_string = json.encoder.encode_basestring


def _json_scalar(value: Any) -> str:
    """``json.dumps`` of a scalar: the same function for strings, the same ``repr`` for numbers."""
    if isinstance(value, str):
        return str(_json_string(value))
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float.__repr__(value)
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)  # raises for non-JSON


def json_pieces(value: Any) -> Iterator[str]:
    """:func:`render_json`'s text of ``value`` in pieces, in order, rendered only as they are asked for.

    Objects' keys are sorted when the object is reached; no recursion (a deep value cannot overflow the stack).
    """
    if isinstance(value, str):
        yield value
        return
    # A frame: the children still to render, whether they are (key, value) items, whether one was rendered.
    frames: list[tuple[Iterator[Any], bool, list[bool]]] = []
    pending = value
    while True:
        if isinstance(pending, dict) and pending:
            yield "{"
            frames.append((iter(sorted(pending.items())), True, [False]))
        elif isinstance(pending, list) and pending:
            yield "["
            frames.append((iter(pending), False, [False]))
        elif isinstance(pending, (dict, list)):
            yield "{}" if isinstance(pending, dict) else "[]"
        else:
            yield _json_scalar(pending)
        while frames:
            children, is_object, started = frames[-1]
            child: Any = next(children, _END)
            if child is _END:
                frames.pop()
                yield "}" if is_object else "]"
                continue
            separator = "," if started[0] else ""
            started[0] = True
            if is_object:
                key, pending = child
                yield f"{separator}{_json_string(key)}:"
            else:
                pending = child
                if separator:
                    yield separator
            break
        else:
            return


_END = object()


class LazyText:
    """A text read from its pieces only as far as it is asked for."""

    def __init__(self, pieces: Iterator[str]) -> None:
        self._pieces = pieces
        self._parts: list[str] = []
        self._length = 0
        self._complete = False

    def _fill(self, length: float) -> None:
        while self._length < length and not self._complete:
            piece = next(self._pieces, None)
            if piece is None:
                self._complete = True
            else:
                self._parts.append(piece)
                self._length += len(piece)

    def longer_than(self, length: int) -> bool:
        """Whether the text has more than ``length`` characters (rendering at most one piece past them)."""
        self._fill(length + 1)
        return self._length > length

    def prefix(self, length: float) -> str:
        """The first ``length`` characters (all of them for ``math.inf``)."""
        self._fill(length)
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        text = self._parts[0] if self._parts else ""
        return text if length >= len(text) else text[: int(length)]


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


def template_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """:func:`_ids` of a piece of the prompt's template, tokenized once per tokenizer (a tokenizer that cannot be
    weakly referenced is asked every time). Call it only with text that comes from the template, never from a
    request: the kept pieces must stay few."""
    try:
        kept = _template_cache.setdefault(tokenizer, {})
    except TypeError:
        return _ids(tokenizer, text)
    ids = kept.get(text)
    if ids is None:
        ids = kept[text] = tuple(_ids(tokenizer, text))
    return list(ids)


def state_ids(tokenizer: Tokenizer, text: str | LazyText, room: int) -> tuple[list[int], int, bool]:
    """The first ``room`` tokens of ``text``, rendering and tokenizing only as much of it as needed.

    Returns (kept ids, tokens seen, whether every token of the text was seen).
    """
    lazy = text if isinstance(text, LazyText) else LazyText(iter((text,)))
    wanted = room + STATE_MARGIN_TOKENS
    budget = wanted * CHARS_PER_TOKEN_GUESS
    while lazy.longer_than(budget):
        ids = _ids(tokenizer, lazy.prefix(budget))
        if len(ids) >= wanted:
            return ids[:room], len(ids), False
        budget = max(2 * budget, (wanted * budget * 5) // (4 * max(len(ids), 1)))
    ids = _ids(tokenizer, lazy.prefix(math.inf))
    return ids[:room], len(ids), True


def encode_request(
    tokenizer: Tokenizer,
    request: SystemOneRequest,
    max_length: int = DEFAULT_MAX_LENGTH,
    overflow: StateOverflow = "truncate",
    media: EncodedMedia | None = None,
) -> EncodedRequest:
    """Encode a validated request. The state is cut to fit ``max_length`` (or refused with
    :class:`StateTooLong` when ``overflow`` is ``"refuse"``); the schema and the media never are. ``media``
    (:func:`clef_head.media.encode_media`) goes between ``STATE:\\n`` and the state, as the original release
    code places it."""
    with _tokenizer_lock:
        return _encode(tokenizer, request, max_length, overflow, media)


def _encode(
    tokenizer: Tokenizer,
    request: SystemOneRequest,
    max_length: int,
    overflow: StateOverflow,
    media: EncodedMedia | None,
) -> EncodedRequest:
    schema = template_ids(tokenizer, "\n\nSCHEMA FIELDS:\n")
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
        schema += template_ids(tokenizer, "\nALLOWED OPTIONS:\n")
        spans: list[tuple[int, int]] = []
        option_ids: list[str] = []
        for option_number, (option_id, description) in enumerate(question_options(question), start=1):
            schema += template_ids(tokenizer, f"OPTION {option_number}: ")
            option_start = len(schema)
            option_text: dict[str, Any] = {"option_id": option_id}
            if description is not None:
                option_text["description"] = description
            schema += _ids(tokenizer, render_json(option_text))
            spans.append((option_start, len(schema)))
            option_ids.append(option_id)
            schema += template_ids(tokenizer, "\n")
        schema += template_ids(tokenizer, "END FIELD\n")
        relative.append(
            QuestionLayout(
                question_id=question_id,
                type_id=QUESTION_TYPE_IDS[question.type],
                question_span=question_span,
                option_spans=tuple(spans),
                option_ids=tuple(option_ids),
            )
        )

    head = template_ids(tokenizer, PROMPT_HEAD)
    media_offset = len(head)
    if media is not None:
        head += media.token_ids
    tail = template_ids(tokenizer, PROMPT_TAIL)
    fixed = len(head) + len(schema) + len(tail)
    if fixed > max_length:
        raise SchemaTooLong(fixed, max_length)
    room = max_length - fixed
    state, seen, complete = state_ids(tokenizer, LazyText(json_pieces(request.state)), room)
    truncated = seen > room
    if truncated and overflow == "refuse":
        raise StateTooLong(seen, complete, room, max_length)
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
    return EncodedRequest(
        input_ids=head + state + schema + tail,
        layout=layout,
        state_truncated=truncated,
        media=media,
        media_offset=media_offset if media is not None else 0,
    )
