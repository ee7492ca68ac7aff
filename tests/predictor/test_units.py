"""Fast unit tests of the predictor's parts (no server)."""

from __future__ import annotations

import asyncio
import gzip
from typing import Any, Sequence

import pytest

pytest.importorskip("kserve")

from predictor.batching import MicroBatcher  # noqa: E402
from predictor.engines import choose_engine  # noqa: E402
from predictor.engines.pool import EnginePool  # noqa: E402
from predictor.errors import ApiError, format_param  # noqa: E402
from predictor.http_body import decode_body  # noqa: E402
from predictor.warmup import WarmupStep, warmup_plan  # noqa: E402


def test_decode_body_gzip_zstd_and_limits() -> None:
    from backports.zstd import compress

    raw = b'{"a": 1}' * 10
    assert decode_body(gzip.compress(raw), "gzip", 1000) == raw
    assert decode_body(compress(raw), "zstd", 1000) == raw
    assert decode_body(gzip.compress(compress(raw)), "zstd, gzip", 1000) == raw
    assert decode_body(raw, "identity", 1000) == raw
    for body, encoding, status in (
        (gzip.compress(b"x" * 5000), "gzip", 413),
        (compress(b"x" * 5000), "zstd", 413),
        (raw, "zstd", 400),
        (gzip.compress(raw)[:-8], "gzip", 400),
        (raw, "deflate", 415),
    ):
        with pytest.raises(ApiError) as caught:
            decode_body(body, encoding, 1000)
        assert caught.value.status == status, encoding


def test_warmup_plan_covers_batches_and_lengths_up_to_the_maximum() -> None:
    plan = warmup_plan(16384, max_batch=32, min_tokens=100)
    assert plan[:6] == [
        WarmupStep(1, 256), WarmupStep(1, 255), WarmupStep(4, 256), WarmupStep(4, 255),
        WarmupStep(16, 256), WarmupStep(16, 255),
    ]
    assert [step.tokens for step in plan[6:]] == [1024, 1023, 4096, 4095, 16384, 16383]
    assert warmup_plan(512, max_batch=4, min_tokens=300) == [
        WarmupStep(1, 512), WarmupStep(1, 511), WarmupStep(4, 512), WarmupStep(4, 511),
    ]
    assert warmup_plan(300, max_batch=1) == [WarmupStep(1, 256), WarmupStep(1, 255), WarmupStep(1, 300), WarmupStep(1, 299)]


def test_warmup_plan_runs_every_shape_at_a_length_that_is_not_a_multiple_of_16() -> None:
    for max_length, min_tokens in ((2048, 300), (16384, 100), (512, 511)):
        plan = warmup_plan(max_length, max_batch=16, min_tokens=min_tokens)
        aligned = [step for step in plan if step.tokens % 16 == 0]
        assert aligned, plan
        for step in aligned:
            assert WarmupStep(step.batch, step.tokens - 1) in plan, (max_length, step)
        assert all(step.tokens >= min_tokens for step in plan)


def test_format_param() -> None:
    assert format_param(("inputs", 0, "shape")) == "inputs[0].shape"
    assert format_param(()) == ""


def test_choose_engine_honours_an_explicit_choice() -> None:
    assert choose_engine("transformers")[0] == "transformers"
    assert choose_engine("vllm")[0] == "vllm"
    kind, reason = choose_engine("auto")
    assert kind in ("vllm", "transformers") and reason
    with pytest.raises(ValueError):
        choose_engine("tensorrt")


def test_micro_batcher_gathers_concurrent_requests() -> None:
    seen: list[int] = []

    def run(batch: Sequence[int]) -> list[int]:
        seen.append(len(batch))
        return [item * 10 for item in batch]

    async def scenario() -> list[int]:
        batcher: MicroBatcher[int, int] = MicroBatcher(run, max_batch=4, max_wait_s=0.05)
        await batcher.start()
        try:
            return list(await asyncio.gather(*(batcher.submit(i) for i in range(10))))
        finally:
            batcher.close()

    assert asyncio.run(scenario()) == [i * 10 for i in range(10)]
    assert max(seen) == 4 and sum(seen) == 10 and len(seen) < 10


def test_micro_batcher_failure_fails_the_batch_not_the_loop() -> None:
    def run(batch: Sequence[int]) -> list[int]:
        if 0 in batch:
            raise RuntimeError("boom")
        return list(batch)

    async def scenario() -> tuple[Any, int, bool]:
        batcher: MicroBatcher[int, int] = MicroBatcher(run, max_batch=1, max_wait_s=0)
        await batcher.start()
        first = await asyncio.gather(batcher.submit(0), return_exceptions=True)
        second = await batcher.submit(5)
        alive = batcher.alive
        batcher.close()
        await asyncio.sleep(0.01)  # let the cancelled loop finish
        return first[0], second, alive and not batcher.alive

    error, value, stopped = asyncio.run(scenario())
    assert isinstance(error, RuntimeError) and value == 5 and stopped


class _FakeEngine:
    def __init__(self, load: int) -> None:
        self.in_flight = load


def test_pool_picks_the_least_loaded_engine_round_robin_among_equals() -> None:
    engines = [_FakeEngine(2), _FakeEngine(0), _FakeEngine(0)]
    pool = EnginePool(engines)  # type: ignore[arg-type]
    picks = [pool.pick() for _ in range(4)]
    assert all(pick.in_flight == 0 for pick in picks)
    assert {id(pick) for pick in picks} == {id(engines[1]), id(engines[2])}


def test_vllm_flags_and_their_checks(capsys: pytest.CaptureFixture[str]) -> None:
    """Batch size in tokens defaults to 16384; --compilation-config must be a JSON object."""
    from predictor.cli import DEFAULT_MAX_NUM_BATCHED_TOKENS, build_parser, check_args

    parser = build_parser()
    args = parser.parse_args(["--compilation-config", '{"cudagraph_mode": "NONE"}', "--max-num-seqs", "64"])
    assert args.max_num_batched_tokens == DEFAULT_MAX_NUM_BATCHED_TOKENS == 16384
    assert args.compilation_config == {"cudagraph_mode": "NONE"} and args.max_num_seqs == 64
    for argv, message in (
        (["--compilation-config", "[1, 2]"], "expected a JSON object, got list"),
        (["--compilation-config", "{nope"], "not JSON"),
    ):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        err = capsys.readouterr().err
        assert "--compilation-config" in err and message in err, err
    for argv, message in (
        (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens must be at least 1"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be at least 1"),
    ):
        with pytest.raises(SystemExit):
            check_args(parser, parser.parse_args(argv))
        assert message in capsys.readouterr().err
