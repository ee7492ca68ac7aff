"""Where the preparation of bodies (:mod:`predictor.serving.prepare`) runs: a thread of the serving process, or a
pool of worker processes (``--encode-processes N``) that read, validate and tokenize outside the serving
process's interpreter lock, which the event loop and the engine's output handling need.

Workers are started with ``spawn`` (the serving process holds threads and maybe CUDA: never ``fork``) and
each loads the release's ``tokenizer.json`` once (:class:`predictor.serving.prepare.ReleaseTokenizer`: no torch,
about 0.3 GB with the Qwen3.5 vocabulary); before the model is ready every worker encodes a probe body,
which must match the engine tokenizer's prompt. The model launches them once its engine is built
(:meth:`EncodePool.launch`), so they start while the server opens its listeners and warms the engine up. A
worker that dies fails the requests it held with 503 + Retry-After (``encoder_died``); the pool is rebuilt and
later requests are answered. A worker whose job runs past :data:`JOB_DEADLINE_S` (a hang, not a slow body: an
8 MiB body, the default limit, takes about 0.5 s) ends itself, so a hung worker is handled as a dead one; the
deadline counts from the job's start in the worker, not from its wait in the pool's queue.

On a server that reads images and videos, the probe carries a small image and a two-frame video too: the first
image a process reads loads the release's processors (importing transformers and torch: seconds on a CPU, tens
of seconds on a loaded GPU host), so each worker, and the serving process with ``--encode-processes 0``, pays
that before the model is ready rather than on a client's first image.

With workers, a small body that comes while the server has nothing else to do is still prepared in a thread of the
serving process, with the engine's tokenizer (``run(..., inline=True)``; the service decides when:
``--inline-encode-max-bytes``): the hop to a worker and back costs a lone request more than its encoding
(BENCHMARKS.md, R39), and with no other request in flight the interpreter lock it holds meanwhile delays nothing.
Its images and videos, if any, are still read by a worker (``SystemOneService.settings_in_process``).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from io import BytesIO
from pathlib import Path
from typing import Any, TypeVar

from predictor.core.errors import Unavailable
from predictor.serving import prepare
from predictor.serving.prepare import PrepareSettings
from predictor.serving.request_policy import RequestPolicy

log = logging.getLogger(__name__)

T = TypeVar("T")
ENCODER_DIED_RETRY_AFTER_S = 1
MAX_AUTO_PROCESSES = 4
CORES_PER_AUTO_PROCESS = 4
PROBE_MAX_LENGTH = 1 << 20
JOB_DEADLINE_S = 60
DEFAULT_INLINE_ENCODE_MAX_BYTES = 64 * 1024
"""``--inline-encode-max-bytes``'s default: a body of ~16,000 prompt tokens of text; its encoding is bounded (on a
development machine's core, under 0.1 s for 60 KB of one token per byte, the worst case found)."""
#: A small valid body every started worker encodes, to compare its prompt with the engine tokenizer's
#: (accents, CJK, Cyrillic, an emoji, a special token, digits, runs of whitespace).
PROBE_BODY: dict[str, Any] = {
    "model": "probe",
    "state": {
        "ticket": "Charged twice: 19.99 € on 2024-05-01 ",
        "text": "Café naïve 質問 фраза — refund?\n\t  spaced   out 🙂 <|im_end|> 0123456789 don't",
        "items": [1, 2.5, True, None],
    },
    "questions": {"refund": {"type": "noul", "instructions": "Should we refund?"}},
}


PROBE_IMAGE_SIDE = 32
"""The probe image's width and height (the processor scales it up to its smallest size)."""


def probe_image(shade: int) -> str:
    """A :data:`PROBE_IMAGE_SIDE`-pixel square PNG of one colour (``shade`` from 0 to 255), as a data URL."""
    from PIL import Image

    png = BytesIO()
    Image.new("RGB", (PROBE_IMAGE_SIDE, PROBE_IMAGE_SIDE), (shade, 128, 255 - shade)).save(png, format="PNG")
    return f"data:image/png;base64,{base64.b64encode(png.getvalue()).decode()}"


def probe_body(settings: PrepareSettings) -> dict[str, Any]:
    """:data:`PROBE_BODY`, with an image and, when the engine reads videos, a two-frame video on a server that
    reads media (``settings.vision``)."""
    if settings.vision is None:
        return PROBE_BODY
    frames = [probe_image(shade) for shade in (0, 255)]
    body: dict[str, Any] = {**PROBE_BODY, "images": frames[:1]}
    if settings.vision.videos:
        body["videos"] = [{"frames": frames}]
    return body


def probe_settings(settings: PrepareSettings) -> PrepareSettings:
    """The settings a probe is prepared with: the server's request and media limits, the default name policy
    (any model name), no bound on the prompt's length."""
    return PrepareSettings("probe", settings.limits, RequestPolicy(), PROBE_MAX_LENGTH, settings.vision)


