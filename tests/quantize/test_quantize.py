"""FP8_DYNAMIC quantization of a tiny release: files, config, tensors, loading, FP8-vs-BF16 agreement."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bench.agreement import question_agreement
from clef_head.checkpoint import HEAD_CONFIG_FILE, HEAD_SUBFOLDER, HEAD_WEIGHTS_FILE, RANDOM_MARKER
from clef_head.request import parse_request
from clef_tools.quantize import IGNORE, RECIPE_FILE, QuantizationError, quantize_release
from clef_tools.sized_records import make_records
from predictor.engines.reference import TransformersScorer
from tests.quantize.backbone import backbone_tensors

# Written independently of clef_tools.quantize: the backbone's Linear layers that must be FP8.
FP8_LINEAR = re.compile(
    r"^model\.language_model\.layers\.\d+\."
    r"(mlp\.(gate|up|down)_proj|self_attn\.[qkvo]_proj|linear_attn\.(in_proj_qkv|in_proj_z|out_proj))$"
)
KEPT_LINEAR = re.compile(r"(^lm_head$|\.linear_attn\.in_proj_[ab]$|^model\.visual\.)")

# FP8 vs BF16 on the tiny random release (transformers, CPU). Measured on 3 seeds x 32 records:
# mean KL 3.4e-5 to 4.5e-5, max KL <= 2.6e-4, largest probability difference <= 0.010, top-1
# agreement 0.97 to 1.0 (the random head's options are near ties, so a rare flip is expected).
# Re-batching the same BF16 model alone gives mean KL ~3e-6. The thresholds leave ~5x headroom
# over the measurement; wrong scales or an unquantized layer in the wrong place exceed them.
MAX_MEAN_KL = 2e-4
MAX_PROBABILITY_DIFF = 0.05
MIN_TOP1 = 0.9
AGREEMENT_RECORDS = 12


@pytest.fixture(scope="module")
def fp8_release(toy_release: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny release quantized to FP8_DYNAMIC (on the CPU)."""
    destination = tmp_path_factory.mktemp("quantize") / "fp8"
    report = quantize_release(toy_release, destination, device="cpu")
    assert report.quantized_modules > 0
    return destination


