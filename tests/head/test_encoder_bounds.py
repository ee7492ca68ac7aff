"""The encoder's bounds: a long state is tokenized from a prefix only, with the same kept tokens as a full
tokenization; refusing an overflow names the counts; encoding is safe from many threads at once."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from clef_head.encoder import CHARS_PER_TOKEN_GUESS, STATE_MARGIN_TOKENS, StateTooLong, encode_request, render_json
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

    def __call__(self, text: str, add_special_tokens: bool = False) -> Any:
        self.lengths.append(len(text))
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
        together = list(pool.map(lambda i: encode_request(tokenizer, requests[i % 16], max_length=MAX_LENGTH).input_ids, range(256)))
    assert together == [alone[i % 16] for i in range(256)]
