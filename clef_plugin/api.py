"""Offline helpers: engine arguments, per-request pooling parameters, results, batch scoring.

vLLM is imported inside the functions, so importing this module stays light.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from clef_head.answers import build_response
from clef_head.encoder import DEFAULT_MAX_LENGTH, EncodedRequest, encode_request
from clef_head.layout import LayoutError, RecordLayout
from clef_head.media import DEFAULT_MEDIA_LIMITS
from clef_head.request import SystemOneRequest, parse_request
from clef_plugin.names import ARCHITECTURE, LAYOUT_KEY, POOLING_TASK

if TYPE_CHECKING:
    from vllm import LLM, PoolingParams
    from vllm.config import PoolerConfig


PREFILL_CAPTURE_SIZES = (16, 32, 64, 128, 256)
"""CUDA-graph sizes (tokens per engine step) below one typical prompt: short prompts and chunk tails."""
CAPTURE_STEP = 128
MAX_CAPTURED_TOKENS = 2048
"""Steps above this many tokens run compiled but without CUDA graphs (launch overhead is small there)."""


def prefill_capture_sizes(max_model_len: int) -> list[int]:
    """CUDA-graph sizes for a prefill-only engine: a few small ones, then every 128 tokens up to one
    prompt of ``min(max_model_len, 2048)`` tokens, so a lone request of that length replays a graph.

    vLLM's default sizes serve decoding (1, 2, 4, 8, 16, 24, ... up to 512); every Clef request is a
    prefill of hundreds of tokens, so those graphs would be captured and never used.
    """
    top = min(max_model_len, MAX_CAPTURED_TOKENS)
    sizes = {size for size in PREFILL_CAPTURE_SIZES if size <= top}
    sizes.update(range(PREFILL_CAPTURE_SIZES[-1] + CAPTURE_STEP, top + 1, CAPTURE_STEP))
    sizes.add(top)
    return sorted(sizes)


CUSTOM_OPS = ("+quant_fp8",)
"""vLLM custom ops run as vLLM's own kernels in compiled engines, instead of the code Inductor generates from their
PyTorch form (vLLM's default when compiling): ``quant_fp8``, the per-token FP8 quantization of every Linear's input in
an FP8 (W8A8 dynamic) release; it does nothing where no Linear is FP8. On an H200 it gave the FP8 release of the full
shape +3.5 % prompt tokens/s, answers about as far from the BF16 engine's as before (mean KL 1.38e-2 against 1.35e-2;
BENCHMARKS.md, R30). vLLM's RMSNorm + quant and SiLU-and-mul + quant fusion passes stay off: vLLM 0.26 replaces no
pattern of this model with them (R30)."""


def graph_compilation_config(capture_sizes: Sequence[int]) -> dict[str, Any]:
    """vLLM ``compilation_config``: torch.compile plus piecewise CUDA graphs at ``capture_sizes`` tokens, with the
    :data:`CUSTOM_OPS` on.

    Piecewise only: there are no decode steps, so vLLM's full-batch decode graphs would never replay.
    """
    return {
        "cudagraph_mode": "PIECEWISE",
        "cudagraph_capture_sizes": list(capture_sizes),
        "custom_ops": list(CUSTOM_OPS),
    }


FIXED_SETTINGS: dict[str, Any] = {
    "runner": "pooling",
    "enable_chunked_prefill": True,
    "enable_prefix_caching": False,
}
"""Engine settings the plugin needs; a caller asking for another value is refused (see :func:`engine_kwargs`)."""
WHY = {
    "runner": "Clef is a pooling model",
    "language_model_only": "it follows vision: the vision tower is loaded with vision=True only",
    "enable_chunked_prefill": "long prompts are scored in chunks",
    "enable_prefix_caching": "the joint schema head reads every prompt token's hidden state",
}
LM_HEAD_NAMES = ("lm_head", "language_model.lm_head", "model.lm_head")


class PluginSettingConflict(ValueError):
    """An engine setting contradicts what the plugin needs; the message names the flag and why."""

    def __init__(self, name: str, value: Any, reason: str) -> None:
        flag = "--" + name.replace("_", "-")
        super().__init__(f"{flag} {value!r} contradicts the clef plugin: {reason}")
        self.flag = flag


def quantizes_lm_head(quantization_config: dict[str, Any] | None) -> bool:
    """True when a checkpoint's ``quantization_config`` quantizes ``lm_head`` (the head reads its rows).

    compressed-tensors configs quantize every targeted Linear not in ``ignore``; GPTQ/AWQ-style
    configs say ``lm_head: true``.
    """
    if not quantization_config:
        return False
    if quantization_config.get("lm_head") is True:
        return True
    if quantization_config.get("quant_method") != "compressed-tensors":
        return False
    for entry in quantization_config.get("ignore", []):
        pattern = entry[3:] if entry.startswith("re:") else re.escape(entry)
        if any(re.fullmatch(pattern, name) for name in LM_HEAD_NAMES):
            return False
    return True


def _release_quantization(model_dir: str | Path, hf_overrides: Any) -> dict[str, Any] | None:
    config_file = Path(model_dir) / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if isinstance(hf_overrides, dict) and "quantization_config" in hf_overrides:
        return hf_overrides["quantization_config"]
    return config.get("quantization_config")


def _pooler_config(given: Any) -> PoolerConfig:
    from vllm.config import PoolerConfig

    if given is None:
        return PoolerConfig(task=POOLING_TASK)
    if isinstance(given, dict):
        given = PoolerConfig(**given)
    if given.task not in (None, POOLING_TASK):
        raise PluginSettingConflict("pooler_config", {"task": given.task}, f"the pooling task must be {POOLING_TASK!r}")
    given.task = POOLING_TASK
    return given


def _vision_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The multimodal settings of a vision engine; ``settings`` that contradict them are refused (a caller's
    ``None`` means vLLM's "not set", as its command line passes them). Takes those settings out of ``settings``."""
    from clef_plugin.compat.processed_images import processed_image_settings, processed_videos_supported

    needed = processed_image_settings()
    for name, value in needed.items():
        given = settings.pop(name, None)
        if given is not None and given != value:
            raise PluginSettingConflict(
                name, given, f"it must be {value!r} with vision (the predictor sends the processor's normalized pixels)"
            )
    videos = DEFAULT_MEDIA_LIMITS.max_videos if processed_videos_supported() else 0
    counts = {"image": DEFAULT_MEDIA_LIMITS.max_images, "video": videos}
    return {"limit_mm_per_prompt": _media_limits(counts, settings.pop("limit_mm_per_prompt", None)), **needed}


