"""Request validation: each refusal names the field path and the rule."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from clef_head.request import InvalidRequest, RequestLimits, parse_request

VALID: dict[str, Any] = {
    "model": "clef-flash",
    "state": {"message": "I was charged twice"},
    "questions": {
        "billing": {"type": "noul", "instructions": "Is this about billing?"},
        "tone": {"type": "choice", "criteria": {"calm": None, "angry": "upset"}},
        "urgency": {"type": "score", "criteria": ["low", "high"]},
    },
}


def _with(path: str, value: Any) -> dict[str, Any]:
    body = copy.deepcopy(VALID)
    *parents, last = path.split(".")
    target = body
    for key in parents:
        target = target[key]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return body


_DELETE = object()

INVALID = [
    ("missing model", _with("model", _DELETE), "model", "Field required"),
    ("model not a string", _with("model", 3), "model", "string"),
    ("missing state", _with("state", _DELETE), "state", "Field required"),
    ("missing questions", _with("questions", _DELETE), "questions", "Field required"),
    ("no questions", _with("questions", {}), "questions", "between 1 and 64"),
    ("questions not an object", _with("questions", ["a"]), "questions", "dictionary"),
    ("too many questions", _with("questions", {f"q{i}": {"type": "noul"} for i in range(65)}), "questions", "got 65"),
    ("empty question id", _with("questions", {"": {"type": "noul"}}), "questions", "1 to 256"),
    ("unknown type", _with("questions.billing.type", "box"), "questions.billing", "noul, choice, score"),
    ("missing type", _with("questions.billing", {"instructions": "x"}), "questions.billing", "noul, choice, score"),
    ("question not an object", _with("questions.billing", "yes?"), "questions.billing", ""),
    ("unknown question field", _with("questions.billing.weight", 2), "questions.billing.weight", "Extra inputs"),
    ("instructions a number", _with("questions.billing.instructions", 5), "questions.billing.instructions", ""),
    ("noul criteria unknown key", _with("questions.billing.criteria", {"maybe": "x"}), "questions.billing.criteria.maybe", "Extra"),
    ("noul criteria number", _with("questions.billing.criteria", {"true": 1}), "questions.billing.criteria.true", ""),
    ("choice without criteria", _with("questions.tone.criteria", _DELETE), "questions.tone.criteria", "Field required"),
    ("choice with one label", _with("questions.tone.criteria", {"calm": None}), "questions.tone.criteria", "2 to 255 labels, got 1"),
    ("choice with 256 labels", _with("questions.tone.criteria", {f"l{i}": None for i in range(256)}), "questions.tone.criteria", "got 256"),
    ("choice criteria a list", _with("questions.tone.criteria", ["calm", "angry"]), "questions.tone.criteria", "dictionary"),
    ("choice description a number", _with("questions.tone.criteria", {"calm": 1, "angry": None}), "questions.tone.criteria.calm", ""),
    ("score with one level", _with("questions.urgency.criteria", ["only"]), "questions.urgency.criteria", "2 to 10 levels, got 1"),
    ("score with 11 levels", _with("questions.urgency.criteria", [str(i) for i in range(11)]), "questions.urgency.criteria", "got 11"),
    ("score criteria an object", _with("questions.urgency.criteria", {"a": "b"}), "questions.urgency.criteria", "list"),
    ("score level null", _with("questions.urgency.criteria", ["low", None]), "questions.urgency.criteria.1", ""),
    ("images", _with("images", ["aGk="]), "images", "not supported"),
    ("videos", _with("videos", ["aGk="]), "videos", "not supported"),
    ("assets", _with("assets", {"x": {"type": "image"}}), "assets", "not supported"),
    ("unknown top-level field", _with("temperature", 0.5), "temperature", "Extra inputs"),
]


@pytest.mark.parametrize(("body", "param", "rule"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID])
def test_invalid_request_names_field(body: dict[str, Any], param: str, rule: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_request(body)
    assert caught.value.param == param
    assert rule in caught.value.message
    assert str(caught.value).startswith(param)


def test_body_must_be_an_object() -> None:
    with pytest.raises(InvalidRequest, match="JSON object"):
        parse_request(["not", "an", "object"])


def test_empty_media_lists_are_accepted() -> None:
    body = {**VALID, "images": [], "videos": [], "assets": None}
    assert parse_request(body).model == "clef-flash"


@pytest.mark.parametrize("state", ["plain text", 3, 2.5, True, None, [1, {"a": []}], {"deep": {"er": [None]}}])
def test_state_may_be_any_json_value(state: Any) -> None:
    assert parse_request({**VALID, "state": state}).state == state


def test_limits_are_configurable() -> None:
    limits = RequestLimits(max_questions=2, max_choice_labels=3, max_score_levels=3)
    with pytest.raises(InvalidRequest, match="between 1 and 2 questions"):
        parse_request(VALID, limits)
    body = _with("questions", {"tone": {"type": "choice", "criteria": {"a": None, "b": None, "c": None, "d": None}}})
    with pytest.raises(InvalidRequest) as caught:
        parse_request(body, limits)
    assert caught.value.param == "questions.tone.criteria"


def test_question_named_like_a_type_keeps_its_path() -> None:
    body = _with("questions", {"choice": {"type": "choice", "criteria": {"a": None}}})
    with pytest.raises(InvalidRequest) as caught:
        parse_request(body)
    assert caught.value.param == "questions.choice.criteria"
