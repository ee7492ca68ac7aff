"""Request validation: each refusal names the field path and the rule."""

from __future__ import annotations

import copy
import logging
from types import ModuleType
from typing import Any

import pytest

from clef_head.encoder import render_json
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


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


INVALID = [
    ("missing model", _with("model", _DELETE), "model", "Field required"),
    ("model not a string", _with("model", 3), "model", "string"),
    ("missing state", _with("state", _DELETE), "state", "Field required"),
    ("missing questions", _with("questions", _DELETE), "questions", "Field required"),
    ("no questions", _with("questions", {}), "questions", "between 1 and 64"),
    ("questions not an object", _with("questions", ["a"]), "questions", "dictionary"),
    ("too many questions", _with("questions", {f"q{i}": {"type": "noul"} for i in range(65)}), "questions", "got 65"),
    ("unknown type", _with("questions.billing.type", "rank"), "questions.billing.type", "noul, choice, score"),
    ("box type", _with("questions.billing.type", "box"), "questions.billing.type", "no box output"),
    (
        "missing type",
        _with("questions.billing", {"instructions": "x"}),
        "questions.billing.type",
        "noul, choice, score",
    ),
    ("question not an object", _with("questions.billing", "yes?"), "questions.billing", ""),
    ("choice without criteria", _with("questions.tone.criteria", _DELETE), "questions.tone.criteria", "Field required"),
    (
        "choice with one label",
        _with("questions.tone.criteria", {"calm": None}),
        "questions.tone.criteria",
        "2 to 255 labels, got 1",
    ),
    (
        "choice with 256 labels",
        _with("questions.tone.criteria", {f"l{i}": None for i in range(256)}),
        "questions.tone.criteria",
        "got 256",
    ),
    (
        "choice criteria a list",
        _with("questions.tone.criteria", ["calm", "angry"]),
        "questions.tone.criteria",
        "dictionary",
    ),
    (
        "score with one level",
        _with("questions.urgency.criteria", ["only"]),
        "questions.urgency.criteria",
        "2 to 10 levels, got 1",
    ),
    (
        "score with 11 levels",
        _with("questions.urgency.criteria", [str(i) for i in range(11)]),
        "questions.urgency.criteria",
        "got 11",
    ),
    ("score criteria an object", _with("questions.urgency.criteria", {"a": "b"}), "questions.urgency.criteria", "list"),
    (
        "empty question id without instructions",
        _with("questions", {"": {"type": "noul"}}),
        "questions",
        "empty id needs instructions",
    ),
    ("long question id", _with("questions", {"q" * 257: {"type": "noul"}}), "questions", "at most 256"),
    (
        "instructions a set",
        _with("questions.billing.instructions", {1, 2}),
        "questions.billing.instructions",
        "JSON value",
    ),
    ("state with a number as a key", _with("state", {"a": {1: "x"}}), "state.a", "keys must be strings"),
    ("state nested too deep", _with("state", _nested(200)), "state.0.0.0", "deeper than 128 levels"),
    (
        "description nested too deep",
        _with("questions.tone.criteria", {"calm": _nested(130), "angry": None}),
        "questions.tone.criteria.calm",
        "deeper than 128",
    ),
    ("image not a string", _with("images", [{"url": "https://example.com/a.png"}]), "images.0", "valid string"),
    ("video not an object", _with("videos", ["https://example.com/a.mp4"]), "videos.0", "must be a JSON object"),
    ("video frame not a string", _with("videos", [{"frames": ["aGk=", 3]}]), "videos.0.frames.1", "valid string"),
    ("video fps zero", _with("videos", [{"frames": [], "fps": 0}]), "videos.0.fps", "greater than 0"),
    ("video fps too high", _with("videos", [{"frames": [], "fps": 1001}]), "videos.0.fps", "less than or equal"),
    ("asset without data", _with("assets", {"x": {"type": "image"}}), "assets.x", "data_base64 is missing"),
]


@pytest.mark.parametrize(("body", "param", "rule"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID])
def test_invalid_request_names_field(body: dict[str, Any], param: str, rule: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_request(body)
    assert caught.value.param == param
    assert rule in caught.value.message
    assert str(caught.value).startswith(param)


ORIGINAL_ACCEPTS = [
    ("top-level id", _with("id", "record-7")),
    ("unknown top-level field", _with("temperature", 0.5)),
    ("unknown question field", _with("questions.billing.weight", 2)),
    ("noul criteria unknown key", _with("questions.billing.criteria", {"maybe": "x"})),
    ("numeric instructions", _with("questions.billing.instructions", 5)),
    ("boolean instructions", _with("questions.billing.instructions", True)),
    ("numeric noul criterion", _with("questions.billing.criteria", {"true": 1})),
    ("numeric choice description", _with("questions.tone.criteria", {"calm": 1.5, "angry": None})),
    ("numeric score level", _with("questions.urgency.criteria", [0, 10])),
    ("null score level", _with("questions.urgency.criteria", ["low", None])),
    ("empty question id", _with("questions", {"": {"type": "noul", "instructions": "Is it?"}})),
    ("state nested 127 levels", _with("state", _nested(127))),
]


@pytest.mark.parametrize("body", [case[1] for case in ORIGINAL_ACCEPTS], ids=[case[0] for case in ORIGINAL_ACCEPTS])
def test_what_the_original_answers_is_accepted(body: dict[str, Any]) -> None:
    request = parse_request(body)
    assert request.questions.keys() == body["questions"].keys()


def test_ignored_fields_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    body = _with("questions.billing.weight", 2)
    body["temperature"] = 0.2
    with caplog.at_level(logging.DEBUG, logger="clef_head.request"):
        parse_request(body)
    assert "temperature, questions.billing.weight" in caplog.text


def test_numeric_descriptions_render_as_the_original_renders(reference: ModuleType) -> None:
    for value in (5, 2.5, True, 1e16):
        assert render_json(value) == reference.render(value)


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
