"""Identical requests answered once: a byte-bounded LRU of answers, and in-flight merging.

Two kinds of entries share one budget (``--answer-cache-bytes``):

- option logits by prompt (:func:`cache_key`): two requests share logits only when their encoded prompts
  are identical: the same token ids and the same layout (questions, options, spans), compared exactly, not
  by a hash. The response is still built from each request itself. Requests that differ only in what the
  encoder normalizes away (key order inside the state, for instance) encode identically and share;
- whole responses by body (:func:`body_key`): a body identical byte for byte to one answered before (a
  retry, a fan-out), under the same content type and serving settings, is answered from that response's
  JSON text before it is read, validated or encoded, so a repeat does not wait for an encode worker.
"""

from __future__ import annotations

import asyncio
import json
from array import array
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

import torch

from clef_head.encoder import EncodedRequest
from clef_head.layout import RecordLayout
from predictor.core import metrics

CacheKey = tuple[bytes, RecordLayout, bytes]
BodyKey = tuple[Hashable, str, bytes]
"""The serving settings a body is read under, its content type, and the body."""
ENTRY_OVERHEAD_BYTES = 256
"""Dictionary slot, tuples, tensor header and layout objects of one entry, roughly."""


def cache_key(encoded: EncodedRequest) -> CacheKey:
    """The identity of a prompt: its token ids (as bytes), its layout and its media's digest
    (:func:`clef_head.media.media_digest`: SHA-256 of the image and frame files, each video's frame count and
    fps; two images or videos of one size have the same token ids)."""
    digest = encoded.media.digest if encoded.media is not None else b""
    return array("i", encoded.input_ids).tobytes(), encoded.layout, digest


def body_key(settings: Hashable, content_type: str, body: bytes) -> BodyKey:
    """The exact identity of a request body under ``settings`` (what reading and encoding it depend on)."""
    return settings, content_type, body


class AnswerCache:
    """Option logits by prompt and responses by body, least recently used first out, at most ``max_bytes``
    (0: no cache).

    :meth:`score` also merges concurrent calls for the same prompt into one engine call, cache or not.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[CacheKey | BodyKey, tuple[torch.Tensor | bytes, int]] = OrderedDict()
        self._in_flight: dict[CacheKey, asyncio.Task[torch.Tensor]] = {}
        metrics.ANSWER_CACHE_BYTES.set_function(lambda: self.bytes)

    def __len__(self) -> int:
        return len(self._entries)

    def _get(self, key: CacheKey | BodyKey) -> torch.Tensor | bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def _put(self, key: CacheKey | BodyKey, value: torch.Tensor | bytes, size: int) -> None:
        if size > self.max_bytes or key in self._entries:
            return
        self._entries[key] = (value, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped

    def get(self, key: CacheKey) -> torch.Tensor | None:
        """The cached logits of ``key`` (now the most recently used), or None."""
        logits = self._get(key)
        assert logits is None or isinstance(logits, torch.Tensor)
        return logits

    def put(self, key: CacheKey, logits: torch.Tensor) -> None:
        """Keep ``logits`` for ``key``, dropping the least recently used entries beyond ``max_bytes``."""
        self._put(key, logits, len(key[0]) + logits.numel() * logits.element_size() + ENTRY_OVERHEAD_BYTES)

    def response(self, key: BodyKey) -> dict[str, Any] | None:
        """A new copy of the response kept for ``key`` (a hit), or None."""
        text = self._get(key)
        if text is None:
            return None
        assert isinstance(text, bytes)
        metrics.ANSWER_CACHE.labels(outcome="hit").inc()
        return json.loads(text)

    def keep_response(self, key: BodyKey, response: dict[str, Any]) -> None:
        """Keep ``response`` (as JSON text) for the body of ``key``, within ``max_bytes``."""
        if self.max_bytes == 0:
            return
        text = json.dumps(response, separators=(",", ":")).encode()
        self._put(key, text, len(key[1]) + len(key[2]) + len(text) + ENTRY_OVERHEAD_BYTES)

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
