"""The System One request: typed models, configurable limits and errors that name the field.

A request has a ``model`` name, a ``state`` (any JSON value) and ``questions``: question id →
``noul`` (yes/no), ``choice`` (one label of ``criteria``) or ``score`` (one level of ``criteria``).

What the original release code answers is accepted within the hosted API's limits: a top-level ``id``,
fields it does not read (ignored, logged at debug level), numbers and booleans as instructions or
descriptions (rendered as JSON text, as it does) and an empty question id (with instructions: without
them the question would have no text at all). Nesting deeper than
``RequestLimits.max_depth`` is refused before any other work.

Images come as the hosted API's ``assets`` (placeholder → ``data_base64`` + ``format``, or the name of a
multipart ``part``) or as the original release code's ``images`` (base64 or ``data:image/...;base64,`` URLs);
videos as the original's ``videos``, each ``{"frames": [...], "fps": ...}`` (:class:`Video`);
:mod:`clef_head.assets` resolves them. The hosted API's ``box`` questions are refused by name: this model's
head has no box output.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import ErrorDetails

log = logging.getLogger(__name__)
Location = tuple[int | str, ...]
_DESCRIPTION_TYPES = (str, dict, list, int, float)  # bool is an int


def _description(value: Any) -> Any:
    if not isinstance(value, _DESCRIPTION_TYPES):
        raise ValueError("must be a string, a number, a boolean, a JSON object or a JSON array")
    return value


def _optional_description(value: Any) -> Any:
    return None if value is None else _description(value)


# A description (instructions, option or level): text, a number, or a JSON object or array; null: none.
OptionalDescription = Annotated[Any, AfterValidator(_optional_description)]
QUESTION_TYPES: tuple[str, ...] = ("noul", "choice", "score")
UNSUPPORTED_QUESTION_TYPES: dict[str, str] = {
    "box": "box questions are not supported by this model: its head answers noul, choice and score questions "
    "and has no box output",
}
"""Question types of the hosted API this model cannot answer, and why."""


@dataclass(frozen=True)
class RequestLimits:
    """Bounds a request must respect; every one has a default and can be changed by the server."""

    max_questions: int = 64
    min_choice_labels: int = 2
    max_choice_labels: int = 255
    min_score_levels: int = 2
    max_score_levels: int = 10
    max_id_chars: int = 256
    max_depth: int = 128


DEFAULT_LIMITS = RequestLimits()


class InvalidRequest(ValueError):
    """A request that breaks a rule: ``loc`` is the path of the offending field, ``param`` its dotted form,
    ``kind`` pydantic's error type (``missing``, ``value_error`` ...)."""

    def __init__(self, loc: Location, message: str, kind: str = "value_error") -> None:
        self.loc = tuple(loc)
        self.param = ".".join(str(part) for part in self.loc)
        super().__init__(f"{self.param}: {message}" if self.param else message)
        self.message = message
        self.kind = kind


def _limits(info: ValidationInfo) -> RequestLimits:
    context = info.context or {}
    return context.get("limits", DEFAULT_LIMITS)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class NoulCriteria(_Strict):
    """Optional descriptions of what counts as true and as false."""

    true: OptionalDescription = None
    false: OptionalDescription = None


class NoulQuestion(_Strict):
    """A yes/no question or statement."""

    type: Literal["noul"]
    instructions: OptionalDescription = None
    criteria: NoulCriteria | None = None


