"""The default KV cache of vLLM's CPU engine (predictor.engines.cpu_kv_cache): layout, size, refusal, precedence."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from clef_tools.fullsize import FULL_TEXT
from predictor.engines import cpu_kv_cache
from predictor.engines.cpu_kv_cache import (
    KV_SHARE_OF_FREE,
    KvLayout,
    default_kv_cache_bytes,
    kv_layout,
    recurrent_state_bytes,
)
from predictor.engines.memory import GIB, InsufficientMemory

MIB = 1 << 20


def _full_size_release(tiny_release: Path, tmp_path: Path) -> Path:
    """The tiny release's config.json with Qwen3.5-9B's text shape (32 layers, 3 DeltaNet + 1 attention)."""
    config = json.loads((tiny_release / "config.json").read_text())
    config["text_config"] |= FULL_TEXT | {"layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 8}
    release = tmp_path / "full"
    release.mkdir()
    (release / "config.json").write_text(json.dumps(config))
    return release


@pytest.fixture(params=[True, False], ids=["avx512-bf16", "no-avx512-bf16"])
def avx512_bf16(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both kinds of CPU, whichever this one is (the CLI test checks this machine's against vLLM's own log)."""
    monkeypatch.setattr(cpu_kv_cache, "cpu_has_avx512_bf16", lambda: request.param)
    return bool(request.param)


def test_the_cpu_is_asked_as_vllm_asks() -> None:
    """vLLM's CPU platform decides the state's dtype with torch's private AVX-512 BF16 probe; so does the
    predictor. An upgrade that renames either fails here, before a cache is sized wrongly."""
    import inspect

    import torch
    from vllm.platforms import cpu

    assert "torch.cpu._is_avx512_bf16_supported()" in inspect.getsource(cpu.CpuPlatform.check_and_update_config)
    assert cpu_kv_cache.cpu_has_avx512_bf16() is bool(torch.cpu._is_avx512_bf16_supported())


def test_the_recurrent_state_dtype_follows_vllms_cpu_rule() -> None:
    assert recurrent_state_bytes(2, "auto", avx512_bf16=True) == 4  # the accelerated GDN path resets it to FP32
    assert recurrent_state_bytes(2, "auto", avx512_bf16=False) == 2  # the model's dtype
    assert recurrent_state_bytes(2, "float32", avx512_bf16=False) == 4
    assert recurrent_state_bytes(2, "bfloat16", avx512_bf16=True) == 2


@pytest.mark.parametrize("scale", ["tiny", "full"])
def test_the_delta_net_state_is_the_one_vllm_allocates(
    scale: str, avx512_bf16: bool, tiny_release: Path, tmp_path: Path
) -> None:
    """Bytes per DeltaNet layer and sequence: vLLM's own state shapes, conv in BF16, the recurrent state in FP32
    on AVX-512 BF16 CPUs, else BF16."""
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator

    release = tiny_release if scale == "tiny" else _full_size_release(tiny_release, tmp_path)
    text = json.loads((release / "config.json").read_text())["text_config"]
    conv, recurrent = MambaStateShapeCalculator.gated_delta_net_state_shape(
        1, text["linear_num_key_heads"], text["linear_num_value_heads"], text["linear_key_head_dim"],
        text["linear_value_head_dim"], text["linear_conv_kernel_dim"],
    )  # fmt: skip
    layout = kv_layout(release, "bfloat16", "auto")
    assert layout.delta_net_state_bytes == math.prod(conv) * 2 + math.prod(recurrent) * (4 if avx512_bf16 else 2)
    assert layout.attention_bytes_per_token == 2 * text["num_key_value_heads"] * text["head_dim"] * 2
    assert (layout.attention_layers, layout.delta_net_layers) == ((1, 3) if scale == "tiny" else (8, 24))
    assert kv_layout(release, "bfloat16", "fp8").attention_bytes_per_token * 2 == layout.attention_bytes_per_token


