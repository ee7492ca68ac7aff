"""Seeded synthetic System One records of a chosen prompt length, for benchmarks.

Each record has 2–6 questions of mixed types (fewer when a tokenizer makes the schema long) (noul,
choice with 2–5 labels, score with 3–5 levels) and a free-text state cut so the encoded prompt is
``tokens`` long on average (uniform in ``tokens ± spread``) with the release's own tokenizer.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

from clef_head.encoder import Tokenizer, encode_request
from clef_head.request import parse_request


class DecodingTokenizer(Tokenizer, Protocol):
    """A tokenizer that also turns token ids back into text (the state is cut to a token budget)."""

    def decode(self, token_ids: list[int], /) -> str | list[str]: ...  # one string for one list of ids


WORDS = (
    "the customer was charged twice and is angry or calm about the refund that is not spam but "
    "billing for one plan had an error with this order from the account at low medium high tone"
).split()
LABELS = ("billing", "refund", "spam", "tone", "low", "medium", "high", "urgent")


def _question(rng: random.Random, kind: str) -> dict[str, Any]:
    instruction = " ".join(rng.choices(WORDS, k=rng.randint(2, 6)))
    if kind == "noul":
        return {"type": "noul", "instructions": f"Is it true that the {instruction}?"}
    if kind == "choice":
        labels = rng.sample(LABELS, rng.randint(2, 5))
        criteria = {label: " ".join(rng.choices(WORDS, k=rng.randint(1, 3))) for label in labels}
        return {"type": "choice", "instructions": f"Which team handles the {instruction}?", "criteria": criteria}
    levels = [" ".join(rng.choices(WORDS, k=rng.randint(1, 2))) for _ in range(rng.randint(3, 5))]
    return {"type": "score", "instructions": f"How severe is the {instruction}?", "criteria": levels}


def make_record(rng: random.Random, tokenizer: DecodingTokenizer, target_tokens: int) -> dict[str, Any]:
    """One request whose encoded prompt is about ``target_tokens`` long.

    Questions are dropped (never below one) until the schema takes at most 70% of the prompt; the
    state fills the rest.
    """
    kinds = rng.choices(("noul", "choice", "score"), k=rng.randint(2, 6))
    questions = {f"q{index}_{kind}": _question(rng, kind) for index, kind in enumerate(kinds)}
    body: dict[str, Any] = {"model": "clef-flash", "state": "", "questions": questions}
    while True:  # the schema may take at most 70% of the prompt: drop questions until it fits
        fixed = len(encode_request(tokenizer, parse_request(body), max_length=1 << 30).input_ids)
        if fixed <= 0.7 * target_tokens or len(questions) == 1:
            break
        questions.popitem()
    budget = max(target_tokens - fixed, 1)
    text = " ".join(rng.choices(WORDS, k=budget * 2))
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])[:budget]
    body["state"] = tokenizer.decode(ids)
    return body


def make_records(
    tokenizer: DecodingTokenizer, count: int, seed: int = 0, tokens: int = 512, spread: int = 64
) -> list[dict[str, Any]]:
    """``count`` records from ``seed``, prompt lengths uniform in ``tokens ± spread``."""
    if count < 1 or tokens < 1 or not 0 <= spread < tokens:
        raise ValueError("count and tokens must be positive and 0 <= spread < tokens")
    rng = random.Random(seed)
    return [make_record(rng, tokenizer, rng.randint(tokens - spread, tokens + spread)) for _ in range(count)]
