"""The transformers engine: clef_head's reference scorer behind a micro-batcher."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from clef_head.encoder import EncodedRequest
from predictor.core import metrics
from predictor.engines.base import Engine, EngineDead
from predictor.engines.batching import MicroBatcher
from predictor.engines.reference import TransformersScorer


class TransformersEngine(Engine):
    """One :class:`~predictor.engines.reference.TransformersScorer` on one device; one forward pass at a time."""

    kind = "transformers"

    def __init__(
        self,
        model_dir: str | Path,
        max_length: int,
        device: str = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        max_batch: int = 32,
        max_batch_tokens: int = 16384,
        max_wait_s: float = 0.005,
        label: str = "transformers",
        vision: bool = False,
    ) -> None:
        self.label = label
        self.scorer = TransformersScorer(
            model_dir,
            device=device,
            dtype=dtype,
            max_length=max_length,
            max_batch_tokens=max(max_batch_tokens, max_length),
            vision=vision,
        )
        self._batcher: MicroBatcher[EncodedRequest, torch.Tensor] = MicroBatcher(
            self._score_batch,
            max_batch=max_batch,
            max_wait_s=max_wait_s,
            on_batch=metrics.BATCH_SIZE.labels(engine=label).observe,
            name=f"{label}-batcher",
        )
        self._in_flight = metrics.IN_FLIGHT.labels(engine=label)

    @property
    def tokenizer(self) -> Any:
        """The release's tokenizer."""
        return self.scorer.tokenizer

    @property
    def max_length(self) -> int:
        """Longest prompt in tokens."""
        return self.scorer.max_length

    @property
    def pixel_dtype(self) -> torch.dtype | None:
        """The loaded vision tower's dtype (``None`` without it: a text-only engine)."""
        return self.scorer.pixel_dtype

    @property
    def capacity(self) -> int:
        """Records per forward pass."""
        return self._batcher.max_batch

    def _score_batch(self, batch: Sequence[EncodedRequest]) -> list[torch.Tensor]:
        return self.scorer.score(batch)

    async def start(self) -> None:
        """Start the micro-batcher in the running loop."""
        await self._batcher.start()

    async def score(self, encoded: EncodedRequest) -> torch.Tensor:
        """Option logits of one prompt; batched with concurrent calls."""
        self._in_flight.inc()
        try:
            return await self._batcher.submit(encoded)
        except Exception as exc:
            if not self._batcher.alive:
                raise EngineDead(f"{self.label}: the batching loop is not running ({exc})") from exc
            raise
        finally:
            self._in_flight.dec()

    async def check_health(self) -> None:
        """Dead once the batching loop has stopped."""
        if not self._batcher.alive:
            raise EngineDead(f"{self.label}: the batching loop is not running ({self._batcher.failure!r})")

    @property
    def in_flight(self) -> int:
        """Records queued or running."""
        return self._batcher.pending

    def close(self) -> None:
        """Stop the batcher."""
        self._batcher.close()
