"""Imports of vLLM modules that probe the device leave CUDA uninitialised in the importing process, so that vLLM
still forks its engine core (:func:`cuda_left_uninitialised`). The other modules of this package import vLLM inside
its block."""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import torch

logger = logging.getLogger(__name__)

DEVICE_PROBES = ("is_available", "get_device_name", "get_device_capability", "current_device")
"""The ``torch.cuda`` functions that modules of vLLM's Qwen3.5 call while they are imported (vLLM 0.26's copy of FLA,
``vllm/third_party/flash_linear_attention/ops/utils.py``: the device's name and capability, and Triton's current
target: Triton's driver is created with ``is_available`` and reads the target through ``current_device`` and
``get_device_capability``, references to which it keeps). Each of them initialises CUDA in the importing process
(``is_available`` the driver only, through ``cudaGetDeviceCount``: that too breaks CUDA in a forked child)."""


def device_facts() -> dict[str, list[Any]]:
    """What the import-time probes read, for every visible device: names, capabilities and Triton's device
    properties (FLA's ``check_shared_mem`` sizes its kernels' blocks by ``max_shared_mem``). Initialises CUDA: run
    it in a child process (:func:`facts_from_child`)."""
    import triton

    count = torch.cuda.device_count()
    utils = triton.runtime.driver.active.utils
    return {
        "names": [torch.cuda.get_device_name(index) for index in range(count)],
        "capabilities": [tuple(torch.cuda.get_device_capability(index)) for index in range(count)],
        "triton_properties": [dict(utils.get_device_properties(index)) for index in range(count)],
    }


def facts_from_child() -> dict[str, list[Any]]:
    """:func:`device_facts` read in a forked child, so that this process does not initialise CUDA (as vLLM reads
    device properties, ``vllm.utils.platform_utils.cuda_get_device_properties``). A bare fork: the child runs the
    function it already holds and imports nothing this process is still importing (the module whose import asks is,
    and a pool's worker would wait for its import lock forever)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write the facts (or the error) and leave at once
        os.close(reader)
        try:
            payload = pickle.dumps(("ok", device_facts()))
        except BaseException as exc:  # noqa: BLE001 (reported to the parent, whatever it is)
            payload = pickle.dumps(("error", repr(exc)))
        with os.fdopen(writer, "wb") as out:
            out.write(payload)
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as incoming:
        data = incoming.read()
    os.waitpid(pid, 0)
    if not data:
        raise RuntimeError("reading device facts in a child process failed: the child wrote nothing")
    status, value = pickle.loads(data)
    if status != "ok":
        raise RuntimeError(f"reading device facts in a child process failed: {value}")
    facts: dict[str, list[Any]] = value
    return facts


@functools.cache
def facts_read_once() -> dict[str, list[Any]]:
    """:func:`facts_from_child`, read once in this process: every module of this package that imports vLLM does so
    inside :func:`cuda_left_uninitialised`, and one child answers them all."""
    return facts_from_child()


def _device_index(device: Any = None) -> int:
    """The index ``torch.cuda`` would read for ``device`` in a process that never selected one (device 0)."""
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    return torch.device(device).index or 0


def _answers_device_probes() -> bool:
    """Whether imports should be shielded from CUDA here (:func:`cuda_left_uninitialised`): in the main process of
    a CUDA machine that has not initialised CUDA yet, unless vLLM is told to spawn its processes anyway."""
    return (
        torch.version.cuda is not None
        and not torch.cuda.is_initialized()
        and multiprocessing.parent_process() is None
        and os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") != "spawn"
        and torch.cuda.device_count() > 0  # NVML: does not initialise CUDA
    )


@contextlib.contextmanager
def cuda_left_uninitialised(facts: Callable[[], dict[str, list[Any]]] = facts_read_once) -> Iterator[None]:
    """Imports inside the block find their device probes (:data:`DEVICE_PROBES`, Triton's driver and its device
    properties) answered from ``facts()``, read in a child process (once), so they leave CUDA uninitialised here.

    vLLM starts its engine core with ``fork`` unless CUDA is initialised in the process that starts it
    (``vllm.utils.system_utils._maybe_force_spawn``); spawned, the engine core imports torch, vLLM and the predictor
    again (20 to 26 s of every start on an H200, BENCHMARKS.md R17). Importing vLLM's Qwen3.5 initialised CUDA in
    every process that imports this plugin, the predictor's and ``vllm serve``'s front ends included, so their engine
    cores were spawned. The answers are the ones the probes would have read here (the same calls, in the child), so
    the modules' import-time settings (FLA's block sizes by shared memory, its Hopper switch) are the same as before,
    and a forked engine core inherits them. Elsewhere (CUDA already initialised, no GPU, a child process, spawn asked
    for) or if the child fails, the block runs as it is.
    """
    if not _answers_device_probes():
        yield
        return
    try:
        answers = facts()
    except Exception as exc:  # noqa: BLE001 (a child that cannot read them, for any reason: import as before)
        logger.warning("device properties not read in a child process (%r): imports may initialise CUDA", exc)
        yield
        return
    import triton

    def available() -> bool:
        return bool(answers["names"])

    with _standing_in([(torch.cuda, "is_available", available)]):
        driver = triton.runtime.driver.active  # created now, keeping torch's own functions, not the stand-ins below
        utils = driver.utils

    def name(device: Any = None) -> str:
        return str(answers["names"][_device_index(device)])

    def capability(device: Any = None) -> tuple[int, int]:
        major, minor = answers["capabilities"][_device_index(device)]
        return int(major), int(minor)

    def properties(device: int) -> dict[str, Any]:
        return dict(answers["triton_properties"][device])

    with _standing_in(
        [
            (torch.cuda, "is_available", available),
            (torch.cuda, "get_device_name", name),
            (torch.cuda, "get_device_capability", capability),
            (torch.cuda, "current_device", lambda: 0),
            (driver, "get_current_device", lambda: 0),
            (driver, "get_device_capability", capability),
            (utils, "get_device_properties", properties),
        ]
    ):
        yield


@contextlib.contextmanager
def _standing_in(stand_ins: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Each ``(owner, attribute, stand_in)``: ``owner.attribute`` is ``stand_in`` inside the block, as before after."""
    originals = [(owner, attribute, getattr(owner, attribute)) for owner, attribute, _ in stand_ins]
    try:
        for owner, attribute, stand_in in stand_ins:
            setattr(owner, attribute, stand_in)
        yield
    finally:
        for owner, attribute, original in reversed(originals):
            setattr(owner, attribute, original)
