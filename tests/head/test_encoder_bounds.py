"""The encoder's bounds: a long state is tokenized from a prefix only, with the same kept tokens as a full
tokenization; refusing an overflow names the counts; encoding is safe from many threads at once; the template's
pieces are tokenized once per tokenizer."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from clef_head.encoder import (
    CHARS_PER_TOKEN_GUESS,
    PROMPT_HEAD,
    PROMPT_TAIL,
    STATE_MARGIN_TOKENS,
    StateTooLong,
    encode_request,
    render_json,
)
from clef_head.request import parse_request

MAX_LENGTH = 512


@pytest.fixture(scope="module")
def tokenizer(tiny_release: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_release)


class CountingTokenizer:
    """Wraps a tokenizer and records the length of every text it is given."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lengths: list[int] = []

        self.texts: list[str] = []

    def __call__(self, text: str, add_special_tokens: bool = False) -> Any:
        self.lengths.append(len(text))
        self.texts.append(text)
        return self.inner(text, add_special_tokens=add_special_tokens)


def _body(state: Any) -> dict[str, Any]:
    return {
        "model": "clef-flash",
        "state": state,
        "questions": {"q": {"type": "choice", "criteria": {"a": "first", "b": None}}},
    }


def _words(count: int, seed: int) -> str:
    rng = random.Random(seed)
    vocabulary = ["charge", "refund", "twice", "ticket", "naïve", "日本", "42", "{", "  ", "\n", "émoji 🙂", "x" * 30]
    return " ".join(rng.choice(vocabulary) for _ in range(count))


STATES = [
    "9" * (1 << 20),  # 1 MiB of digits
    _words(200_000, seed=1),
    {"log": [_words(50, seed) for seed in range(3000)]},
    " " * 300_000 + "end",  # few tokens for many characters: the prefix must widen
]


@pytest.mark.parametrize("state", STATES, ids=["digits", "words", "json", "spaces"])
def test_long_state_keeps_the_tokens_of_a_full_tokenization(tokenizer: Any, reference: ModuleType, state: Any) -> None:
    counting = CountingTokenizer(tokenizer)
    ours = encode_request(counting, parse_request(_body(state)), max_length=MAX_LENGTH)
    theirs = reference.encode_record(tokenizer, _body(state), max_length=MAX_LENGTH)
    assert ours.input_ids == list(theirs.input_ids)
    assert ours.state_truncated
    text = render_json(state)
    assert max(counting.lengths) < len(text), "the state was tokenized in full"
    if state is STATES[0]:  # one digit, one token: the first prefix is enough
        assert max(counting.lengths) <= (MAX_LENGTH + STATE_MARGIN_TOKENS) * CHARS_PER_TOKEN_GUESS


def test_a_state_that_fits_is_tokenized_whole(tokenizer: Any, reference: ModuleType) -> None:
    state = _words(60, seed=3)
    ours = encode_request(tokenizer, parse_request(_body(state)), max_length=MAX_LENGTH)
    assert ours.input_ids == list(reference.encode_record(tokenizer, _body(state), max_length=MAX_LENGTH).input_ids)
    assert not ours.state_truncated


def test_refused_overflow_names_the_token_counts(tokenizer: Any) -> None:
    request = parse_request(_body(_words(400, seed=4)))
    with pytest.raises(StateTooLong) as caught:
        encode_request(tokenizer, request, max_length=MAX_LENGTH, overflow="refuse")
    error = caught.value
    assert error.maximum == MAX_LENGTH and 0 < error.room < MAX_LENGTH and error.state_tokens > error.room
    assert f"{error.room} of the {MAX_LENGTH}-token prompt" in str(error)
    fits = parse_request(_body("short"))
    assert not encode_request(tokenizer, fits, max_length=MAX_LENGTH, overflow="refuse").state_truncated


