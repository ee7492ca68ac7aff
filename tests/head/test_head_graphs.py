"""The head's one-record static pass (CUDA graphs over bucketed shapes) computes the head's own function."""

from __future__ import annotations

import random

import pytest
import torch

from clef_head.graphs import (
    ALL_BUCKETS,
    MAX_GRAPH_OPTIONS,
    MAX_GRAPH_QUESTIONS,
    MAX_GRAPH_TOKENS,
    TOKEN_BUCKET,
    Bucket,
    GraphedHead,
)
from clef_head.layout import RecordLayout
from clef_tools.tiny import TINY_HEAD, random_head
from tests.head.test_head_sync_free import _inputs, _layout

# Lengths at, just under and just over bucket edges; 1 to 9 questions (2-5 options each).
LENGTHS = [9, TOKEN_BUCKET - 1, TOKEN_BUCKET, TOKEN_BUCKET + 1, 300, 517, 1207, MAX_GRAPH_TOKENS]
QUESTIONS = [1, 2, 3, 4, 5, 9]


def _record(length: int, questions: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, RecordLayout, torch.Tensor]:
    layout = _layout(random.Random(seed), length, questions)
    hidden, ids, layouts, lm_head = _inputs([length], [layout], seed)
    return hidden[0], ids[0], layouts[0], lm_head


def test_buckets_round_up_and_bound_the_graphs() -> None:
    rng = random.Random(0)
    layout = _layout(rng, 600, 3)
    bucket = Bucket.of(517, layout)
    assert bucket == Bucket(tokens=640, questions=MAX_GRAPH_QUESTIONS, options=MAX_GRAPH_OPTIONS)
    assert bucket in ALL_BUCKETS
    assert Bucket.of(TOKEN_BUCKET, layout) == Bucket(tokens=TOKEN_BUCKET)
    assert Bucket.of(MAX_GRAPH_TOKENS + 1, layout) is None
    assert Bucket.of(600, _layout(rng, 600, MAX_GRAPH_QUESTIONS + 1)) is None


def test_every_bucket_a_record_can_meet_is_warmed_up() -> None:
    """Warm-up runs each of ALL_BUCKETS once; afterwards no length up to the largest bucket meets a new one."""
    head = random_head(TINY_HEAD, seed=3).eval()
    graphed = GraphedHead(head, graphs=False)
    lm_head = _record(9, 1, seed=0)[3]
    with torch.inference_mode():
        assert graphed.warm_up(TINY_HEAD.hidden_size, lm_head) == len(ALL_BUCKETS)
    assert set(graphed._captured) == set(ALL_BUCKETS)
    layout = _layout(random.Random(1), MAX_GRAPH_TOKENS, 3)
    assert {Bucket.of(length, layout) for length in range(1, MAX_GRAPH_TOKENS + 1)} == set(ALL_BUCKETS)
    record = _record(517, 3, seed=4)
    with torch.inference_mode():  # a real record after the placeholder one: the head's own logits
        got = graphed([record[0]], [record[1]], [record[2]], record[3])[0]
        expected = head([record[0]], [record[1]], [record[2]], record[3])[0]
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)
    assert GraphedHead(head, graphs=True).warm_up(TINY_HEAD.hidden_size, lm_head) == 0  # the CPU: no graphs


def test_warm_up_under_a_bfloat16_default_dtype() -> None:
    """vLLM loads weights (and so runs the warm-up) with the default dtype set to the model's: the
    buffers keep their own dtypes, and a record served afterwards still gets the head's logits."""
    head = random_head(TINY_HEAD, seed=3).to(torch.bfloat16).eval()
    graphed = GraphedHead(head, graphs=False)
    hidden, ids, layout, lm_head = _record(300, 3, seed=6)
    hidden, lm_head = hidden.to(torch.bfloat16), lm_head.to(torch.bfloat16)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.inference_mode():
            graphed.warm_up(TINY_HEAD.hidden_size, lm_head)
    finally:
        torch.set_default_dtype(previous)
    assert all(inputs.question_members.dtype == torch.float32 for inputs, *_ in graphed._captured.values())
    with torch.inference_mode():
        got = graphed([hidden], [ids], [layout], lm_head)[0]
        expected = head([hidden], [ids], [layout], lm_head)[0]
    torch.testing.assert_close(got.float(), expected.float(), rtol=0, atol=5e-2)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("questions", QUESTIONS)
def test_static_pass_equals_the_head_on_the_cpu(length: int, questions: int) -> None:
    """Graphs off (eager static pass, float32): the logits of the head's own forward."""
    head = random_head(TINY_HEAD, seed=3).eval()
    graphed = GraphedHead(head, graphs=False)
    hidden, ids, layout, lm_head = _record(length, questions, seed=length * 31 + questions)
    with torch.inference_mode():
        expected = head([hidden], [ids], [layout], lm_head)[0]
        got = graphed([hidden], [ids], [layout], lm_head)[0]
    assert got.shape == (layout.option_count,)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)


