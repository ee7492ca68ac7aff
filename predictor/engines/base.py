"""The engine interface: score one encoded prompt, asynchronously; concurrent calls are batched."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from clef_head.encoder import EncodedRequest


class EngineDead(RuntimeError):
    """The engine can no longer serve requests; the process should be restarted."""


class Engine(ABC):
    """Scores encoded System One prompts. Built synchronously, started in the serving event loop."""

    #: Short name used in logs and metrics ("transformers", "vllm", "pool").
    kind: str = "engine"

    @property
    @abstractmethod
    def tokenizer(self) -> Any:
        """The release's Hugging Face tokenizer (prompts are encoded with clef_head's encoder)."""

    @property
    @abstractmethod
    def max_length(self) -> int:
        """Longest prompt, in tokens, the engine accepts."""

    async def start(self) -> None:  # noqa: B027 (an optional hook, not an abstract method)
        """Start background work (batchers, output handlers) in the running event loop. This default starts
        nothing: an engine with none to start (the vLLM one: AsyncLLM starts its own) keeps it."""

    @abstractmethod
    async def score(self, encoded: EncodedRequest) -> torch.Tensor:
        """Flat float32 option logits of one prompt (``layout.option_count`` values)."""

    @abstractmethod
    async def check_health(self) -> None:
        """Raise :class:`EngineDead` (with the cause) when the engine cannot serve any more."""

    @abstractmethod
    def close(self) -> None:
        """Release the engine's resources; pending requests fail."""

    @property
    @abstractmethod
    def capacity(self) -> int:
        """Records the engine runs at once (sizes the default admission queue)."""

    @property
    def pixel_dtype(self) -> torch.dtype | None:
        """The dtype the engine's vision tower reads image and video pixels in (it casts them to it first), which
        they are made in before they travel to the engine; ``None`` (this default): the processors' float32."""
        return None

    @property
    def in_flight(self) -> int:
        """Records submitted and not yet answered (used to spread load over data-parallel engines)."""
        return 0