def test_encoding_from_64_threads_at_once_matches_one_at_a_time(tokenizer: Any) -> None:
    requests = [parse_request(_body(_words(100 + 37 * i, seed=i))) for i in range(16)]
    alone = [encode_request(tokenizer, request, max_length=MAX_LENGTH).input_ids for request in requests]
    with ThreadPoolExecutor(max_workers=64) as pool:
        together = list(
            pool.map(lambda i: encode_request(tokenizer, requests[i % 16], max_length=MAX_LENGTH).input_ids, range(256))
        )
    assert together == [alone[i % 16] for i in range(256)]


def _deep(depth: int, leaf: Any = "leaf") -> Any:
    """A value nested ``2 * depth`` levels (an object and an array per level) around ``leaf``."""
    value: Any = leaf
    for level in range(depth):
        value = {f"level{level}": [value, level]} if level % 2 else [value, {"x": level}]
    return value


HUGE_STATES = {
    "million_short_strings": ["ab"] * 1_000_000,
    "many_keys": {f"key{index:06d}": index for index in range(200_000)},
    "deep": _deep(60, leaf=["ab"] * 100_000),
    "wide_and_deep": [_deep(40)] * 2000,
    "nested_many_keys": {"outer": {f"k{index}": [index, "é"] for index in range(50_000)}, "a": None},
}


@pytest.mark.parametrize("name", HUGE_STATES)
def test_huge_states_are_rendered_only_as_far_as_the_prompt_reads(
    tokenizer: Any, reference: ModuleType, name: str
) -> None:
    from clef_head import encoder

    state = HUGE_STATES[name]
    counting = CountingTokenizer(tokenizer)
    rendered: list[int] = []
    pieces = encoder.json_pieces

    def counted_pieces(value: Any) -> Any:
        for piece in pieces(value):
            rendered.append(len(piece))
            yield piece

    encoder.json_pieces = counted_pieces  # type: ignore[assignment]
    try:
        ours = encode_request(counting, parse_request(_body(state)), max_length=MAX_LENGTH)
    finally:
        encoder.json_pieces = pieces  # type: ignore[assignment]
    theirs = reference.encode_record(tokenizer, _body(state), max_length=MAX_LENGTH)
    assert ours.input_ids == list(theirs.input_ids)
    assert ours.state_truncated
    text = render_json(state)
    assert sum(rendered) < len(text) // 10, "the state was rendered far past what the prompt can hold"
    assert max(counting.lengths) < len(text) // 10, "the state was tokenized far past what the prompt can hold"


@pytest.mark.parametrize("max_length", [200, 256, 300, 512, 1024])
def test_truncation_matches_the_release_code_at_every_cut(
    tokenizer: Any, reference: ModuleType, max_length: int
) -> None:
    state = {"log": [{"line": _words(12, seed), "n": seed, "ok": seed % 3 == 0} for seed in range(400)]}
    ours = encode_request(tokenizer, parse_request(_body(state)), max_length=max_length)
    theirs = reference.encode_record(tokenizer, _body(state), max_length=max_length)
    assert ours.input_ids == list(theirs.input_ids)
    assert ours.state_truncated


def test_the_templates_pieces_are_tokenized_once_per_tokenizer(tokenizer: Any, reference: ModuleType) -> None:
    counting = CountingTokenizer(tokenizer)
    body = _body(_words(60, seed=5))
    first = encode_request(counting, parse_request(body), max_length=MAX_LENGTH)
    asked_first = list(counting.texts)
    counting.texts.clear()
    second = encode_request(counting, parse_request(body), max_length=MAX_LENGTH)
    assert first.input_ids == second.input_ids
    assert second.input_ids == list(reference.encode_record(tokenizer, body, max_length=MAX_LENGTH).input_ids)
    for piece in (PROMPT_HEAD, PROMPT_TAIL, "\nALLOWED OPTIONS:\n", "OPTION 1: ", "END FIELD\n"):
        assert piece in asked_first and piece not in counting.texts
    assert render_json({"option_id": "a", "description": "first"}) in counting.texts  # the request's own text
    other = CountingTokenizer(tokenizer)  # another tokenizer object: pieces of its own
    encode_request(other, parse_request(body), max_length=MAX_LENGTH)
    assert PROMPT_HEAD in other.texts
