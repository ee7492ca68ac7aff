"""The batched head forward: host-built indices give the logits of one record at a time, without syncs."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from clef_head.head import _build_index, _length_groups, _Padding
from clef_head.layout import QuestionLayout, RecordLayout
from clef_tools.tiny import TINY_HEAD, random_head

VOCAB = 512
# Prompt lengths far apart (several length groups, records reordered longest first, padded groups),
# rising lengths (one record per group: no padding, but reordered) and equal lengths and layouts
# (one group, no padding, in order: padding is a view).
SPREAD_LENGTHS = [1500, 40, 700, 1450, 9, 300, 260, 90, 1200, 700, 12]
RISING_LENGTHS = [60, 300, 900]
EQUAL_LENGTHS = [120, 120, 120]

Batch = tuple[list[torch.Tensor], list[torch.Tensor], list[RecordLayout], torch.Tensor]
"""Hidden states, token ids, layouts and lm_head weight: the arguments of one forward pass."""


def _layout(rng: random.Random, length: int, questions: int) -> RecordLayout:
    """``questions`` questions of 2–5 options, spans of 1–4 tokens at random places in the prompt."""

    def span() -> tuple[int, int]:
        start = rng.randrange(length - 1)
        return start, min(length, start + rng.randint(1, 4))

    return RecordLayout(
        questions=tuple(
            QuestionLayout(
                question_id=f"q{index}",
                type_id=index % 3,
                question_span=span(),
                option_spans=tuple(span() for _ in range(options)),
                option_ids=tuple(f"o{option}" for option in range(options)),
            )
            for index, options in enumerate(rng.randint(2, 5) for _ in range(questions))
        )
    )


def _inputs(lengths: list[int], layouts: list[RecordLayout], seed: int) -> Batch:
    """Random hidden states, token ids and lm_head rows for prompts of ``lengths``."""
    generator = torch.Generator().manual_seed(seed)
    hidden = [torch.randn(length, TINY_HEAD.hidden_size, generator=generator) for length in lengths]
    ids = [torch.randint(VOCAB, (length,), generator=generator) for length in lengths]
    return hidden, ids, layouts, torch.randn(VOCAB, TINY_HEAD.hidden_size, generator=generator)


def _varied_batch(lengths: list[int], seed: int) -> Batch:
    """Records of 1–4 questions each."""
    rng = random.Random(seed)
    layouts = [_layout(rng, length, 1 + index % 4) for index, length in enumerate(lengths)]
    return _inputs(lengths, layouts, seed)


def _spread_batch() -> Batch:
    return _varied_batch(SPREAD_LENGTHS, seed=0)


def _rising_batch() -> Batch:
    return _varied_batch(RISING_LENGTHS, seed=2)


def _equal_batch() -> Batch:
    layout = _layout(random.Random(1), EQUAL_LENGTHS[0], 3)
    return _inputs(EQUAL_LENGTHS, [layout] * len(EQUAL_LENGTHS), seed=1)


def _single_batch() -> Batch:
    hidden, ids, layouts, lm_head = _spread_batch()
    return hidden[:1], ids[:1], layouts[:1], lm_head


BATCHES = [
    pytest.param(_spread_batch, id="spread-lengths"),
    pytest.param(_rising_batch, id="rising-lengths"),
    pytest.param(_equal_batch, id="equal-lengths"),
]


def _paddings(make_batch: Callable[[], Batch]) -> list[_Padding]:
    """The memory, option and question paddings of a batch's index."""
    hidden, _, layouts, _ = make_batch()
    index = _build_index([len(h) for h in hidden], layouts, torch.device("cpu"))
    return [index.memory_padding, index.option_padding, index.question_padding]


def test_batches_cover_padded_reordered_and_dense_groups() -> None:
    """The batches below exercise what they are meant to."""
    spread = _paddings(_spread_batch)
    assert len(_length_groups(SPREAD_LENGTHS)) >= 3
    assert any(records > 1 for records, _ in spread[0].shapes)
    assert all(bool(padding.mask.any()) and not padding.dense for padding in spread)
    rising = _paddings(_rising_batch)
    assert rising[0].shapes == [(1, length) for length in reversed(RISING_LENGTHS)]
    assert all(not bool(padding.mask.any()) and not padding.dense for padding in rising)
    assert all(padding.dense for padding in _paddings(_equal_batch))


@pytest.mark.parametrize("make_batch", BATCHES)
def test_batched_logits_equal_one_record_at_a_time(make_batch: Callable[[], Batch]) -> None:
    head = random_head(TINY_HEAD, seed=3).eval()
    hidden, ids, layouts, lm_head = make_batch()
    with torch.inference_mode():
        batched = head(hidden, ids, layouts, lm_head)
        assert [len(logits) for logits in batched] == [layout.option_count for layout in layouts]
        for h, i, layout, together in zip(hidden, ids, layouts, batched, strict=True):
            alone = head([h], [i], [layout], lm_head)[0]
            torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device: host-device synchronisations only happen there"
)
@pytest.mark.parametrize("make_batch", [*BATCHES, pytest.param(_single_batch, id="one-record")])
@pytest.mark.parametrize("ids_device", ["cpu", "cuda"])
def test_forward_never_waits_for_the_device(make_batch: Callable[[], Batch], ids_device: str) -> None:
    """No op of a forward pass synchronises; token ids come from the host, as vLLM passes them, or the GPU."""
    head = random_head(TINY_HEAD, seed=3).cuda().eval()
    hidden, ids, layouts, lm_head = make_batch()
    hidden, ids, lm_head = [h.cuda() for h in hidden], [i.to(ids_device) for i in ids], lm_head.cuda()
    with torch.inference_mode():
        expected = head(hidden, ids, layouts, lm_head)  # warm-up: kernels, handles and pinned buffers
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            logits = head(hidden, ids, layouts, lm_head)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for got, want in zip(logits, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
