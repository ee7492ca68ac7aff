"""bench.fp8_gemm_rows times the backbone's linear layers: its table must hold exactly the weights of transformers'
Qwen3.5 text model of the same sizes (vLLM merges some projections; the element counts per layer kind are equal)."""

from __future__ import annotations

from collections import Counter

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from bench.fp8_gemm_rows import backbone_gemms
from clef_tools.fullsize import FULL_TEXT
from clef_tools.tiny import TINY_TEXT_SHAPE, layer_types


def test_the_gemm_table_holds_every_linear_weight_of_the_text_model() -> None:
    shape = {name: value for name, value in TINY_TEXT_SHAPE.items() if name != "mrope_section"}
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**shape, layer_types=layer_types(shape["num_hidden_layers"])))
    weights: Counter[str] = Counter()
    for layer in model.model.layers:
        for name, module in layer.named_modules():
            if isinstance(module, torch.nn.Linear):
                weights[name.split(".")[0]] += module.weight.numel()
    table: Counter[str] = Counter()
    for gemm in backbone_gemms(TINY_TEXT_SHAPE):
        table[gemm.name.split(".")[0]] += gemm.out_features * gemm.in_features * gemm.layers
    assert table == weights


def test_the_full_shape_runs_eight_full_attention_layers_and_twenty_four_delta_net_layers() -> None:
    layers = {gemm.name: gemm.layers for gemm in backbone_gemms(FULL_TEXT)}
    assert layers["mlp.down_proj"] == 32 and layers["self_attn.o_proj"] == 8 and layers["linear_attn.out_proj"] == 24
