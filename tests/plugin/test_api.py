"""The plugin's public API without an engine: names, engine arguments, pooling parameters, results."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import clef_plugin
from clef_head.layout import LayoutError, QuestionLayout, RecordLayout

pytestmark = pytest.mark.vllm

LAYOUT = RecordLayout(
    questions=(
        QuestionLayout("urgent", 0, (3, 5), ((6, 8), (9, 11)), ("true", "false")),
        QuestionLayout("team", 1, (12, 14), ((15, 16), (17, 19), (20, 22)), ("a", "b", "c")),
    )
)


def test_contract_names() -> None:
    """The names other components code against."""
    assert clef_plugin.ARCHITECTURE == "ClefQwen3_5ForJointSchema"
    assert clef_plugin.POOLING_TASK == "token_embed"
    assert clef_plugin.LAYOUT_KEY == "clef_layout"


def test_importing_the_package_does_not_import_vllm() -> None:
    """Processes that only build requests (the predictor's frontend) stay light."""
    code = "import sys, clef_plugin; assert 'vllm' not in sys.modules, 'vllm was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_register_adds_the_architecture_and_its_config_rules() -> None:
    """register() is idempotent and makes vLLM know the architecture lazily."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from clef_plugin.engine_config import ClefEngineConfig

    clef_plugin.register()
    clef_plugin.register()
    assert clef_plugin.ARCHITECTURE in ModelRegistry.get_supported_archs()
    assert MODELS_CONFIG_MAP[clef_plugin.ARCHITECTURE] is ClefEngineConfig


def test_engine_kwargs() -> None:
    """Pooling runner, our architecture and task, text only, chunked prefill on, prefix caching off."""
    kwargs = clef_plugin.engine_kwargs("/models/clef", max_model_len=8192, max_num_seqs=4, tensor_parallel_size=2)
    assert kwargs["model"] == "/models/clef"
    assert kwargs["runner"] == "pooling"
    assert kwargs["hf_overrides"] == {"architectures": [clef_plugin.ARCHITECTURE]}
    assert kwargs["pooler_config"].task == clef_plugin.POOLING_TASK
    assert kwargs["language_model_only"] is True
    assert kwargs["enable_prefix_caching"] is False
    assert kwargs["enable_chunked_prefill"] is True
    assert kwargs["max_model_len"] == 8192
    assert kwargs["max_num_seqs"] == 4
    assert kwargs["tensor_parallel_size"] == 2
    assert "max_num_batched_tokens" not in kwargs
    assert kwargs["compilation_config"] == {
        "cudagraph_mode": "PIECEWISE",
        "cudagraph_capture_sizes": clef_plugin.api.prefill_capture_sizes(8192),
        "custom_ops": ["+quant_fp8"],
    }


def test_engine_kwargs_vision() -> None:
    """Text only: no vision tower, no multimodal settings. Vision: the tower, 16 images and 4 videos a prompt,
    and processed pixels read as they are."""
    text_only = clef_plugin.engine_kwargs("/models/clef")
    assert text_only["language_model_only"] is True
    assert not {"enable_mm_embeds", "limit_mm_per_prompt", "mm_device_do_normalize"} & text_only.keys()
    vision = clef_plugin.engine_kwargs("/models/clef", vision=True)
    assert vision["language_model_only"] is False
    assert vision["limit_mm_per_prompt"] == {"image": 16, "video": 4}
    from clef_plugin.compat.processed_images import processed_videos_supported

    assert processed_videos_supported()  # this vLLM's video items carry the frame times
    assert vision["enable_mm_embeds"] is True
    assert vision.get("mm_device_do_normalize", False) is False


def test_vision_profiling_sizes_may_be_set_but_not_the_counts() -> None:
    """``limit_mm_per_prompt`` may set the dummy sizes vLLM profiles and warms up with; its counts stay the
    predictor's media limits (vLLM would refuse a prompt the predictor admitted)."""
    sizes = {"image": {"width": 448, "height": 448}, "video": {"count": 4, "num_frames": 4, "width": 64, "height": 64}}
    vision = clef_plugin.engine_kwargs("/models/clef", vision=True, limit_mm_per_prompt=sizes)
    assert vision["limit_mm_per_prompt"] == {
        "image": {"count": 16, "width": 448, "height": 448},
        "video": {"count": 4, "num_frames": 4, "width": 64, "height": 64},
    }
    assert clef_plugin.engine_kwargs("/models/clef", vision=True, limit_mm_per_prompt={"image": 16})[
        "limit_mm_per_prompt"
    ] == {"image": 16, "video": 4}
    for refused in ({"image": 4}, {"video": {"count": 8}}, {"audio": 1}):
        with pytest.raises(clef_plugin.api.PluginSettingConflict, match="--limit-mm-per-prompt"):
            clef_plugin.engine_kwargs("/models/clef", vision=True, limit_mm_per_prompt=refused)


def test_engine_prompt_cuts_each_image_and_video_to_one_pad() -> None:
    """vLLM gets one pad per image and per video (it expands them again from the grids and the videos' times)
    and the pixels as they are."""
    from clef_head.encoder import EncodedRequest
    from clef_head.media import EncodedMedia

    start, pad, end, newline, video_pad, stamp = 5, 7, 6, 9, 8, 11
    video = [start, stamp, stamp, start, video_pad, video_pad, end, stamp, start, video_pad, video_pad, end, end]
    media = EncodedMedia(
        token_ids=[start, pad, pad, pad, pad, end, start, pad, end, *video, newline],
        token_type_ids=[0, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 2, 2, 0, 0, 0, 2, 2, 0, 0, 0],
        pixel_values=torch.zeros(20, 4),
        image_grid_thw=torch.tensor([[1, 4, 4], [1, 2, 2]]),
        pixel_values_videos=torch.zeros(16, 4),
        video_grid_thw=torch.tensor([[2, 2, 4]]),
        video_timestamps=((0.25, 1.5),),
        video_runs=((10, 21),),
        digest=b"\x0a\x0b",
    )
    encoded = EncodedRequest(input_ids=[1, 2, *media.token_ids, 3, 4], layout=LAYOUT, media=media, media_offset=2)
    prompt = clef_plugin.engine_prompt(encoded, pad, video_pad)
    assert prompt["prompt_token_ids"] == [1, 2, start, pad, end, start, pad, end, start, video_pad, end, newline, 3, 4]
    image = prompt["multi_modal_data"]["image"]
    assert image["pixel_values"] is media.pixel_values and image["image_grid_thw"] is media.image_grid_thw
    sent = prompt["multi_modal_data"]["video"]
    assert sent["pixel_values_videos"] is media.pixel_values_videos and sent["video_grid_thw"] is media.video_grid_thw
    assert [times.tolist() for times in sent["timestamps"]] == [[0.25, 1.5]]
    assert sent["timestamps"][0].dtype == torch.float64
    assert prompt["multi_modal_uuids"] == {"image": ["0a0b:0", "0a0b:1"], "video": ["0a0b:video:0"]}
    text = EncodedRequest(input_ids=[1, 2, 3], layout=LAYOUT)
    assert clef_plugin.engine_prompt(text, pad, video_pad) == {"prompt_token_ids": [1, 2, 3]}


def test_prefill_capture_sizes() -> None:
    """Small sizes, then every 128 tokens up to one prompt of min(max_model_len, 2048) tokens."""
    from clef_plugin.api import prefill_capture_sizes

    assert prefill_capture_sizes(8192) == [16, 32, 64, 128, 256, *range(384, 2049, 128)]
    assert prefill_capture_sizes(1000) == [16, 32, 64, 128, 256, 384, 512, 640, 768, 896, 1000]
    assert prefill_capture_sizes(100) == [16, 32, 64, 100]


def test_custom_ops_are_vllms() -> None:
    """The custom ops the plugin turns on are ops vLLM registers (a renamed op would be refused by vLLM's config, or
    silently left off), and vLLM's compilation config takes them as given, its own default after them."""
    from vllm.config import CompilationConfig
    from vllm.model_executor import custom_op
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8

    assert custom_op.op_registry["quant_fp8"] is QuantFP8
    assert {name.lstrip("+") for name in clef_plugin.api.CUSTOM_OPS} <= custom_op.op_registry.keys()
    config = CompilationConfig(**clef_plugin.api.graph_compilation_config([16, 32]))
    assert config.custom_ops[: len(clef_plugin.api.CUSTOM_OPS)] == list(clef_plugin.api.CUSTOM_OPS)


def test_engine_kwargs_compilation() -> None:
    """Eager engines get no compilation config; a caller's own config wins over ours."""
    assert "compilation_config" not in clef_plugin.engine_kwargs("/models/clef", enforce_eager=True)
    own = {"cudagraph_mode": "NONE"}
    assert clef_plugin.engine_kwargs("/models/clef", compilation_config=own)["compilation_config"] is own


@pytest.mark.parametrize(
    "setting, flag",
    [
        ({"enable_prefix_caching": True}, "--enable-prefix-caching"),
        ({"enable_chunked_prefill": False}, "--enable-chunked-prefill"),
        ({"pipeline_parallel_size": 2}, "--pipeline-parallel-size"),
        ({"runner": "generate"}, "--runner"),
        ({"language_model_only": False}, "--language-model-only"),
        ({"language_model_only": True, "vision": True}, "--language-model-only"),
        ({"mm_device_do_normalize": True, "vision": True}, "--mm-device-do-normalize"),
        ({"hf_overrides": {"architectures": ["Qwen3_5ForConditionalGeneration"]}}, "--hf-overrides"),
        ({"pooler_config": {"task": "embed"}}, "--pooler-config"),
        ({"model": "/models/other"}, "--model"),
    ],
)
def test_engine_kwargs_refuses_contradictions(setting: dict, flag: str) -> None:
    """A setting the plugin cannot honour is an error naming the flag, never silently overridden."""
    with pytest.raises(clef_plugin.api.PluginSettingConflict, match=f"^{flag} .* contradicts the clef plugin"):
        clef_plugin.engine_kwargs("/models/clef", **setting)


def test_engine_kwargs_keeps_compatible_settings() -> None:
    """Settings that agree with the plugin's are accepted; other hf_overrides keys are kept."""
    kwargs = clef_plugin.engine_kwargs(
        "/models/clef", enable_prefix_caching=False, runner="pooling", hf_overrides={"max_window_layers": 4}
    )
    assert kwargs["hf_overrides"] == {"max_window_layers": 4, "architectures": [clef_plugin.ARCHITECTURE]}


def test_quantizes_lm_head() -> None:
    """compressed-tensors configs quantize lm_head unless their ignore list names it; GPTQ style says so."""
    from clef_plugin.api import quantizes_lm_head

    assert not quantizes_lm_head(None)
    assert quantizes_lm_head({"quant_method": "compressed-tensors", "ignore": []})
    assert not quantizes_lm_head({"quant_method": "compressed-tensors", "ignore": ["re:.*lm_head"]})
    assert not quantizes_lm_head({"quant_method": "compressed-tensors", "ignore": ["lm_head"]})
    assert quantizes_lm_head({"quant_method": "gptq", "lm_head": True})
    assert not quantizes_lm_head({"quant_method": "fp8"})


def test_pooling_params_carry_the_layout() -> None:
    """The wire layout travels under LAYOUT_KEY and comes back equal."""
    params = clef_plugin.pooling_params(LAYOUT, prompt_length=30)
    assert params.task == clef_plugin.POOLING_TASK
    assert RecordLayout.from_wire(params.extra_kwargs[clef_plugin.LAYOUT_KEY], 30) == LAYOUT


def test_pooling_params_refuse_a_layout_longer_than_the_prompt() -> None:
    """A layout that does not fit its prompt never reaches the engine."""
    with pytest.raises(LayoutError, match="past the prompt's 20 tokens"):
        clef_plugin.pooling_params(LAYOUT, prompt_length=20)


def _output(data: torch.Tensor) -> SimpleNamespace:
    return SimpleNamespace(request_id="r1", outputs=SimpleNamespace(data=data))


def test_option_logits() -> None:
    """Logits come back as float32; error records and empty outputs raise."""
    from clef_plugin.pooler import error_record  # imports vLLM: here, not while the suite is collected

    values = clef_plugin.option_logits(_output(torch.tensor([0.5, -1.0], dtype=torch.bfloat16)))
    assert values.dtype == torch.float32 and values.tolist() == [0.5, -1.0]
    with pytest.raises(LayoutError, match="request r1: layout.questions\\[0\\].type must be 0, 1 or 2"):
        clef_plugin.option_logits(
            _output(error_record("layout.questions[0].type must be 0, 1 or 2", torch.device("cpu")))
        )
    with pytest.raises(RuntimeError, match="returned no option logits"):
        clef_plugin.option_logits(_output(torch.empty(0)))
