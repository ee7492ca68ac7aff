"""Seeded generator of valid System One requests for parity and load tests.

Covers every question type, unicode text, nested JSON states, instructions as text/objects/arrays,
custom noul criteria, null choice descriptions, and (with ``extremes``) 64 questions, 255 choice
labels and 10 score levels.
"""

from __future__ import annotations

import random
from typing import Any

WORDS = (
    "refund charge twice account billing urgent calm angry plan invoice help please late order "
    'ünïcödé 日本語 текст émoji 🚀 naïve café ✓ tab\there quote"s back\\slash'
).split(" ")


def _text(rng: random.Random, low: int = 1, high: int = 8) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.choice(["str", "int", "float", "bool", "null", "list", "dict"] if depth < 3 else ["str", "int"])
    if kind == "str":
        return _text(rng)
    if kind == "int":
        return rng.randint(-1000, 1000)
    if kind == "float":
        return round(rng.uniform(-10, 10), 3)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {_text(rng, 1, 2): _json_value(rng, depth + 1) for _ in range(rng.randint(1, 3))}


def _description(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.7:
        return _text(rng)
    if roll < 0.85:
        return {"meaning": _text(rng), "examples": [_text(rng, 1, 3)]}
    return [_text(rng, 1, 3), _text(rng, 1, 3)]


def _instructions(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.1:
        return None
    if roll < 0.15:
        return ""
    if roll < 0.75:
        return _text(rng, 3, 12)
    if roll < 0.9:
        return {"task": _text(rng), "notes": [_text(rng, 1, 3)]}
    return [_text(rng, 2, 4), {"hint": _text(rng)}]


def make_question(rng: random.Random, kind: str, options: int | None = None) -> dict[str, Any]:
    """One valid question of ``kind`` (noul, choice, score); ``options`` fixes the label/level count."""
    question: dict[str, Any] = {"type": kind}
    instructions = _instructions(rng)
    if instructions is not None or rng.random() < 0.5:
        question["instructions"] = instructions
    if kind == "noul":
        roll = rng.random()
        if roll < 0.3:
            question["criteria"] = {"true": _description(rng), "false": _description(rng)}
        elif roll < 0.4:
            question["criteria"] = {rng.choice(["true", "false"]): _description(rng)}
        elif roll < 0.45:
            question["criteria"] = {"true": None}
    elif kind == "choice":
        count = options or rng.randint(2, 6)
        labels: list[str] = []
        while len(labels) < count:
            label = f"{rng.choice(WORDS)}_{len(labels)}" if rng.random() < 0.8 else f"L{len(labels):03d}"
            labels.append(label)
        rng.shuffle(labels)
        question["criteria"] = {label: (None if rng.random() < 0.3 else _description(rng)) for label in labels}
    else:
        count = options or rng.randint(2, 5)
        question["criteria"] = [_text(rng, 1, 4) for _ in range(count)]
    return question


def make_request(rng: random.Random, questions: int | None = None, state_words: int | None = None) -> dict[str, Any]:
    """One valid request with ``questions`` questions (random 1–8 when None)."""
    count = questions or rng.randint(1, 8)
    state: Any
    if state_words is not None:
        state = " ".join(rng.choice(WORDS) for _ in range(state_words))
    elif rng.random() < 0.4:
        state = _text(rng, 5, 40)
    else:
        state = {"ticket": _json_value(rng), "customer": {"name": _text(rng, 1, 2), "history": [_json_value(rng)]}}
    ids: set[str] = set()
    body: dict[str, Any] = {"model": "clef-flash", "state": state, "questions": {}}
    while len(ids) < count:
        question_id = rng.choice(["urgency", "tone", "billing", "spam", "topic", "фраза", "質問"]) + f"_{len(ids)}"
        ids.add(question_id)
        body["questions"][question_id] = make_question(rng, rng.choice(["noul", "choice", "score"]))
    return body


def make_extreme_requests(rng: random.Random) -> list[dict[str, Any]]:
    """Requests at the limits: 64 questions, 255 choice labels, 10 score levels (one null), long state."""
    many: dict[str, Any] = {"model": "clef-flash", "state": _text(rng, 3, 6), "questions": {}}
    for index in range(64):
        many["questions"][f"q{index}"] = make_question(rng, ("noul", "choice", "score")[index % 3])
    wide_choice = {
        "model": "clef-flash",
        "state": {"k": _text(rng)},
        "questions": {"wide": make_question(rng, "choice", options=255)},
    }
    deep_score: dict[str, Any] = {
        "model": "clef-flash",
        "state": [_json_value(rng) for _ in range(5)],
        "questions": {"levels": make_question(rng, "score", options=10), "yes": make_question(rng, "noul")},
    }
    deep_score["questions"]["levels"]["criteria"][3] = None  # a level without a description
    long_state = make_request(rng, questions=2, state_words=3000)
    return [many, wide_choice, deep_score, long_state]


def make_requests(seed: int, count: int) -> list[dict[str, Any]]:
    """``count`` ordinary requests from ``seed``."""
    rng = random.Random(seed)
    return [make_request(rng) for _ in range(count)]
