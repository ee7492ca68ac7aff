"""The vLLM engine: vLLM's AsyncLLM with the clef plugin; concurrent requests batch inside vLLM.

Prompts go in as token ids encoded by clef_head; each request carries its layout in its pooling
parameters, and the plugin's pooler returns the option logits. ``--dp N`` uses vLLM's own data
parallelism (N engine cores, one per GPU, balanced by vLLM).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import torch

from clef_head.encoder import EncodedRequest
from predictor import metrics
from predictor.engines.base import Engine, EngineDead


class VllmEngine(Engine):
    """An ``AsyncLLM`` built from ``clef_plugin.engine_kwargs``."""

    kind = "vllm"

    def __init__(
        self,
        model_dir: str | Path,
        max_length: int,
        gpu_memory_utilization: float = 0.9,
        data_parallel_size: int = 1,
        enforce_eager: bool = False,
        dtype: str = "bfloat16",
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        compilation_config: dict[str, Any] | None = None,
    ) -> None:
        import clef_plugin
        from transformers import AutoTokenizer
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._plugin = clef_plugin
        self._max_length = max_length
        self._tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        extra: dict[str, Any] = {}
        if data_parallel_size > 1:
            extra["data_parallel_size"] = data_parallel_size
        if compilation_config:
            extra["compilation_config"] = compilation_config
        kwargs = clef_plugin.engine_kwargs(
            str(model_dir),
            max_model_len=max_length,
            dtype=dtype,
            enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            **extra,
        )
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        self._pending = 0
        self._in_flight = metrics.IN_FLIGHT.labels(engine="vllm")

    @property
    def tokenizer(self) -> Any:
        """The release's tokenizer."""
        return self._tokenizer

    @property
    def max_length(self) -> int:
        """vLLM's ``max_model_len``."""
        return self._max_length

    async def score(self, encoded: EncodedRequest) -> torch.Tensor:
        """Option logits of one prompt (one ``encode`` request to the engine)."""
        params = self._plugin.pooling_params(encoded.layout, len(encoded.input_ids))
        final = None
        self._pending += 1
        self._in_flight.inc()
        try:
            async for output in self.llm.encode(
                {"prompt_token_ids": list(encoded.input_ids)}, params, request_id=uuid.uuid4().hex
            ):
                final = output
        finally:
            self._pending -= 1
            self._in_flight.dec()
        if final is None:
            raise EngineDead("vLLM returned no output for a request")
        return self._plugin.option_logits(final).float().cpu()

    async def check_health(self) -> None:
        """vLLM's own health check (engine core process and output handler)."""
        if self.llm.errored:
            raise EngineDead("the vLLM engine core is not running")
        try:
            await self.llm.check_health()
        except Exception as exc:
            raise EngineDead(f"vLLM health check failed: {exc!r}") from exc

    @property
    def in_flight(self) -> int:
        """Requests inside the engine."""
        return self._pending

    def close(self) -> None:
        """Shut the engine core down."""
        self.llm.shutdown()