class ChoiceQuestion(_Strict):
    """Pick one label of ``criteria`` (label → description or null)."""

    type: Literal["choice"]
    instructions: OptionalDescription = None
    criteria: dict[str, OptionalDescription]

    @field_validator("criteria")
    @classmethod
    def _label_count(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        limits = _limits(info)
        if not limits.min_choice_labels <= len(value) <= limits.max_choice_labels:
            raise ValueError(
                f"a choice question needs {limits.min_choice_labels} to "
                f"{limits.max_choice_labels} labels, got {len(value)}"
            )
        for label in value:
            if not label or len(label) > limits.max_id_chars:
                raise ValueError(f"labels must have 1 to {limits.max_id_chars} characters")
        return value


class ScoreQuestion(_Strict):
    """Rate on the levels of ``criteria`` (level index → description or null: a null level is an option
    without a description, as in the original release code)."""

    type: Literal["score"]
    instructions: OptionalDescription = None
    criteria: list[OptionalDescription]

    @field_validator("criteria")
    @classmethod
    def _level_count(cls, value: list[Any], info: ValidationInfo) -> list[Any]:
        limits = _limits(info)
        if not limits.min_score_levels <= len(value) <= limits.max_score_levels:
            raise ValueError(
                f"a score question needs {limits.min_score_levels} to "
                f"{limits.max_score_levels} levels, got {len(value)}"
            )
        return value


Question = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


class Asset(_Strict):
    """One image of ``assets``: its bytes as ``data_base64`` (with their ``format``) or, in a multipart body,
    the name of the ``part`` that holds them (``data_base64`` is then ignored, as the hosted API does)."""

    type: Literal["image"] | None = None
    format: Literal["png", "jpg", "jpeg"] | None = None
    data_base64: str | None = None
    part: str | None = None

    @field_validator("part")
    @classmethod
    def _part_name(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError("a part name must not be empty")
        return value

    def model_post_init(self, context: Any) -> None:
        if self.part is None and (self.data_base64 is None or self.format is None):
            missing = "data_base64" if self.data_base64 is None else "format"
            raise ValueError(
                f"an asset needs part (in a multipart body), or data_base64 and format; {missing} is missing"
            )


MAX_VIDEO_FPS = 1000.0
"""The highest ``fps`` a video may state."""


class Video(_Strict):
    """One video of ``videos``: its frames in order, each a PNG or JPEG image as ``images`` takes them
    (``data:image/...;base64,`` URL or bare base64), all of one size; ``fps``: the frames per second at which
    they were taken (unstated: the release's video processor assumes 24). The processor keeps 2 frames a
    second of the clip (at least 4, at most all of them) and the prompt states each kept pair's time."""

    frames: list[str]
    fps: float | None = Field(default=None, gt=0, le=MAX_VIDEO_FPS)


class SystemOneRequest(_Strict):
    """A ``POST /v1/systemone`` body. ``id`` is not read."""

    model: str
    state: Any  # any JSON value, checked by the walk in parse_request
    questions: dict[str, Question]
    id: Any = None
    images: list[str] | None = None
    videos: list[Video] | None = None
    assets: dict[str, Asset] | None = None

    @field_validator("questions")
    @classmethod
    def _question_count(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        limits = _limits(info)
        if not 1 <= len(value) <= limits.max_questions:
            raise ValueError(f"between 1 and {limits.max_questions} questions are required, got {len(value)}")
        for question_id in value:
            if len(question_id) > limits.max_id_chars:
                raise ValueError(f"question ids must have at most {limits.max_id_chars} characters")
        empty = value.get("")
        if empty is not None and empty.instructions in (None, ""):
            # The question's text would be empty: the head would average over no tokens.
            raise ValueError("a question with an empty id needs instructions")
        return value

    @field_validator("assets")
    @classmethod
    def _placeholders(cls, value: dict[str, Asset] | None, info: ValidationInfo) -> dict[str, Asset] | None:
        limits = _limits(info)
        for placeholder in value or ():
            if not placeholder or len(placeholder) > limits.max_id_chars:
                raise ValueError(f"asset placeholders must have 1 to {limits.max_id_chars} characters")
        return value

    @property
    def has_media(self) -> bool:
        """Whether the request sends images (``images`` or ``assets``) or ``videos``."""
        return bool(self.images or self.assets or self.videos)


def _error_location(location: tuple[int | str, ...]) -> Location:
    """Field path of a pydantic error location, without union tags."""
    parts = list(location)
    # questions.<id>.<tag>.field: the discriminator tag is pydantic's, not the caller's.
    if len(parts) > 2 and parts[0] == "questions" and parts[2] in QUESTION_TYPES:
        del parts[2]
    return tuple(parts)


def _error_message(error: ErrorDetails) -> str:
    message = str(error["msg"])
    if error["type"] == "union_tag_invalid":  # a known question type this model cannot answer is named
        tag = (error.get("ctx") or {}).get("tag")
        return UNSUPPORTED_QUESTION_TYPES.get(str(tag), "type must be one of noul, choice, score")
    if error["type"] == "union_tag_not_found":
        return "type must be one of noul, choice, score"
    if error["type"] == "model_type":  # pydantic's message names the model class, which callers do not know
        return "must be a JSON object"
    return message.removeprefix("Value error, ")


_REPORTED_DEPTH = 4  # a too-deep value is reported at its first four path components (state, questions.q.criteria.x)


def check_json(body: Any, max_depth: int) -> None:
    """Refuse values JSON cannot hold and nesting deeper than ``max_depth`` (iterative: no recursion limit).

    A fast walk finds whether something is wrong; only then a second walk finds where.
    """
    stack: list[tuple[Any, int]] = [(body, 0)]
    while stack:
        value, depth = stack.pop()
        kind = type(value)
        if kind is dict:
            if depth >= max_depth or not all(type(key) is str for key in value):
                _locate_json_error(body, max_depth)
            stack.extend((child, depth + 1) for child in value.values())
        elif kind is list:
            if depth >= max_depth:
                _locate_json_error(body, max_depth)
            stack.extend((child, depth + 1) for child in value)
        elif not (value is None or isinstance(value, (str, int, float))):
            _locate_json_error(body, max_depth)


def _locate_json_error(body: Any, max_depth: int) -> None:
    """Raise the :class:`InvalidRequest` for the first bad value of ``body``, with its field path."""
    stack: list[tuple[Any, int, Location]] = [(body, 0, ())]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, dict):
            children: Iterable[tuple[Any, Any]] = value.items()
        elif isinstance(value, list):
            children = enumerate(value)
        elif value is None or isinstance(value, (str, int, float)):
            continue
        else:
            raise InvalidRequest(where, f"{type(value).__name__} is not a JSON value", "json_type")
        if depth >= max_depth:
            raise InvalidRequest(where, f"nested deeper than {max_depth} levels", "too_deep")
        for key, child in children:
            if isinstance(value, dict) and not isinstance(key, str):
                raise InvalidRequest(where, "object keys must be strings", "json_type")
            stack.append((child, depth + 1, (*where, key) if len(where) < _REPORTED_DEPTH else where))
    raise AssertionError("a JSON error was found and then not located")


_QUESTION_FIELDS = {
    name: set(model.model_fields)
    for name, model in (("noul", NoulQuestion), ("choice", ChoiceQuestion), ("score", ScoreQuestion))
}


def unknown_fields(body: dict[str, Any]) -> list[str]:
    """Dotted paths of the fields no model reads (ignored, as the original release code ignores them)."""
    unknown = [key for key in body if key not in SystemOneRequest.model_fields]
    questions = body.get("questions")
    for question_id, question in questions.items() if isinstance(questions, dict) else ():
        if not isinstance(question, dict) or question.get("type") not in _QUESTION_FIELDS:
            continue
        unknown += [
            f"questions.{question_id}.{key}" for key in question if key not in _QUESTION_FIELDS[question["type"]]
        ]
        criteria = question.get("criteria")
        if question["type"] == "noul" and isinstance(criteria, dict):
            unknown += [f"questions.{question_id}.criteria.{key}" for key in criteria if key not in ("true", "false")]
    return unknown


def parse_request(body: Any, limits: RequestLimits = DEFAULT_LIMITS) -> SystemOneRequest:
    """Validate a decoded JSON body; raise :class:`InvalidRequest` naming the first bad field."""
    if not isinstance(body, dict):
        raise InvalidRequest((), "the request body must be a JSON object", "model_type")
    check_json(body, limits.max_depth)
    try:
        request = SystemOneRequest.model_validate(body, context={"limits": limits})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = _error_location(first["loc"])
        if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            where = (*where, "type")
        raise InvalidRequest(where, _error_message(first), str(first["type"])) from None
    if log.isEnabledFor(logging.DEBUG):
        ignored = unknown_fields(body)
        if ignored:
            log.debug("ignored fields the model does not read: %s", ", ".join(ignored)[:1000])
    return request
