"""The full-size random release builder: the full shape's config, and a real build at tiny scale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from clef_head.checkpoint import RANDOM_MARKER, load_head
from clef_tools.fullsize import FULL_HEAD, build_release, model_config
from clef_tools.quantize import quantize_release
from clef_tools.tiny import SPECIAL_TOKENS

TOKEN_IDS = {token: index for index, token in enumerate(SPECIAL_TOKENS)}


def test_full_shape_is_qwen3_5_9b() -> None:
    from transformers import Qwen3_5ForConditionalGeneration

    text = model_config("full", TOKEN_IDS).text_config
    assert (text.vocab_size, text.hidden_size, text.intermediate_size, text.num_hidden_layers) == (
        248320,
        4096,
        12288,
        32,
    )
    assert (text.num_attention_heads, text.num_key_value_heads, text.head_dim) == (16, 4, 256)
    assert (text.linear_num_key_heads, text.linear_num_value_heads) == (16, 32)
    assert (text.linear_key_head_dim, text.linear_value_head_dim) == (128, 128)
    assert text.layer_types == ["linear_attention"] * 3 + ["full_attention"] + text.layer_types[4:]
    assert text.layer_types.count("full_attention") == 8 and text.layer_types[7::4] == ["full_attention"] * 7
    assert text.rope_parameters["partial_rotary_factor"] == 0.25
    assert text.rope_parameters["mrope_interleaved"] is True
    vision = model_config("full", TOKEN_IDS).vision_config
    assert (vision.depth, vision.hidden_size, vision.intermediate_size, vision.num_heads) == (27, 1152, 4304, 16)
    assert (vision.num_position_embeddings, vision.patch_size, vision.spatial_merge_size) == (2304, 16, 2)
    assert (vision.temporal_patch_size, vision.hidden_act, vision.out_hidden_size) == (2, "gelu_pytorch_tanh", 4096)
    with torch.device("meta"):
        model = Qwen3_5ForConditionalGeneration._from_config(model_config("full", TOKEN_IDS))
    tower = sum(p.numel() for name, p in model.named_parameters() if name.startswith("model.visual."))
    text = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("model.visual."))
    assert 8.9e9 < text < 9.1e9 and 0.45e9 < tower < 0.47e9
    assert (FULL_HEAD.hidden_size, FULL_HEAD.width, FULL_HEAD.layers, FULL_HEAD.heads) == (4096, 1024, 4, 16)


@pytest.fixture(scope="module")
def tiny_fullsize(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny-scale build on the CPU (sharded, like the full one)."""
    out = tmp_path_factory.mktemp("fullsize") / "bf16"
    summary = build_release(out, scale="tiny", device="cpu")
    assert summary["parameters"] > 0 and summary["bytes"] > 0
    return out


def test_tiny_build_is_a_complete_sharded_random_release(tiny_fullsize: Path) -> None:
    index = json.loads((tiny_fullsize / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and all((tiny_fullsize / shard).is_file() for shard in shards)
    assert "lm_head.weight" in index["weight_map"]
    assert "Random weights" in (tiny_fullsize / RANDOM_MARKER).read_text()
    assert load_head(tiny_fullsize).config.hidden_size == 128
    with pytest.raises(FileExistsError):
        build_release(tiny_fullsize, scale="tiny", device="cpu")


def test_sharded_release_quantizes_shard_by_shard(tiny_fullsize: Path, tmp_path: Path) -> None:
    report = quantize_release(tiny_fullsize, tmp_path / "fp8", device="cpu")
    index = json.loads((tmp_path / "fp8" / "model.safetensors.index.json").read_text())["weight_map"]
    scales = [name for name in index if name.endswith(".weight_scale")]
    assert len(scales) == report.quantized_modules == 25
    assert all((tmp_path / "fp8" / shard).is_file() for shard in set(index.values()))
    assert index["lm_head.weight"] and "lm_head.weight_scale" not in index
