"""Fast unit tests of the predictor's parts (no server)."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from predictor.config import engine_config
from predictor.core.errors import format_param
from predictor.engines import choose_engine
from predictor.engines.batching import MicroBatcher
from predictor.engines.pool import EnginePool
from predictor.http.errors import ApiError
from predictor.http.http_body import decode_body
from predictor.serving.warmup import WarmupStep, warmup_plan


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
        WarmupStep(1, 256),
        WarmupStep(1, 255),
        WarmupStep(4, 256),
        WarmupStep(4, 255),
        WarmupStep(16, 256),
        WarmupStep(16, 255),
    ]
    assert [step.tokens for step in plan[6:]] == [1024, 1023, 4096, 4095, 16384, 16383]
    assert warmup_plan(512, max_batch=4, min_tokens=300) == [
        WarmupStep(1, 512),
        WarmupStep(1, 511),
        WarmupStep(4, 512),
        WarmupStep(4, 511),
    ]
    assert warmup_plan(300, max_batch=1) == [
        WarmupStep(1, 256),
        WarmupStep(1, 255),
        WarmupStep(1, 300),
        WarmupStep(1, 299),
    ]


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
    with pytest.raises(ValueError):
        choose_engine("tensorrt")


@pytest.mark.parametrize(
    "vllm_available, gpu_count, expected",
    [
        (True, 1, "vllm"),
        (True, 8, "vllm"),
        (True, 0, "transformers"),
        (False, 2, "transformers"),
        (False, 0, "transformers"),
    ],
)
def test_choose_engine_auto_picks_vllm_only_with_a_gpu(vllm_available: bool, gpu_count: int, expected: str) -> None:
    kind, reason = choose_engine("auto", vllm_available=vllm_available, gpu_count=gpu_count)
    assert kind == expected, reason
    assert ("GPU" in reason) if vllm_available else ("not installed" in reason)


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


def test_vllm_owns_its_engine_arguments() -> None:
    """vLLM's own flags reach the engine's arguments; the plugin's settings are laid over them."""
    import clef_plugin
    from predictor.cli import build_parser
    from predictor.engines.engine_args import DEFAULT_MAX_NUM_BATCHED_TOKENS, engine_reads_videos, vllm_engine_args

    parser = build_parser()
    args = parser.parse_args(
        ["--engine", "vllm", "--tensor-parallel-size", "2", "--max-num-seqs", "64", "--max-model-len", "2048"]
        + ["--http_port", "9000"]
    )
    assert args.http_port == 9000
    engine_args = vllm_engine_args(engine_config(args, Path("/models/clef")), on_gpu=True)
    assert engine_args.tensor_parallel_size == 2 and engine_args.max_num_seqs == 64
    assert engine_args.max_model_len == 2048
    assert engine_args.max_num_batched_tokens == DEFAULT_MAX_NUM_BATCHED_TOKENS == 16384
    assert engine_args.model == "/models/clef" and engine_args.runner == "pooling"
    assert engine_args.hf_overrides == {"architectures": [clef_plugin.ARCHITECTURE]}
    assert engine_args.pooler_config.task == clef_plugin.POOLING_TASK
    assert engine_args.enable_prefix_caching is False and engine_args.enable_chunked_prefill is True
    assert engine_args.language_model_only is True and engine_args.dtype == "bfloat16"
    assert engine_args.enforce_eager is False
    assert engine_args.skip_tokenizer_init is True  # the predictor sends token ids only
    on_cpu = vllm_engine_args(
        engine_config(parser.parse_args(["--engine", "vllm", "--dp", "3"]), Path("/m")), on_gpu=False
    )
    assert on_cpu.data_parallel_size == 3 and on_cpu.enforce_eager is True
    vision = vllm_engine_args(engine_config(parser.parse_args(["--engine", "vllm", "--vision"]), Path("/m")), True)
    assert vision.language_model_only is False and vision.enable_mm_embeds is True
    assert not vision.mm_device_do_normalize  # the predictor's pixels are normalized already
    assert vision.skip_tokenizer_init is False  # vLLM's multimodal processor expands image pads with it
    assert vision.limit_mm_per_prompt == {"image": 16, "video": 4}
    assert engine_reads_videos("vllm") and engine_reads_videos("transformers")  # this vLLM takes processed videos