def test_config_carries_the_fp8_dynamic_scheme(fp8_release: Path) -> None:
    config = json.loads((fp8_release / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors"
    assert config["format"] == "float-quantized"
    assert config["quantization_status"] == "compressed"
    assert config["ignore"] == IGNORE
    (group,) = config["config_groups"].values()
    assert group["targets"] == ["Linear"]
    weights, inputs = group["weights"], group["input_activations"]
    assert (weights["type"], weights["num_bits"], weights["strategy"], weights["dynamic"]) == (
        "float",
        8,
        "channel",
        False,
    )
    assert (inputs["type"], inputs["num_bits"], inputs["strategy"], inputs["dynamic"]) == ("float", 8, "token", True)
    assert group["output_activations"] is None


def test_linear_weights_are_fp8_with_channel_scales(toy_release: Path, fp8_release: Path) -> None:
    source, output = backbone_tensors(toy_release), backbone_tensors(fp8_release)
    linear = {  # 2-D weights but the token embedding: Linear layers (and the vision tower's embeddings)
        name.removesuffix(".weight")
        for name, tensor in source.items()
        if name.endswith(".weight") and tensor.dim() == 2 and "embed_tokens" not in name
    }
    fp8 = {name for name in linear if FP8_LINEAR.match(name)}
    assert len(fp8) == 25  # 3 GDN layers x 6 + 1 attention layer x 7
    for module in fp8:
        weight, scale = output[f"{module}.weight"], output[f"{module}.weight_scale"]
        original = source[f"{module}.weight"].float()
        assert weight.dtype == torch.float8_e4m3fn and weight.shape == original.shape
        assert scale.shape == (original.shape[0], 1)
        # e4m3 spacing is at most 32 below 448: rounding moves a value by at most 16 scale units,
        # plus at most 1 from the BF16 division that precedes the FP8 cast.
        error = (weight.float() * scale.float() - original).abs()
        assert (error <= 17 * scale.float()).all(), module
        assert (original.abs().amax(dim=1, keepdim=True) / scale.float() - 448).abs().max() < 4
    kept = [name for name in linear if KEPT_LINEAR.search(name)]
    assert any(".in_proj_a" in name for name in kept) and any(name == "lm_head" for name in kept)
    assert any(name.startswith("model.visual.") for name in kept)
    for module in kept:
        assert output[f"{module}.weight"].dtype == torch.bfloat16, module
        assert f"{module}.weight_scale" not in output, module
        assert torch.equal(output[f"{module}.weight"], source[f"{module}.weight"])
    assert linear == fp8 | set(kept), sorted(linear - fp8 - set(kept))
    for name, tensor in source.items():  # embeddings, norms, conv and GDN parameters stay as they were
        if name.removesuffix(".weight") not in linear:
            assert torch.equal(output[name], tensor), name


def test_layout_head_recipe_and_random_note(toy_release: Path, fp8_release: Path) -> None:
    for name in (HEAD_CONFIG_FILE, HEAD_WEIGHTS_FILE):
        assert (fp8_release / HEAD_SUBFOLDER / name).read_bytes() == (toy_release / name).read_bytes()
        assert not (fp8_release / name).exists()
    for name in ("tokenizer.json", "tokenizer_config.json", "processor_config.json", "chat_template.jinja"):
        assert (fp8_release / name).read_bytes() == (toy_release / name).read_bytes()
    recipe = (fp8_release / RECIPE_FILE).read_text()
    assert "scheme: FP8_DYNAMIC" in recipe and "re:.*linear_attn.in_proj_a$" in recipe
    assert (fp8_release / RANDOM_MARKER).is_file()
    assert "Random weights" in (fp8_release / "README.md").read_text()


def test_refuses_bad_sources_and_destinations(toy_release: Path, fp8_release: Path, tmp_path: Path) -> None:
    with pytest.raises(QuantizationError, match="not empty"):
        quantize_release(toy_release, fp8_release, device="cpu")
    with pytest.raises(QuantizationError, match="already has a quantization_config"):
        quantize_release(fp8_release, tmp_path / "twice", device="cpu")
    with pytest.raises(QuantizationError, match="config.json is missing"):
        quantize_release(tmp_path, tmp_path / "out", device="cpu")
    with pytest.raises(QuantizationError, match="scheme must be one of"):
        quantize_release(toy_release, tmp_path / "w4a16", scheme="W4A16", device="cpu")


def test_command_line_reports_errors_without_a_traceback(fp8_release: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "clef_tools.quantize", str(fp8_release), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert "already has a quantization_config" in result.stderr and "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def scorers(toy_release: Path, fp8_release: Path) -> tuple[TransformersScorer, TransformersScorer]:
    """BF16 and FP8 transformers reference scorers (CPU)."""
    return TransformersScorer(toy_release), TransformersScorer(fp8_release)


@pytest.fixture(scope="module")
def agreement_records(scorers: tuple[TransformersScorer, TransformersScorer]) -> list[dict]:
    """Short seeded records for the agreement checks."""
    return make_records(scorers[0].tokenizer, AGREEMENT_RECORDS, seed=0, tokens=192, spread=32)


def _assert_agrees(result: dict) -> None:
    assert result["questions"] >= AGREEMENT_RECORDS
    assert result["mean_kl"] <= MAX_MEAN_KL, result
    assert result["max_probability_diff"] <= MAX_PROBABILITY_DIFF, result
    assert result["top1_agreement"] >= MIN_TOP1, result


def test_reference_engine_runs_fp8_and_agrees_with_bf16(
    scorers: tuple[TransformersScorer, TransformersScorer], agreement_records: list[dict]
) -> None:
    bf16, fp8 = scorers
    gate = fp8.backbone.layers[0].mlp.gate_proj
    assert hasattr(gate, "weight_scale")  # loaded through compressed-tensors, not as a plain BF16 model
    encoded = [bf16.encode(parse_request(body)) for body in agreement_records]
    result = question_agreement([item.layout for item in encoded], bf16.score(encoded), fp8.score(encoded))
    _assert_agrees(result)
    assert result["mean_kl"] > 0  # the FP8 path really differs from BF16


@pytest.fixture(scope="module")
def vllm_environment() -> Iterator[None]:
    """CPU vLLM settings for in-process engines (the cache folder: ``shared_compile_cache``)."""
    names = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.mark.vllm
def test_cpu_vllm_serves_the_fp8_release(
    vllm_environment: None,
    fp8_release: Path,
    scorers: tuple[TransformersScorer, TransformersScorer],
    agreement_records: list[dict],
) -> None:
    import vllm

    import clef_plugin

    llm = vllm.LLM(**clef_plugin.engine_kwargs(fp8_release, max_model_len=1024, enforce_eager=True))
    try:
        config = llm.llm_engine.vllm_config.model_config
        assert config.quantization == "compressed-tensors"
        responses = clef_plugin.score_requests(llm, agreement_records)
    finally:
        del llm
    bf16 = scorers[0]
    encoded = [bf16.encode(parse_request(body)) for body in agreement_records]
    reference = bf16.score(encoded)
    engine = []
    for item, response in zip(encoded, responses, strict=True):
        probabilities = []
        for question in item.layout.questions:
            answer = response["answers"][question.question_id]
            if answer["type"] == "noul":
                probabilities += [answer["noul"], 1 - answer["noul"]]
            else:
                probabilities += [answer["probabilities"][option] for option in question.option_ids]
        engine.append(torch.tensor(probabilities).clamp_min(1e-6).log())
    # Responses carry 4-decimal probabilities: compare them as log-probabilities.
    _assert_agrees(question_agreement([item.layout for item in encoded], reference, engine))
