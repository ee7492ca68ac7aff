"""NVFP4 quantization of a tiny release: config, fused groups' shared global scales, FP4 rounding, loading.

CPU vLLM (0.32) has no NVFP4 linear kernel for the CPU platform (``init_nvfp4_linear_kernel`` finds
none), so the release is loaded here through the transformers reference path only; vLLM runs it on GPUs.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bench.agreement import question_agreement
from clef_head.checkpoint import HEAD_SUBFOLDER, HEAD_WEIGHTS_FILE
from clef_head.request import parse_request
from clef_tools.quantize import IGNORE, quantize_release
from clef_tools.sized_records import make_records
from predictor.engines.reference import TransformersScorer
from tests.quantize.backbone import backbone_tensors

# Written independently of clef_tools.quantize: vLLM's fused GEMMs, as (layer prefix, member) patterns.
FUSED = re.compile(
    r"^(?P<parent>model\.language_model\.layers\.\d+\.(self_attn|mlp|linear_attn))\."
    r"(?P<member>q_proj|k_proj|v_proj|gate_proj|up_proj|in_proj_qkv|in_proj_z)$"
)
EXPECTED_GROUPS = {"self_attn": 3, "mlp": 2, "linear_attn": 2}
FP4_MAX = 6.0
FP8_E4M3_MAX = 448.0
# e4m3 keeps 3 mantissa bits: a group scale rounded to FP8 is at most 1/16 below the exact one, so a
# group's largest value can land at most 6 / (1 - 1/16) = 6.4 FP4 units (then clamps to 6).
MAX_SCALED = FP4_MAX / (1 - 1 / 16)
# NVFP4 vs BF16 on the tiny random release (transformers, CPU), measured on 2 seeds x 12 records:
# mean KL 2.3e-4 to 4.0e-4, max KL <= 1.2e-3, largest probability difference 0.021, top-1 agreement
# 0.92 to 1.0 (the random head's options are near ties). The thresholds leave ~5x headroom.
MAX_MEAN_KL = 2e-3
MAX_PROBABILITY_DIFF = 0.1
MIN_TOP1 = 0.75
AGREEMENT_RECORDS = 12


@pytest.fixture(scope="module", autouse=True)
def eager_fp4_rounding() -> Iterator[None]:
    """compressed-tensors rounds to FP4 in a ``torch.compile``d function; on the CPU its first calls build C++ with
    Inductor (about 40 s of compiler for releases of a few MB, in every fresh environment). Run eagerly, it rounds
    the same values."""
    with torch.compiler.set_stance("force_eager"):
        yield


@pytest.fixture(scope="module")
def nvfp4_release(toy_release: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny release quantized to NVFP4 on the CPU (two calibration records keep it quick)."""
    destination = tmp_path_factory.mktemp("quantize-nvfp4") / "nvfp4"
    report = quantize_release(toy_release, destination, scheme="NVFP4", device="cpu", calibration_records=2)
    assert report.quantized_modules == 25 and report.scheme == "NVFP4"
    return destination