def test_a_gpu_predictor_runs_flas_delta_net_prefill_unless_a_flag_names_another() -> None:
    """On a GPU the Gated DeltaNet prefill is the serving default; either flag that names a backend keeps its own."""
    from predictor.cli import build_parser
    from predictor.engines.engine_args import SERVING_GDN_PREFILL_BACKEND, vllm_engine_args

    def engine_args(flags: list[str], on_gpu: bool = True) -> Any:
        return vllm_engine_args(
            engine_config(build_parser().parse_args(["--engine", "vllm", *flags]), Path("/m")), on_gpu
        )

    assert SERVING_GDN_PREFILL_BACKEND == "triton"
    assert engine_args([]).gdn_prefill_backend == "triton"
    assert engine_args([], on_gpu=False).gdn_prefill_backend is None  # vLLM's CPU path has its own kernels
    assert engine_args(["--gdn-prefill-backend", "flashinfer"]).gdn_prefill_backend == "flashinfer"
    named = engine_args(["--additional-config", '{"gdn_prefill_backend": "flashinfer"}'])
    assert named.gdn_prefill_backend is None and named.additional_config == {"gdn_prefill_backend": "flashinfer"}
    other = engine_args(["--additional-config", '{"clef_prompt_graphs": false}'])
    assert other.gdn_prefill_backend == "triton" and other.additional_config == {"clef_prompt_graphs": False}


def test_videos_follow_the_engine_auto_ends_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--engine auto`` reads videos as the engine it ends on: on a vLLM that takes no processed videos, none."""
    import clef_plugin.compat.processed_images
    import predictor.engines
    from predictor.engines.engine_args import engine_reads_videos

    monkeypatch.setattr(clef_plugin.compat.processed_images, "processed_videos_supported", lambda: False)
    monkeypatch.setattr(predictor.engines, "vllm_can_serve", lambda requested: requested in ("auto", "vllm"))
    assert not engine_reads_videos("auto") and not engine_reads_videos("vllm")
    monkeypatch.setattr(predictor.engines, "vllm_can_serve", lambda requested: requested == "vllm")
    assert engine_reads_videos("auto") and engine_reads_videos("transformers")


@pytest.mark.vllm
def test_the_vllm_engine_reads_the_tokenizer_once(toy_release: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``--vision`` the engine shares the tokenizer vLLM loaded; a text engine (vLLM loads none) loads its own
    before the engine is built; a tokenizer without the media tokens shuts the built engine down. vLLM's AsyncLLM is
    replaced by a stand-in here: the servers' tests run the real one."""
    from transformers import AutoTokenizer
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from predictor.engines.vllm import VllmEngine

    events: list[str] = []

    class Built:
        def __init__(self, tokenizer: Any) -> None:
            self.tokenizer = tokenizer

        def shutdown(self) -> None:
            events.append("shutdown")

    vllms = AutoTokenizer.from_pretrained(toy_release)
    built = Built(vllms)

    def from_engine_args(cls: type, engine_args: AsyncEngineArgs) -> Built:
        events.append("built")
        return built

    monkeypatch.setattr(AsyncLLM, "from_engine_args", classmethod(from_engine_args))
    load = AutoTokenizer.from_pretrained.__func__  # type: ignore[attr-defined]

    def counted(cls: type, *args: Any, **kwargs: Any) -> Any:
        events.append("read")
        return load(cls, *args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", classmethod(counted))
    assert VllmEngine(AsyncEngineArgs(model=str(toy_release), max_model_len=512)).tokenizer is vllms
    assert events == ["built"]
    built.tokenizer = None
    text = VllmEngine(AsyncEngineArgs(model=str(toy_release), max_model_len=512, skip_tokenizer_init=True))
    assert events == ["built", "read", "built"] and text.tokenizer.convert_tokens_to_ids(
        "<|image_pad|>"
    ) == vllms.convert_tokens_to_ids("<|image_pad|>")
    built.tokenizer = type("NoMedia", (), {"convert_tokens_to_ids": staticmethod(lambda token: None)})()
    with pytest.raises(ValueError, match=re.escape("no single <|image_pad|> token")):
        VllmEngine(AsyncEngineArgs(model=str(toy_release), max_model_len=512))
    assert events[-2:] == ["built", "shutdown"]


def test_an_engine_configuration_built_without_the_command_line_is_the_same() -> None:
    """Tools and tests build EngineConfig directly: vLLM's arguments come out as the command line's would, but for
    the few flags whose parser default is not vLLM's dataclass default (the command line passes those on)."""
    from predictor.cli import build_parser
    from predictor.engines import EngineConfig
    from predictor.engines.engine_args import changed_engine_args, vllm_engine_args

    parser_defaults = {"enable_lora": None, "mm_device_do_normalize": None, "reasoning_parser_plugin": ""}
    argv = ["--engine", "vllm", "--tensor-parallel-size", "2", "--dp", "2", "--max-model-len", "2048"]
    from_cli = engine_config(build_parser().parse_args(["--engine", "vllm", *argv]), Path("/models/clef"))
    given = {"tensor_parallel_size": 2, "max_num_batched_tokens": 16384}
    assert dict(from_cli.vllm_flags) == {**given, **parser_defaults}
    direct = EngineConfig(
        Path("/models/clef"),
        kind="vllm",
        data_parallel_size=2,
        max_model_len=2048,
        vllm_flags={"tensor_parallel_size": 2},
    )
    assert vllm_engine_args(direct, on_gpu=True) == vllm_engine_args(
        dataclasses.replace(direct, vllm_flags={**direct.vllm_flags, "max_num_batched_tokens": 16384}), on_gpu=True
    )  # vLLM's step size is the predictor's default either way
    cli_args = changed_engine_args(vllm_engine_args(from_cli, on_gpu=True))
    direct_args = changed_engine_args(vllm_engine_args(direct, on_gpu=True))
    assert {name: cli_args.pop(name) for name in parser_defaults} == parser_defaults
    assert cli_args == direct_args
    with pytest.raises(TypeError):
        direct.vllm_flags["enforce_eager"] = True  # type: ignore[index]
    with pytest.raises(ValueError, match="fields of EngineConfig itself"):
        EngineConfig(Path("/m"), vllm_flags={"max_model_len": 512})


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--enable-prefix-caching"], "--enable-prefix-caching"),
        (["--pipeline-parallel-size", "2"], "--pipeline-parallel-size"),
        (["--no-enable-chunked-prefill"], "--enable-chunked-prefill"),
        (["--runner", "generate"], "--runner"),
        (["--model", "/elsewhere"], "--model"),
    ],
)
def test_engine_arguments_that_contradict_the_plugin_are_refused(argv: list[str], flag: str) -> None:
    from clef_plugin.api import PluginSettingConflict
    from predictor.cli import build_parser
    from predictor.engines.engine_args import vllm_engine_args

    with pytest.raises(PluginSettingConflict) as caught:
        vllm_engine_args(
            engine_config(build_parser().parse_args(["--engine", "vllm", *argv]), Path("/models/clef")), on_gpu=True
        )
    message = str(caught.value)
    assert message.startswith(flag) and "contradicts the clef plugin" in message and "\n" not in message


