"""Property-based tests of the encoder against the original release code and its own invariants."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from clef_head.encoder import PROMPT_HEAD, SchemaTooLong, encode_request, json_pieces, render_json
from clef_head.request import parse_request

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=8,
)
descriptions = text | st.dictionaries(text, json_values, max_size=2) | st.lists(json_values, max_size=2)
instructions = st.none() | st.just("") | descriptions
labels = st.text(min_size=1, max_size=12)

noul = st.fixed_dictionaries(
    {"type": st.just("noul")},
    optional={
        "instructions": instructions,
        "criteria": st.fixed_dictionaries(
            {}, optional={"true": st.none() | descriptions, "false": st.none() | descriptions}
        ),
    },
)
choice = st.fixed_dictionaries(
    {"type": st.just("choice"), "criteria": st.dictionaries(labels, st.none() | descriptions, min_size=2, max_size=8)},
    optional={"instructions": instructions},
)
score = st.fixed_dictionaries(
    {"type": st.just("score"), "criteria": st.lists(st.none() | descriptions, min_size=2, max_size=10)},
    optional={"instructions": instructions},
)
requests = st.fixed_dictionaries(
    {
        "model": text,
        "state": json_values,
        "questions": st.dictionaries(st.text(min_size=1, max_size=16), noul | choice | score, min_size=1, max_size=6),
    }
)
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@pytest.fixture(scope="module")
def tokenizer(tiny_release: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_release)


@SETTINGS
@given(body=requests)
def test_matches_release_code(body: dict[str, Any], tokenizer, reference: ModuleType) -> None:
    ours = encode_request(tokenizer, parse_request(body))
    theirs = reference.encode_record(tokenizer, body)
    assert ours.input_ids == list(theirs.input_ids)
    assert [(q.question_span, q.option_spans, q.option_ids) for q in ours.layout.questions] == [
        (q.question_span, q.option_spans, q.option_ids) for q in theirs.questions
    ]


@SETTINGS
@given(body=requests)
@example(
    body={"model": "", "state": None, "questions": {"0": {"type": "choice", "criteria": {"0": None, "\uf900": None}}}}
)
def test_option_spans_hold_the_option_text(body: dict[str, Any], tokenizer) -> None:
    encoded = encode_request(tokenizer, parse_request(body))
    assert encoded.layout.to_wire() == json.loads(json.dumps(encoded.layout.to_wire()))
    for question in encoded.layout.questions:
        assert 0 <= question.question_span[0] < question.question_span[1] <= len(encoded.input_ids)
        for (start, end), option_id in zip(question.option_spans, question.option_ids, strict=True):
            decoded = json.loads(tokenizer.decode(encoded.input_ids[start:end]))
            # Qwen's tokenizers normalize text to NFC, so the span holds the NFC form of the id.
            assert decoded["option_id"] == unicodedata.normalize("NFC", option_id)


@SETTINGS
@given(body=requests, max_length=st.integers(min_value=50, max_value=3000))
def test_max_length_cuts_only_the_state(body: dict[str, Any], max_length: int, tokenizer) -> None:
    request = parse_request(body)
    full = encode_request(tokenizer, request, max_length=10**6)
    try:
        cut = encode_request(tokenizer, request, max_length=max_length)
    except SchemaTooLong as error:
        state_tokens = len(tokenizer(render_json(request.state), add_special_tokens=False)["input_ids"])
        assert error.required == len(full.input_ids) - state_tokens > max_length
        return
    assert len(cut.input_ids) == min(max_length, len(full.input_ids))
    removed = len(full.input_ids) - len(cut.input_ids)
    head = len(tokenizer(PROMPT_HEAD, add_special_tokens=False)["input_ids"])
    state = len(tokenizer(render_json(request.state), add_special_tokens=False)["input_ids"])
    kept = state - removed
    assert cut.input_ids[: head + kept] == full.input_ids[: head + kept]  # the state loses its end only
    assert cut.input_ids[head + kept :] == full.input_ids[head + state :]  # the schema is never cut
    for short, long in zip(cut.layout.questions, full.layout.questions, strict=True):
        assert short.option_spans == tuple((s - removed, e - removed) for s, e in long.option_spans)


@SETTINGS
@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | text,
        lambda children: st.lists(children, max_size=5) | st.dictionaries(text, children, max_size=5),
        max_leaves=40,
    )
)
def test_state_pieces_join_to_the_rendered_text(value: Any) -> None:
    assert "".join(json_pieces(value)) == render_json(value)