def _fp4_values(packed: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (two per byte, low nibble first) as float values: sign bit, then 0, .5, 1, 1.5, 2, 3, 4, 6."""
    magnitudes = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2).long()
    values = magnitudes[codes & 0x7]
    return torch.where(codes & 0x8 > 0, -values, values)


def test_config_carries_the_nvfp4_scheme(nvfp4_release: Path) -> None:
    config = json.loads((nvfp4_release / "config.json").read_text())["quantization_config"]
    assert (config["quant_method"], config["format"]) == ("compressed-tensors", "nvfp4-pack-quantized")
    assert config["ignore"] == IGNORE
    (group,) = config["config_groups"].values()
    weights, inputs = group["weights"], group["input_activations"]
    for args in (weights, inputs):
        assert (args["type"], args["num_bits"], args["group_size"], args["strategy"]) == (
            "float",
            4,
            16,
            "tensor_group",
        )
        assert args["scale_dtype"] == "torch.float8_e4m3fn"
    assert weights["dynamic"] is False and inputs["dynamic"] == "local"
    assert "scheme: NVFP4" in (nvfp4_release / "recipe.yaml").read_text()
    assert (nvfp4_release / HEAD_SUBFOLDER / HEAD_WEIGHTS_FILE).is_file()


def test_fused_groups_share_global_scales(toy_release: Path, nvfp4_release: Path) -> None:
    source, output = backbone_tensors(toy_release), backbone_tensors(nvfp4_release)
    groups: dict[str, list[str]] = defaultdict(list)
    for name in output:
        match = FUSED.match(name.removesuffix(".weight_packed"))
        if name.endswith(".weight_packed") and match:
            groups[match["parent"]].append(name.removesuffix(".weight_packed"))
    assert len(groups) == 3 * 2 + 1 * 2  # 3 GDN layers (in_proj_qkv+z, gate+up), 1 attention layer (qkv, gate+up)
    differing = 0
    for parent, members in groups.items():
        assert len(members) == EXPECTED_GROUPS[parent.rsplit(".", 1)[1]], members
        for kind in ("weight_global_scale", "input_global_scale"):
            scales = [output[f"{member}.{kind}"] for member in members]
            assert all(scale.dtype == torch.float32 and scale.shape == (1,) for scale in scales)
            assert all(torch.equal(scale, scales[0]) for scale in scales), (parent, kind, scales)
        # The shared weight scale maps the group's largest |weight| (over all members) to FP8 max x FP4 max.
        own = [source[f"{member}.weight"].float().abs().amax() for member in members]
        expected = FP8_E4M3_MAX * FP4_MAX / max(own)
        assert torch.allclose(output[f"{members[0]}.weight_global_scale"], expected.reshape(1), rtol=1e-5)
        differing += len({round(float(value), 6) for value in own}) > 1
    assert differing > 0  # members' own scales would differ: the sharing is not a coincidence


def test_dequantized_weights_are_within_fp4_rounding(toy_release: Path, nvfp4_release: Path) -> None:
    source, output = backbone_tensors(toy_release), backbone_tensors(nvfp4_release)
    modules = [name.removesuffix(".weight_packed") for name in output if name.endswith(".weight_packed")]
    assert len(modules) == 25
    for module in modules:
        original = source[f"{module}.weight"].float()
        packed, scale = output[f"{module}.weight_packed"], output[f"{module}.weight_scale"]
        assert packed.dtype == torch.uint8 and packed.shape == (original.shape[0], original.shape[1] // 2)
        assert scale.dtype == torch.float8_e4m3fn and scale.shape == (original.shape[0], original.shape[1] // 16)
        step = (scale.float() / output[f"{module}.weight_global_scale"]).repeat_interleave(16, dim=1)
        dequantized = _fp4_values(packed) * step
        scaled = original.abs() / step  # each value in FP4 units of its group
        assert scaled.max() <= MAX_SCALED, module
        # Half the gap to the next E2M1 value (0.25 below 2, 0.5 below 4, 1 below 6), or the clamp above 6.
        half_gap = torch.where(scaled <= 2, 0.25, torch.where(scaled <= 4, 0.5, 1.0))
        bound = torch.where(scaled > FP4_MAX, scaled - FP4_MAX, half_gap) * step
        error = (dequantized - original).abs()
        # Plus float32 rounding of the comparison itself: a few ulps of the value (matters where the clamp above 6
        # leaves almost no bound).
        allowance = bound * (1 + 1e-3) + original.abs() * 2**-20 + 1e-9
        assert (error <= allowance).all(), (module, (error - allowance).max())
        assert error.max() > 0  # really FP4, not a copy


def test_kept_layers_stay_bf16(toy_release: Path, nvfp4_release: Path) -> None:
    source, output = backbone_tensors(toy_release), backbone_tensors(nvfp4_release)
    kept = [name for name in source if re.search(r"(^lm_head\.|\.linear_attn\.in_proj_[ab]\.|^model\.visual\.)", name)]
    assert any(name.startswith("lm_head.") for name in kept) and any("in_proj_a" in name for name in kept)
    for name in kept:
        assert torch.equal(output[name], source[name]), name


def test_reference_engine_runs_nvfp4_and_agrees_with_bf16(toy_release: Path, nvfp4_release: Path) -> None:
    bf16, nvfp4 = TransformersScorer(toy_release), TransformersScorer(nvfp4_release)
    gate = nvfp4.backbone.layers[0].mlp.gate_proj
    assert hasattr(gate, "weight_global_scale")  # loaded through compressed-tensors
    records = make_records(bf16.tokenizer, AGREEMENT_RECORDS, seed=0, tokens=192, spread=32)
    encoded = [bf16.encode(parse_request(body)) for body in records]
    result = question_agreement([item.layout for item in encoded], bf16.score(encoded), nvfp4.score(encoded))
    assert result["mean_kl"] > 0
    assert result["mean_kl"] <= MAX_MEAN_KL, result
    assert result["max_probability_diff"] <= MAX_PROBABILITY_DIFF, result
    assert result["top1_agreement"] >= MIN_TOP1, result