def _media_limits(counts: dict[str, int], given: Any) -> dict[str, Any]:
    """vLLM's ``limit_mm_per_prompt``: the predictor's media counts, with the dummy sizes vLLM profiles and warms
    up with where ``given`` sets them (``{"image": {"count": 16, "width": 1024, "height": 1024}}``: a faster
    start and less memory kept for the encoder, when no larger image will come). Counts other than the
    predictor's are refused: the predictor admits up to its own limits, and vLLM would refuse the rest."""
    limits: dict[str, Any] = dict(counts)
    for modality, value in (given or {}).items():
        options = dict(value) if isinstance(value, dict) else {"count": value}
        if modality not in counts or options.get("count", counts[modality]) != counts[modality]:
            raise PluginSettingConflict(
                "limit_mm_per_prompt",
                given,
                f"its counts must be {counts} (the predictor's media limits); only the profiling sizes "
                "(width, height, num_frames) may be set",
            )
        if isinstance(value, dict):
            limits[modality] = {**options, "count": counts[modality]}
    return limits


def engine_kwargs(
    model_dir: str | Path,
    *,
    max_model_len: int = 16384,
    dtype: str = "bfloat16",
    enforce_eager: bool = False,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    vision: bool = False,
    **settings: Any,
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM(**kw)`` and ``vllm.AsyncEngineArgs(**kw)``: ``settings``
    (any of vLLM's engine arguments) with the plugin's own on top.

    The plugin's settings: pooling runner, the plugin's architecture (``hf_overrides``), the
    per-token pooling task, chunked prefill on, prefix caching off (:data:`FIXED_SETTINGS`), and
    language model only (no vision tower loaded, no multimodal settings: text-only engines stay as
    lean as without vision) unless ``vision``. With ``vision`` the tower is loaded and each request
    may carry up to 16 images as the release processor's pixels (:func:`engine_prompt`), read as
    they are (:func:`clef_plugin.compat.processed_images.processed_image_settings`). Unless ``enforce_eager`` is set
    or ``settings`` holds a ``compilation_config``, vLLM compiles the model and captures piecewise CUDA graphs at
    :func:`prefill_capture_sizes`, with the :data:`CUSTOM_OPS` on (:func:`graph_compilation_config`). A setting
    that contradicts the plugin (prefix caching on, chunked prefill off, another runner, architecture or
    pooling task, a pipeline-parallel size, another ``model`` than ``model_dir``, a quantization config that
    quantizes ``lm_head``) raises
    :class:`PluginSettingConflict` naming the flag, instead of being overridden silently.
    """
    fixed = {**FIXED_SETTINGS, "language_model_only": not vision}
    for name, needed in fixed.items():
        value = settings.pop(name, None)
        if value is not None and value != needed:
            raise PluginSettingConflict(name, value, f"it must be {needed!r} ({WHY[name]})")
    if settings.get("pipeline_parallel_size", 1) != 1:
        raise PluginSettingConflict(
            "pipeline_parallel_size",
            settings["pipeline_parallel_size"],
            "pipeline parallelism is not supported; use --tensor-parallel-size",
        )
    model = settings.pop("model", None)
    if model is not None and str(model) != str(model_dir):
        raise PluginSettingConflict("model", model, f"the release folder is {str(model_dir)!r}")
    hf_overrides = dict(settings.pop("hf_overrides", None) or {})
    if hf_overrides.get("architectures", [ARCHITECTURE]) != [ARCHITECTURE]:
        raise PluginSettingConflict("hf_overrides", hf_overrides, f"the architecture must be {ARCHITECTURE!r}")
    if quantizes_lm_head(_release_quantization(model_dir, hf_overrides)):
        raise PluginSettingConflict(
            "hf_overrides" if "quantization_config" in hf_overrides else "model",
            str(model_dir),
            "its quantization config quantizes lm_head, whose rows the head reads: list 'lm_head' in its ignore list",
        )
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        **fixed,
        "hf_overrides": {**hf_overrides, "architectures": [ARCHITECTURE]},
        "pooler_config": _pooler_config(settings.pop("pooler_config", None)),
        "max_model_len": max_model_len,
        "dtype": dtype,
        "enforce_eager": enforce_eager,
    }
    if vision:
        kwargs.update(_vision_settings(settings))
    if max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = max_num_batched_tokens
    if max_num_seqs is not None:
        kwargs["max_num_seqs"] = max_num_seqs
    if not enforce_eager:
        kwargs["compilation_config"] = graph_compilation_config(prefill_capture_sizes(max_model_len))
    kwargs.update(settings)
    return kwargs


def pooling_params(layout: RecordLayout, prompt_length: int | None = None) -> PoolingParams:
    """``PoolingParams`` carrying ``layout`` under :data:`LAYOUT_KEY`.

    When ``prompt_length`` is given, a layout with a span past the prompt is refused here with
    :class:`clef_head.LayoutError` instead of reaching the engine (the engine's pooler checks every
    field again on arrival).
    """
    from vllm import PoolingParams

    if prompt_length is not None:
        for question in layout.questions:
            for start, end in (question.question_span, *question.option_spans):
                if end > prompt_length:
                    raise LayoutError(
                        f"question {question.question_id!r}: span [{start}, {end}] ends past the prompt's "
                        f"{prompt_length} tokens"
                    )
    return PoolingParams(task=POOLING_TASK, extra_kwargs={LAYOUT_KEY: layout.to_wire()})


def engine_prompt(encoded: EncodedRequest, image_pad_id: int, video_pad_id: int) -> dict[str, Any]:
    """vLLM's prompt for ``encoded``: its token ids, and with media each image's run of ``image_pad_id`` tokens
    cut to one and each video's run (its frame pairs' times, markers and pads) cut to one ``video_pad_id``, the
    processors' tensors in ``multi_modal_data``.

    vLLM expands each image's one pad token back to ``t·h·w / merge²`` tokens from the grid, and each video's
    to its frame pairs' ``<t seconds>`` texts, markers and pads from the grid and the times, what the predictor
    placed, so the prompt the engine runs is ``encoded.input_ids`` again and the layout's spans hold as encoded.
    The pixels are the release processors': vLLM runs no image or video processor on them. Each item is named
    by the SHA-256 of the prompt's media files and its place among them (``multi_modal_uuids``), so vLLM does
    not hash the pixels itself to key its encoder cache.
    """
    media = encoded.media
    if media is None:
        return {"prompt_token_ids": list(encoded.input_ids)}
    start = encoded.media_offset
    end = start + len(media.token_ids)
    collapsed: list[int] = []
    cursor = 0
    for run_start, run_end in media.video_runs:
        collapsed += [*_one_pad_per_image(media.token_ids[cursor:run_start], image_pad_id), video_pad_id]
        cursor = run_end
    collapsed += _one_pad_per_image(media.token_ids[cursor:], image_pad_id)
    data: dict[str, Any] = {}
    uuids: dict[str, list[str]] = {}
    if media.image_count:
        data["image"] = {"pixel_values": media.pixel_values, "image_grid_thw": media.image_grid_thw}
        uuids["image"] = [f"{media.digest.hex()}:{index}" for index in range(media.image_count)]
    if media.video_count:
        data["video"] = {
            "pixel_values_videos": media.pixel_values_videos,
            "video_grid_thw": media.video_grid_thw,
            # float64: vLLM writes each time with "{:.1f}", as the video processor does with Python floats
            "timestamps": [torch.tensor(times, dtype=torch.float64) for times in media.video_timestamps],
        }
        uuids["video"] = [f"{media.digest.hex()}:video:{index}" for index in range(media.video_count)]
    return {
        "prompt_token_ids": [*encoded.input_ids[:start], *collapsed, *encoded.input_ids[end:]],
        "multi_modal_data": data,
        "multi_modal_uuids": uuids,
    }


def _one_pad_per_image(tokens: Sequence[int], image_pad_id: int) -> list[int]:
    """``tokens`` with each run of ``image_pad_id`` cut to one."""
    return [
        token
        for index, token in enumerate(tokens)
        if token != image_pad_id or index == 0 or tokens[index - 1] != image_pad_id
    ]


def option_logits(output: Any) -> torch.Tensor:
    """The flat float32 [options] logits of one ``PoolingRequestOutput``.

    Raises :class:`clef_head.LayoutError` with the engine's message when the engine rejected the
    request's layout, and ``RuntimeError`` when the engine returned nothing (aborted request).
    """
    from clef_plugin.pooler import read_error_record

    data = output.outputs.data
    message = read_error_record(data)
    if message is not None:
        raise LayoutError(f"request {output.request_id}: {message}")
    if data.ndim != 1 or data.numel() == 0:
        raise RuntimeError(
            f"request {output.request_id}: the engine returned no option logits (shape {tuple(data.shape)})"
        )
    return data.float().cpu()


@lru_cache(maxsize=4)
def _tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def score_requests(
    llm: LLM, requests: Sequence[dict[str, Any] | SystemOneRequest], max_length: int = DEFAULT_MAX_LENGTH
) -> list[dict[str, Any]]:
    """System One responses for many requests, scored in one ``llm.encode`` call.

    Dict bodies are validated first (:class:`clef_head.InvalidRequest` names the bad field).
    Prompts are cut to fit both ``max_length`` and the engine's ``max_model_len``.
    """
    parsed = [item if isinstance(item, SystemOneRequest) else parse_request(item) for item in requests]
    if not parsed:
        return []
    model_config = llm.llm_engine.model_config
    tokenizer = _tokenizer(str(model_config.model))
    limit = min(max_length, model_config.max_model_len)
    encoded = [encode_request(tokenizer, request, max_length=limit) for request in parsed]
    params = [pooling_params(item.layout, len(item.input_ids)) for item in encoded]
    outputs = llm.encode(
        [{"prompt_token_ids": item.input_ids} for item in encoded],
        pooling_params=params,
        pooling_task=POOLING_TASK,
        use_tqdm=False,
    )
    return [
        build_response(request, item.layout, option_logits(output), len(item.input_ids))
        for request, item, output in zip(parsed, encoded, outputs, strict=True)
    ]