def test_blocks_and_pages_follow_vllms_layout(avx512_bf16: bool, tiny_release: Path, tmp_path: Path) -> None:
    """The tiny release: vLLM logs 'Setting attention block size to 384 tokens' on an AVX-512 BF16 CPU, 256
    elsewhere (the CLI test checks this machine's)."""
    tiny = kv_layout(tiny_release, "bfloat16", "auto")
    block = 384 if avx512_bf16 else 256
    assert tiny.block_tokens == block and tiny.page_bytes == block * 256 >= tiny.delta_net_state_bytes
    assert tiny.sequence_bytes(block) == (1 + 3) * tiny.page_bytes
    assert tiny.sequence_bytes(block + 1) == (2 + 3) * tiny.page_bytes
    full = kv_layout(_full_size_release(tiny_release, tmp_path), "bfloat16", "auto")
    if avx512_bf16:
        assert full.block_tokens == 640  # a 2.05 MiB DeltaNet state = 524 tokens of 4 KiB, rounded up to 128
        assert 572 * MIB < full.sequence_bytes(16384) < 590 * MIB  # 16384 x 32 KiB + 24 states of 2.05 MiB, padded
    else:
        assert full.block_tokens == 384  # a 1.05 MiB state = 268 tokens of 4 KiB, rounded up to 128
        assert 548 * MIB < full.sequence_bytes(16384) < 560 * MIB
    assert kv_layout(tiny_release, "bfloat16", "auto", "float32").block_tokens == 384


TINY = KvLayout(attention_layers=1, delta_net_layers=3, attention_bytes_per_token=256, delta_net_state_bytes=68608)
FULL = KvLayout(attention_layers=8, delta_net_layers=24, attention_bytes_per_token=4096, delta_net_state_bytes=2146304)


def test_the_default_holds_every_sequence_when_memory_allows() -> None:
    slack = 4 * TINY.page_bytes
    size = default_kv_cache_bytes(TINY, max_model_len=512, max_num_seqs=128, weights=GIB, available=20 * GIB)
    assert size == 128 * TINY.sequence_bytes(512) + slack
    assert size < 64 * MIB  # vLLM's own default would have reserved 0.92 of the machine


def test_the_default_is_capped_by_the_memory_free_after_the_weights() -> None:

    available, weights = 20 * GIB, 10 * GIB
    size = default_kv_cache_bytes(FULL, max_model_len=16384, max_num_seqs=128, weights=weights, available=available)
    assert size == int((available - weights) * KV_SHARE_OF_FREE)
    two = default_kv_cache_bytes(FULL, 16384, 128, weights=weights // 4, engines=2, available=available)
    assert two == int((available - weights // 2) * KV_SHARE_OF_FREE / 2)


def test_a_machine_without_room_for_one_longest_prompt_is_refused_naming_the_flags() -> None:

    with pytest.raises(InsufficientMemory) as caught:
        default_kv_cache_bytes(FULL, max_model_len=16384, max_num_seqs=128, weights=9 * GIB, available=10 * GIB)
    message = str(caught.value)
    assert "one prompt of --max-model-len 16384 tokens" in message
    assert "lower --max-model-len or --dp, or size the cache with --kv-cache-memory-bytes" in message
    assert default_kv_cache_bytes(FULL, max_model_len=1024, max_num_seqs=128, weights=9 * GIB, available=10 * GIB)


@pytest.mark.parametrize(
    "argv, env, sized",
    [
        ([], {}, True),
        (["--kv-cache-memory-bytes", "3G"], {}, False),
        ([], {"VLLM_CPU_KVCACHE_SPACE": "2"}, False),
        (["--gpu-memory-utilization", "0.1"], {}, False),
    ],
)
def test_explicit_cache_settings_win(
    argv: list[str], env: dict[str, str], sized: bool, tiny_release: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from predictor.cli import build_parser
    from predictor.config import engine_config
    from predictor.engines import with_cpu_kv_cache
    from predictor.engines.engine_args import vllm_engine_args

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["--engine", "vllm", "--max-model-len", "512", *argv])
    given = vllm_engine_args(engine_config(args, tiny_release), on_gpu=False)
    chosen = with_cpu_kv_cache(given, tiny_release)
    if sized:
        assert given.kv_cache_memory_bytes is None
        layout = kv_layout(tiny_release, "bfloat16", "auto")
        assert chosen.kv_cache_memory_bytes == 128 * layout.sequence_bytes(512) + 4 * layout.page_bytes
    else:
        assert chosen == given


def test_a_large_gpu_memory_utilization_is_refused_before_vllm_starts(
    tiny_release: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from predictor.cli import build_parser
    from predictor.config import engine_config
    from predictor.engines import with_cpu_kv_cache
    from predictor.engines.engine_args import vllm_engine_args

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    args = build_parser().parse_args(["--engine", "vllm", "--gpu-memory-utilization", "0.99"])
    given = vllm_engine_args(engine_config(args, tiny_release), on_gpu=False)
    with pytest.raises(InsufficientMemory, match="lower --gpu-memory-utilization"):
        with_cpu_kv_cache(given, tiny_release)
