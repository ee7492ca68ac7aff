"""Offline helpers: engine arguments, per-request pooling parameters, results, batch scoring.

vLLM is imported inside the functions, so importing this module stays light.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import torch

from clef_head.answers import build_response
from clef_head.encoder import DEFAULT_MAX_LENGTH, encode_request
from clef_head.layout import LayoutError, RecordLayout
from clef_head.request import SystemOneRequest, parse_request
from clef_plugin.names import ARCHITECTURE, LAYOUT_KEY, POOLING_TASK

if TYPE_CHECKING:
    from vllm import LLM, PoolingParams


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


def graph_compilation_config(capture_sizes: Sequence[int]) -> dict[str, Any]:
    """vLLM ``compilation_config``: torch.compile plus piecewise CUDA graphs at ``capture_sizes`` tokens.

    Piecewise only: there are no decode steps, so vLLM's full-batch decode graphs would never replay.
    """
    return {"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": list(capture_sizes)}


def engine_kwargs(
    model_dir: str | Path,
    *,
    max_model_len: int = 16384,
    dtype: str = "bfloat16",
    enforce_eager: bool = False,
    gpu_memory_utilization: float = 0.9,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM(**kw)`` and ``vllm.AsyncEngineArgs(**kw)``.

    Pooling runner, the plugin's architecture, the per-token pooling task, language model only
    (no vision tower), chunked prefill on and prefix caching off. Unless ``enforce_eager`` is set or
    ``extra`` holds a ``compilation_config``, vLLM compiles the model and captures piecewise CUDA
    graphs at :func:`prefill_capture_sizes`. ``extra`` is passed through (e.g.
    ``tensor_parallel_size``, ``quantization``, ``gdn_prefill_backend``); asking for prefix caching
    raises ``ValueError``.
    """
    from vllm.config import PoolerConfig

    if extra.get("enable_prefix_caching"):
        raise ValueError(
            "enable_prefix_caching must stay off for Clef: the head reads every prompt token's hidden state"
        )
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "runner": "pooling",
        "hf_overrides": {"architectures": [ARCHITECTURE]},
        "pooler_config": PoolerConfig(task=POOLING_TASK),
        "language_model_only": True,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": True,
        "max_model_len": max_model_len,
        "dtype": dtype,
        "enforce_eager": enforce_eager,
        "gpu_memory_utilization": gpu_memory_utilization,
    }
    if max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = max_num_batched_tokens
    if max_num_seqs is not None:
        kwargs["max_num_seqs"] = max_num_seqs
    if not enforce_eager:
        kwargs["compilation_config"] = graph_compilation_config(prefill_capture_sizes(max_model_len))
    kwargs.update(extra)
    return kwargs


def pooling_params(layout: RecordLayout, prompt_length: int | None = None) -> PoolingParams:
    """``PoolingParams`` carrying ``layout`` under :data:`LAYOUT_KEY`.

    The layout is validated first (and against ``prompt_length`` when given), so a bad one is
    refused here with :class:`clef_head.LayoutError` instead of reaching the engine.
    """
    from vllm import PoolingParams

    wire = layout.to_wire()
    RecordLayout.from_wire(wire, prompt_length)
    return PoolingParams(task=POOLING_TASK, extra_kwargs={LAYOUT_KEY: wire})


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
        for request, item, output in zip(parsed, encoded, outputs)
    ]