def test_a_quantized_lm_head_is_refused(tmp_path: Path) -> None:
    from clef_plugin.api import PluginSettingConflict
    from predictor.cli import build_parser
    from predictor.engines.engine_args import vllm_engine_args

    quantized = {"quant_method": "compressed-tensors", "ignore": ["re:.*visual.*"]}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": quantized}))
    with pytest.raises(PluginSettingConflict, match="quantizes lm_head"):
        vllm_engine_args(engine_config(build_parser().parse_args(["--engine", "vllm"]), tmp_path), on_gpu=True)
    quantized["ignore"].append("re:.*lm_head")
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": quantized}))
    assert vllm_engine_args(
        engine_config(build_parser().parse_args(["--engine", "vllm"]), tmp_path), on_gpu=True
    ).model == str(tmp_path)


def test_engine_arguments_are_built_offline_without_the_hub(
    tiny_release: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With HF_HUB_OFFLINE, vLLM resolves model and tokenizer through the hub's cache when its arguments are
    built: they must already be the release folder (vLLM's default model id is cached nowhere offline)."""
    import huggingface_hub

    from predictor.cli import build_parser
    from predictor.engines.engine_args import vllm_engine_args

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tiny_release.parent / "empty-hub-cache"))
    engine_args = vllm_engine_args(
        engine_config(build_parser().parse_args(["--engine", "vllm"]), tiny_release), on_gpu=False
    )
    assert engine_args.model == engine_args.tokenizer == str(tiny_release)


