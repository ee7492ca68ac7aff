"""The System One request: typed models, configurable limits and errors that name the field.

A request has a ``model`` name, a ``state`` (any JSON value) and ``questions``: question id →
``noul`` (yes/no), ``choice`` (one label of ``criteria``) or ``score`` (one level of ``criteria``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    ValidationInfo,
    field_validator,
)



def _description(value: Any) -> Any:
    if not isinstance(value, (str, dict, list)):
        raise ValueError("must be a string, a JSON object or a JSON array")
    return value


def _optional_description(value: Any) -> Any:
    return None if value is None else _description(value)


# A description (instructions, option or level): text, or a JSON object or array.
Description = Annotated[Any, AfterValidator(_description)]
OptionalDescription = Annotated[Any, AfterValidator(_optional_description)]
QUESTION_TYPES: tuple[str, ...] = ("noul", "choice", "score")


@dataclass(frozen=True)
class RequestLimits:
    """Bounds a request must respect; every one has a default and can be changed by the server."""

    max_questions: int = 64
    min_choice_labels: int = 2
    max_choice_labels: int = 255
    min_score_levels: int = 2
    max_score_levels: int = 10
    max_id_chars: int = 256


DEFAULT_LIMITS = RequestLimits()


class InvalidRequest(ValueError):
    """A request that breaks a rule. ``param`` is the dotted path of the offending field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param
        self.message = message


def _limits(info: ValidationInfo) -> RequestLimits:
    context = info.context or {}
    return context.get("limits", DEFAULT_LIMITS)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


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
    """Rate on the levels of ``criteria`` (level index → description)."""

    type: Literal["score"]
    instructions: OptionalDescription = None
    criteria: list[Description]

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


Question = Annotated[
    Union[NoulQuestion, ChoiceQuestion, ScoreQuestion], Field(discriminator="type")
]


class SystemOneRequest(_Strict):
    """A ``POST /v1/systemone`` body. Media fields are accepted only when empty."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    model: str
    state: JsonValue
    questions: dict[str, Question]
    images: list[JsonValue] | None = None
    videos: list[JsonValue] | None = None
    assets: dict[str, JsonValue] | None = None

    @field_validator("questions")
    @classmethod
    def _question_count(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        limits = _limits(info)
        if not 1 <= len(value) <= limits.max_questions:
            raise ValueError(
                f"between 1 and {limits.max_questions} questions are required, got {len(value)}"
            )
        for question_id in value:
            if not question_id or len(question_id) > limits.max_id_chars:
                raise ValueError(f"question ids must have 1 to {limits.max_id_chars} characters")
        return value

    @field_validator("images", "videos", "assets")
    @classmethod
    def _no_media(cls, value: Any) -> Any:
        if value:
            raise ValueError("images and videos are not supported: this model reads text and JSON only")
        return value


def _error_path(location: tuple[int | str, ...]) -> str:
    """Dotted field path of a pydantic error location, without union tags."""
    parts = list(location)
    # questions.<id>.<tag>.field: the discriminator tag is pydantic's, not the caller's.
    if len(parts) > 2 and parts[0] == "questions" and parts[2] in QUESTION_TYPES:
        del parts[2]
    return ".".join(str(part) for part in parts)


def _error_message(error: dict[str, Any]) -> str:
    message = str(error["msg"])
    if error["type"] == "union_tag_invalid" or error["type"] == "union_tag_not_found":
        return "type must be one of noul, choice, score"
    return message.removeprefix("Value error, ")


def parse_request(body: Any, limits: RequestLimits = DEFAULT_LIMITS) -> SystemOneRequest:
    """Validate a decoded JSON body; raise :class:`InvalidRequest` naming the first bad field."""
    if not isinstance(body, dict):
        raise InvalidRequest("", "the request body must be a JSON object")
    try:
        return SystemOneRequest.model_validate(body, context={"limits": limits})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise InvalidRequest(_error_path(first["loc"]), _error_message(first)) from None
