"""Data parallelism behind one port: several engines, each request to the least-loaded one."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from clef_head.encoder import EncodedRequest
from predictor.engines.base import Engine


class EnginePool(Engine):
    """Spreads requests over engines by fewest in-flight records (round-robin among equals)."""

    kind = "pool"

    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        self.engines = list(engines)
        self._turn = itertools.count()

    @property
    def tokenizer(self) -> Any:
        """The first engine's tokenizer (all engines serve the same release)."""
        return self.engines[0].tokenizer

    @property
    def max_length(self) -> int:
        """The longest prompt every engine accepts."""
        return min(engine.max_length for engine in self.engines)

    @property
    def pixel_dtype(self) -> torch.dtype | None:
        """The first engine's (all engines serve the same release alike)."""
        return self.engines[0].pixel_dtype

    @property
    def capacity(self) -> int:
        """Records all engines run at once."""
        return sum(engine.capacity for engine in self.engines)

    async def start(self) -> None:
        """Start every engine."""
        for engine in self.engines:
            await engine.start()

    def pick(self) -> Engine:
        """The engine to send the next record to."""
        start = next(self._turn) % len(self.engines)
        rotated = self.engines[start:] + self.engines[:start]
        return min(rotated, key=lambda engine: engine.in_flight)

    async def score(self, encoded: EncodedRequest) -> torch.Tensor:
        """Score on the least-loaded engine."""
        return await self.pick().score(encoded)

    async def check_health(self) -> None:
        """Dead as soon as any engine is dead (a pod serves all its GPUs or none)."""
        for engine in self.engines:
            await engine.check_health()

    @property
    def in_flight(self) -> int:
        """Records in flight over all engines."""
        return sum(engine.in_flight for engine in self.engines)

    def close(self) -> None:
        """Close every engine."""
        for engine in self.engines:
            engine.close()
