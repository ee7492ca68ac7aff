"""Micro-batching for engines that run one forward pass at a time (the transformers engine).

Requests that arrive within ``max_wait_s`` of the first one, up to ``max_batch``, are run together
in one worker thread; requests arriving while a batch runs form the next one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)


class MicroBatcher(Generic[T, R]):
    """Gathers concurrent ``submit`` calls into batches for ``run_batch`` (called in a worker thread)."""

    def __init__(
        self,
        run_batch: Callable[[Sequence[T]], Sequence[R]],
        max_batch: int = 32,
        max_wait_s: float = 0.005,
        on_batch: Callable[[int], None] | None = None,
        name: str = "batcher",
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._run_batch = run_batch
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._on_batch = on_batch
        self._name = name
        self._queue: asyncio.Queue[tuple[T, asyncio.Future[R]]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.failure: BaseException | None = None
        self.pending = 0
        self._running: list[tuple[T, asyncio.Future[R]]] = []

    async def start(self) -> None:
        """Start the batching loop in the running event loop."""
        if self._task is not None:
            return
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=self._name)
        self._task.add_done_callback(self._on_done)

    def _on_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            self.failure = self.failure or RuntimeError(f"{self._name} was stopped")
        elif task.exception() is not None:
            self.failure = task.exception()
            log.error("%s died: %r", self._name, self.failure)
        self._fail_waiting(RuntimeError(f"{self._name} is not running: {self.failure!r}"))

    def _fail_waiting(self, error: Exception) -> None:
        """Fail the batch that was running and every queued request (none may wait forever)."""
        waiting = [future for _, future in self._running]
        self._running = []
        if self._queue is not None:
            while not self._queue.empty():
                waiting.append(self._queue.get_nowait()[1])
        for future in waiting:
            if not future.done():
                future.set_exception(error)

    @property
    def alive(self) -> bool:
        """True while the batching loop runs."""
        return self._task is not None and not self._task.done()

    async def submit(self, item: T) -> R:
        """Queue one item and wait for its result."""
        if self._queue is None or not self.alive:
            raise RuntimeError(f"{self._name} is not running: {self.failure!r}")
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self.pending += 1
        try:
            await self._queue.put((item, future))
            return await future
        finally:
            self.pending -= 1

    async def _loop(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.max_wait_s
            while len(batch) < self.max_batch:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    if self._queue.empty():
                        break
                    batch.append(self._queue.get_nowait())
                    continue
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), remaining))
                except TimeoutError:
                    break
            live = [(item, future) for item, future in batch if not future.done()]
            if not live:
                continue
            if self._on_batch is not None:
                self._on_batch(len(live))
            self._running = live
            try:
                results = await loop.run_in_executor(self._executor, self._run_batch, [i for i, _ in live])
            except Exception as exc:  # the batch fails; the loop goes on with the next one
                self._running = []
                log.exception("%s: a batch of %d failed", self._name, len(live))
                for _, future in live:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self._running = []  # (kept on cancellation: _on_done fails them)
            for (_, future), result in zip(live, results, strict=True):
                if not future.done():
                    future.set_result(result)

    def close(self) -> None:
        """Stop the loop; queued and running requests fail."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._fail_waiting(RuntimeError(f"{self._name} was stopped"))
        self._executor.shutdown(wait=False, cancel_futures=True)
