"""The vLLM engine: vLLM's AsyncLLM with the clef plugin; concurrent requests batch inside vLLM.

Prompts go in as token ids encoded by clef_head (with ``--vision``, images and videos as the release
processors' pixels, prepared with the body: ``clef_plugin.engine_prompt``); each request carries its layout in
its pooling parameters, and the plugin's pooler returns the option logits. ``--dp N`` uses vLLM's own data
parallelism (N engine cores, one per GPU, balanced by vLLM).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.engine.exceptions import EngineDeadError

from clef_head.encoder import EncodedRequest
from clef_head.media import IMAGE_PAD, VIDEO_PAD
from predictor.core import metrics
from predictor.engines.base import Engine, EngineDead

if TYPE_CHECKING:
    from vllm import AsyncEngineArgs


class VllmEngine(Engine):
    """An ``AsyncLLM`` built from engine arguments that carry the plugin's settings (``clef_plugin.engine_kwargs``)."""

    kind = "vllm"

    def __init__(self, engine_args: AsyncEngineArgs) -> None:
        from transformers import AutoTokenizer
        from vllm.v1.engine.async_llm import AsyncLLM

        import clef_plugin

        self._plugin = clef_plugin
        self._max_length = int(engine_args.max_model_len)
        # With --vision vLLM loads the release's tokenizer itself (its multimodal processing needs it): that one is
        # shared instead of reading the release's tokenizer.json again (seconds per read). Text engines skip vLLM's
        # (``skip_tokenizer_init``) and load theirs before the engine is built.
        own = AutoTokenizer.from_pretrained(str(engine_args.model)) if engine_args.skip_tokenizer_init else None
        self.llm = AsyncLLM.from_engine_args(engine_args)
        try:
            self._tokenizer = own if own is not None else self.llm.tokenizer
            self._image_pad_id, self._video_pad_id = (self._token_id(token) for token in (IMAGE_PAD, VIDEO_PAD))
        except BaseException:
            self.llm.shutdown()
            raise
        self._pending = 0
        self._in_flight = metrics.IN_FLIGHT.labels(engine="vllm")

    def _token_id(self, token: str) -> int:
        """The id of one of the release's media tokens; ``ValueError`` when it has no such single token."""
        token_id = self._tokenizer.convert_tokens_to_ids(token)
        if not isinstance(token_id, int):
            raise ValueError(f"the release's tokenizer has no single {token} token")
        return token_id

    @property
    def tokenizer(self) -> Any:
        """The release's tokenizer."""
        return self._tokenizer

    @property
    def capacity(self) -> int:
        """Requests per engine step (``--max-num-seqs``) times the data-parallel engine cores."""
        config = self.llm.vllm_config
        return int(config.scheduler_config.max_num_seqs) * int(config.parallel_config.data_parallel_size)

    @property
    def max_length(self) -> int:
        """vLLM's ``max_model_len``."""
        return self._max_length

    @property
    def pixel_dtype(self) -> torch.dtype:
        """The model's dtype (vLLM's ``--dtype``): the vision tower's, as vLLM gives its own processor's pixels."""
        dtype: torch.dtype = self.llm.vllm_config.model_config.dtype
        return dtype

    async def score(self, encoded: EncodedRequest) -> torch.Tensor:
        """Option logits of one prompt (one ``encode`` request to the engine)."""
        params = self._plugin.pooling_params(encoded.layout, len(encoded.input_ids))
        final = None
        self._pending += 1
        self._in_flight.inc()
        try:
            async for output in self.llm.encode(
                self._plugin.engine_prompt(encoded, self._image_pad_id, self._video_pad_id),
                params,
                request_id=uuid.uuid4().hex,
            ):
                final = output
        except EngineDeadError as exc:
            raise EngineDead(f"the vLLM engine core died: {exc}") from exc
        finally:
            self._pending -= 1
            self._in_flight.dec()
        if final is None:
            raise EngineDead("vLLM returned no output for a request")
        return self._plugin.option_logits(final)

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