def auto_encode_processes(gpu_count: int, cpu_count: int) -> int:
    """``--encode-processes auto``: none on a CPU engine (its forward passes already need every core and
    the interpreter lock is not what bounds it); with GPUs, one worker per 4 cores, at most 4, leaving
    cores to the event loop and the engine's own processes."""
    if gpu_count <= 0:
        return 0
    return min(MAX_AUTO_PROCESSES, cpu_count // CORES_PER_AUTO_PROCESS)


def usable_cpus() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class InProcessPreparer:
    """Prepares bodies in a thread of the serving process (``--encode-processes 0``)."""

    processes = 0

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def launch(self, settings: PrepareSettings) -> None:
        """Nothing to start ahead: this process's tokenizer is the engine's."""

    async def start(self, settings: PrepareSettings) -> None:
        """On a server that reads media, load the release's processors (a probe body with an image and a video)."""
        if settings.vision is not None:
            await self.run(prepare.prepare, probe_settings(settings), probe_body(settings))

    async def run(self, job: Callable[..., T], *args: Any, inline: bool = False) -> T:
        """``job(tokenizer, *args)`` in a worker thread (``inline``: the same, every job runs in this process)."""
        return await asyncio.to_thread(job, self.tokenizer, *args)

    def close(self) -> None:
        """Nothing to stop."""


class EncodePool:
    """Prepares bodies in ``processes`` worker processes, each with the release's tokenizer."""

    def __init__(
        self, release_dir: Path, processes: int, engine_tokenizer: Any, job_deadline_s: int = JOB_DEADLINE_S
    ) -> None:
        if processes < 1:
            raise ValueError("an encode pool needs at least one process")
        self.release_dir = release_dir
        self.processes = processes
        self.engine_tokenizer = engine_tokenizer
        self.job_deadline_s = job_deadline_s
        self._context = multiprocessing.get_context("spawn")
        self._pool: ProcessPoolExecutor | None = None
        self._probe: tuple[PrepareSettings, dict[str, Any]] | None = None  # what each started worker encodes
        self._probes: list[Future[tuple[int, list[int]]]] = []
        self._launched = 0.0
        self._closed = False

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            self.processes,
            mp_context=self._context,
            initializer=prepare.init_worker,
            initargs=(str(self.release_dir), self.job_deadline_s),
        )

    def launch(self, settings: PrepareSettings) -> None:
        """Spawn every worker and send each its probe, without waiting: the workers load the tokenizer while the
        server starts its listeners and warms the engine up (:meth:`start` waits for them)."""
        self._probe = probe_settings(settings), probe_body(settings)
        self._launched = time.perf_counter()
        self._pool = self._new_pool()
        self._probes = self._submit_probes(self._pool)

    async def start(self, settings: PrepareSettings) -> None:
        """Start every worker (unless :meth:`launch` did) and wait until each has loaded the tokenizer and encodes
        as the engine does."""
        if self._pool is None:
            self.launch(settings)
        assert self._pool is not None
        probes, self._probes = self._probes, []
        await self._check_probes(probes)
        log.info(
            "%d encode worker process(es) started in %.1fs (--encode-processes)",
            self.processes,
            time.perf_counter() - self._launched,
        )

    def _submit_probes(self, pool: ProcessPoolExecutor) -> list[Future[tuple[int, list[int]]]]:
        """One probe per worker at once (the pool spawns a process per waiting task)."""
        assert self._probe is not None
        settings, body = self._probe
        return [pool.submit(prepare.run_in_worker, prepare.worker_probe, settings, body) for _ in range(self.processes)]

    async def _check_probes(self, probes: list[Future[tuple[int, list[int]]]]) -> None:
        """Compare each worker's prompt of the probe with the engine tokenizer's."""
        assert self._probe is not None
        settings, body = self._probe
        expected = (await asyncio.to_thread(prepare.prepare, self.engine_tokenizer, settings, body))[1].input_ids
        for _pid, input_ids in await asyncio.gather(*(asyncio.wrap_future(probe) for probe in probes)):
            if input_ids != expected:
                raise RuntimeError(
                    f"an encode worker's tokenizer (from {self.release_dir}) encodes differently from the engine's"
                )

    async def run(self, job: Callable[..., T], *args: Any, inline: bool = False) -> T:
        """``job(tokenizer, *args)`` in a worker; 503 (``encoder_died``) when the worker died meanwhile.
        A pool found broken before the job is submitted (a worker died idle) is replaced first.
        ``inline``: in a thread of this process with the engine's tokenizer instead (a lone small body)."""
        pool = self._pool
        if pool is None or self._closed:
            raise Unavailable("the encode workers are not running", "encoder_died", ENCODER_DIED_RETRY_AFTER_S)
        if inline:
            return await asyncio.to_thread(job, self.engine_tokenizer, *args)
        loop = asyncio.get_running_loop()
        try:
            pending = loop.run_in_executor(pool, prepare.run_in_worker, job, *args)
        except BrokenProcessPool:  # a worker died while idle: this request was in no worker, use new ones
            self._replace(pool)
            pool = self._pool
            assert pool is not None
            pending = loop.run_in_executor(pool, prepare.run_in_worker, job, *args)
        try:
            return await pending
        except BrokenProcessPool as exc:
            self._replace(pool)
            raise Unavailable(
                "an encode worker process died while preparing this request; retry",
                "encoder_died",
                ENCODER_DIED_RETRY_AFTER_S,
            ) from exc

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        """Swap a broken pool for a new one (once, whichever request noticed first) and start its workers."""
        if self._pool is not broken or self._closed:
            return
        log.error("an encode worker process died; starting %d new one(s)", self.processes)
        broken.shutdown(wait=False, cancel_futures=True)
        self._pool = self._new_pool()
        task = asyncio.get_running_loop().create_task(self._check_probes(self._submit_probes(self._pool)))
        task.add_done_callback(_log_failure)

    def close(self) -> None:
        """Stop the workers (after the drain: requests still waiting fail)."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("restarting the encode workers failed: %r", task.exception())


Preparer = InProcessPreparer | EncodePool