def test_padding_left_by_a_longer_record_does_not_change_the_next() -> None:
    """Buffers are reused per bucket: a shorter record after a longer one in the same bucket is unaffected."""
    head = random_head(TINY_HEAD, seed=5).eval()
    graphed = GraphedHead(head, graphs=False)
    long = _record(250, 4, seed=1)
    short = _record(140, 3, seed=2)
    assert Bucket.of(250, long[2]).tokens == Bucket.of(140, short[2]).tokens
    with torch.inference_mode():
        graphed([long[0]], [long[1]], [long[2]], long[3])
        got = graphed([short[0]], [short[1]], [short[2]], short[3])[0]
        expected = head([short[0]], [short[1]], [short[2]], short[3])[0]
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)


def test_batches_and_oversized_records_take_the_dynamic_pass() -> None:
    head = random_head(TINY_HEAD, seed=3).eval()
    graphed = GraphedHead(head, graphs=True)  # on the CPU: never captured
    first, second = _record(300, 2, seed=1), _record(MAX_GRAPH_TOKENS + 5, 2, seed=2)
    with torch.inference_mode():
        batch = graphed([first[0], first[0]], [first[1], first[1]], [first[2], first[2]], first[3])
        alone = graphed([second[0]], [second[1]], [second[2]], second[3])
        expected = head([first[0], first[0]], [first[1], first[1]], [first[2], first[2]], first[3])
        assert all(torch.equal(got, want) for got, want in zip(batch, expected, strict=True))
        assert torch.equal(alone[0], head([second[0]], [second[1]], [second[2]], second[3])[0])
    assert graphed.captures == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replay_equals_the_eager_static_pass_on_cuda(dtype: torch.dtype) -> None:
    """Replays give exactly the eager static pass's logits (same kernels), and the head's within rounding.

    One lm_head table serves every record, as in the engine; a table at a new address is captured again."""
    head = random_head(TINY_HEAD, seed=3).cuda().to(dtype).eval()
    graphed, eager = GraphedHead(head, graphs=True), GraphedHead(head, graphs=False)
    records = [
        _record(length, questions, seed=index)
        for index, (length, questions) in enumerate([(517, 3), (560, 2), (517, 3), (120, 1), (1207, 5), (530, 3)])
    ]
    table = records[0][3].cuda().to(dtype)
    tolerance = 2e-5 if dtype == torch.float32 else 5e-2
    with torch.inference_mode():
        for hidden, ids, layout, _ in records:
            args = ([hidden.cuda().to(dtype)], [ids], [layout], table)
            replayed = graphed(*args)[0]
            assert torch.equal(replayed, eager(*args)[0])
            torch.testing.assert_close(replayed.float(), head(*args)[0].float(), rtol=0, atol=tolerance)
        buckets = graphed.captures
        assert 0 < buckets < len(records)
        assert graphed.warm_up(table.shape[1], table) == len(ALL_BUCKETS)
        buckets = graphed.captures
        assert buckets == len(ALL_BUCKETS)  # the buckets met above were not captured again
        for hidden, ids, layout, _ in records:  # served after warm-up: replays only, still exact
            args = ([hidden.cuda().to(dtype)], [ids], [layout], table)
            assert torch.equal(graphed(*args)[0], eager(*args)[0])
        assert graphed.captures == buckets
        hidden, ids, layout, _ = records[0]
        other = table.clone()
        args = ([hidden.cuda().to(dtype)], [ids], [layout], other)
        assert torch.equal(graphed(*args)[0], eager(*args)[0]) and graphed.captures == buckets + 1


def test_buckets_share_one_token_buffer_and_stay_exact_in_any_order() -> None:
    """Per-token buffers are views of one buffer for all buckets: records of several buckets in a row,
    long after short and short after long, each still get the head's own logits."""
    head = random_head(TINY_HEAD, seed=7).eval()
    graphed = GraphedHead(head, graphs=False)
    records = [
        _record(length, questions, seed=length)
        for length, questions in [(900, 3), (100, 1), (1500, 5), (300, 2), (899, 3), (40, 1)]
    ]
    with torch.inference_mode():
        for hidden, ids, layout, lm_head in records:
            got = graphed([hidden], [ids], [layout], lm_head)[0]
            torch.testing.assert_close(got, head([hidden], [ids], [layout], lm_head)[0], rtol=0, atol=2e-5)
    storages = {inputs.hidden.untyped_storage().data_ptr() for inputs, *_ in graphed._captured.values()}
    assert len(graphed._captured) >= 4 and len(storages) == 1