def test_predictor_checks_its_own_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from predictor.cli import build_parser, check_args

    parser = build_parser()
    for argv, message in (
        (["--dp", "0"], "--dp (--data-parallel-size) must be at least 1"),
        (["--max-model-len", "32"], "--max-model-len must be at least 64"),
        (["--warmup-rounds", "0"], "--warmup-rounds must be at least 1"),
        (["--release-date", "15/09/2026"], "--release-date '15/09/2026' is not a date written YYYY-MM-DD"),
        (["--inline-encode-max-bytes", "-1"], "--inline-encode-max-bytes must be 0 or more"),
    ):
        with pytest.raises(SystemExit):
            check_args(parser, parser.parse_args(argv))
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_a_max_model_len_no_request_fits_is_a_usage_error_before_any_engine_is_built(
    engine: str, tiny_release: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release's tokenizer.json (the tokenizers library) measures the shortest warm-up prompt (112 tokens)."""
    from predictor import cli

    def no_engine(*_: object) -> None:
        raise AssertionError("an engine was built for a --max-model-len no request fits")

    monkeypatch.setattr(cli, "build_engine", no_engine)
    with pytest.raises(SystemExit) as caught:
        cli.main(["--engine", engine, "--model-dir", str(tiny_release), "--max-model-len", "100"])
    assert caught.value.code == 2
    assert "--max-model-len 100 leaves no room for a System One request" in capsys.readouterr().err


def test_memory_shortfalls_name_the_flag_to_change(tiny_release: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from predictor.engines.memory import (
        InsufficientMemory,
        check_transformers_memory,
        check_vllm_cpu_memory,
        release_parameters,
    )

    parameters = release_parameters(tiny_release)
    assert parameters > 0
    check_transformers_memory(tiny_release, 4, 2, available=parameters * 4 * 2 * 2)
    with pytest.raises(InsufficientMemory, match="lower --dp or pass --dtype bfloat16"):
        check_transformers_memory(tiny_release, 4, 2, available=parameters * 4)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    with pytest.raises(InsufficientMemory, match="--kv-cache-memory-bytes .* or lower --gpu-memory-utilization"):
        check_vllm_cpu_memory(0.9, None, available=1 << 20)
    check_vllm_cpu_memory(0.9, 1 << 30, available=1 << 20)  # an explicit cache size is vLLM's to check


def test_a_stopped_micro_batcher_fails_running_and_queued_requests() -> None:
    import threading

    release = threading.Event()

    def run(batch: Sequence[int]) -> list[int]:
        release.wait(10)
        return list(batch)

    async def scenario() -> list[Any]:
        batcher: MicroBatcher[int, int] = MicroBatcher(run, max_batch=1, max_wait_s=0)
        await batcher.start()
        calls = [asyncio.create_task(batcher.submit(i)) for i in range(3)]
        await asyncio.sleep(0.2)  # the first runs, the others wait
        batcher.close()
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
        release.set()
        return results

    results = asyncio.run(scenario())
    assert all(isinstance(result, RuntimeError) for result in results), results


def test_without_vllm_the_parser_has_the_transformers_engine_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    import predictor.engines.engine_args
    from predictor.cli import build_parser

    monkeypatch.setattr(predictor.engines.engine_args, "vllm_installed", lambda: False)
    parser = build_parser()
    args = parser.parse_args(["--dp", "2", "--max-model-len", "512", "--dtype", "float32", "--http_port", "9000"])
    assert (args.data_parallel_size, args.max_model_len, args.dtype, args.http_port) == (2, 512, "float32", 9000)
    assert parser.parse_args(["--data-parallel-size", "3"]).data_parallel_size == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["--tensor-parallel-size", "2"])


def test_gpus_are_counted_without_initialising_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.cuda.is_available()`` initialises the CUDA driver, after which vLLM's forked engine core could not use
    CUDA; the predictor counts GPUs through ``torch.cuda.device_count()`` (NVML) only."""
    import torch

    from predictor import cli
    from predictor.engines import visible_gpus

    def initialises() -> bool:
        raise AssertionError("torch.cuda.is_available() initialises the CUDA driver")

    monkeypatch.setattr(torch.cuda, "is_available", initialises)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert visible_gpus() == 2 and cli.visible_gpus is visible_gpus  # the count the command line passes on
    assert choose_engine("auto", vllm_available=True) == ("vllm", "vLLM is installed and 2 GPU(s) are visible")
    assert cli.vllm_may_serve(["--engine", "auto"])


def test_vllm_flags_are_read_only_when_the_vllm_engine_can_serve(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from predictor.cli import build_parser, vllm_may_serve

    assert not vllm_may_serve(["--engine", "transformers", "--http_port", "9000"])
    assert not vllm_may_serve(["--engine=transformers"])
    assert vllm_may_serve(["--engine", "vllm"]) and vllm_may_serve(["--engine", "transformers", "--help=predictor"])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert not vllm_may_serve([]) and not vllm_may_serve(["--engine", "auto"])  # auto is transformers on a CPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert vllm_may_serve([]) and vllm_may_serve(["--engine", "auto"])  # and vLLM with a GPU (vLLM is installed)
    parser = build_parser(["--engine", "transformers"])
    args = parser.parse_args(["--engine", "transformers", "--dp", "2", "--max-model-len", "512"])
    assert (args.engine, args.data_parallel_size, args.max_model_len) == ("transformers", 2, 512)
    with pytest.raises(SystemExit):
        parser.parse_args(["--engine", "transformers", "--tensor-parallel-size", "2"])
    assert "--tensor-parallel-size" in capsys.readouterr().err
