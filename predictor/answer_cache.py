"""Identical prompts scored once: a byte-bounded LRU of option logits, and in-flight merging.

Two requests share logits only when their encoded prompts are identical: the same token ids and
the same layout (questions, options, spans), compared exactly, not by a hash. The response is
still built from each request itself. Requests that differ only in what the encoder normalizes
away (key order inside the state, for instance) encode identically and share.
"""

from __future__ import annotations

import asyncio
from array import array
from collections import OrderedDict
from typing import Awaitable, Callable

import torch

from clef_head.encoder import EncodedRequest
from clef_head.layout import RecordLayout
from predictor import metrics

CacheKey = tuple[bytes, RecordLayout]
ENTRY_OVERHEAD_BYTES = 256
"""Dictionary slot, tuple, tensor header and layout objects of one entry, roughly."""


def cache_key(encoded: EncodedRequest) -> CacheKey:
    """The exact identity of a prompt: its token ids (as bytes) and its layout."""
    return array("i", encoded.input_ids).tobytes(), encoded.layout


class AnswerCache:
    """Option logits by prompt, least recently used first out, at most ``max_bytes`` (0: no cache).

    :meth:`score` also merges concurrent calls for the same prompt into one engine call, cache or not.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[CacheKey, tuple[torch.Tensor, int]] = OrderedDict()
        self._in_flight: dict[CacheKey, asyncio.Task[torch.Tensor]] = {}
        metrics.ANSWER_CACHE_BYTES.set_function(lambda: self.bytes)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CacheKey) -> torch.Tensor | None:
        """The cached logits of ``key`` (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: CacheKey, logits: torch.Tensor) -> None:
        """Keep ``logits`` for ``key``, dropping the least recently used entries beyond ``max_bytes``."""
        size = len(key[0]) + logits.numel() * logits.element_size() + ENTRY_OVERHEAD_BYTES
        if size > self.max_bytes or key in self._entries:
            return
        self._entries[key] = (logits, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped

    async def score(self, key: CacheKey, compute: Callable[[], Awaitable[torch.Tensor]]) -> torch.Tensor:
        """Cached logits, or those of an identical prompt in flight, or ``compute()``'s (then cached).

        The engine call runs as its own task: a caller that goes away does not cancel it for the others.
        """
        cached = self.get(key)
        if cached is not None:
            metrics.ANSWER_CACHE.labels(outcome="hit").inc()
            return cached
        task = self._in_flight.get(key)
        if task is not None:
            metrics.ANSWER_CACHE.labels(outcome="merged").inc()
            return await asyncio.shield(task)
        metrics.ANSWER_CACHE.labels(outcome="miss").inc()
        task = asyncio.ensure_future(compute())
        self._in_flight[key] = task
        task.add_done_callback(lambda done: self._finished(key, done))
        return await asyncio.shield(task)

    def _finished(self, key: CacheKey, task: asyncio.Task[torch.Tensor]) -> None:
        self._in_flight.pop(key, None)
        if not task.cancelled() and task.exception() is None:
            self.put(key, task.result())
