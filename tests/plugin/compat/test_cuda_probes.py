"""Importing the plugin leaves CUDA uninitialised in the main process (clef_plugin.compat.cuda_probes).

vLLM forks its engine core unless CUDA is initialised in the process that starts it; vLLM 0.26's Qwen3.5 modules
probe the device while they are imported (its copy of FLA reads the device's name and capability and Triton's target),
which initialised CUDA in every front end and made vLLM spawn the engine core (which imports everything again). The
plugin imports those modules with the probes answered from a child process. CPU tests: a stand-in Triton driver
made as Triton 3.6 makes its own, device facts given, torch's own probes made to fail if they are reached.
"""

from __future__ import annotations

import inspect
import logging
import sys
import types
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.vllm

FACTS: dict[str, list[Any]] = {
    "names": ["NVIDIA H200", "NVIDIA H100 80GB HBM3"],
    "capabilities": [(9, 0), (9, 0)],
    "triton_properties": [{"max_shared_mem": 232448, "multiprocessor_count": 132}, {"max_shared_mem": 232448}],
}


def _reached(name: str) -> Any:
    def probe(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError(f"torch.cuda.{name} was reached: it initialises CUDA")

    return probe


class StandInUtils:
    def __init__(self) -> None:
        self.get_device_properties = _reached("(Triton) get_device_properties")


class StandInDriver:
    """Made as Triton 3.6's ``GPUDriver``: created only when asked for, with ``torch.cuda.is_available()`` (its
    ``is_active``), keeping references to torch's ``current_device`` and ``get_device_capability``."""

    def __init__(self) -> None:
        assert torch.cuda.is_available()
        self.get_current_device = torch.cuda.current_device
        self.get_device_capability = torch.cuda.get_device_capability
        self.utils = StandInUtils()

    def get_current_target(self) -> tuple[str, int]:
        major, minor = self.get_device_capability(self.get_current_device())
        return "cuda", major * 10 + minor


class StandInDriverConfig:
    def __init__(self) -> None:
        self._active: StandInDriver | None = None

    @property
    def active(self) -> StandInDriver:
        if self._active is None:
            self._active = StandInDriver()
        return self._active


@pytest.fixture
def cuda_machine(monkeypatch: pytest.MonkeyPatch) -> StandInDriverConfig:
    """A main process on a CUDA machine that has not initialised CUDA: torch's probes fail if reached, Triton is the
    stand-in above (not created yet)."""
    from clef_plugin.compat import cuda_probes

    for name in cuda_probes.DEVICE_PROBES:
        monkeypatch.setattr(torch.cuda, name, _reached(name))
    config = StandInDriverConfig()
    triton = types.ModuleType("triton")
    triton.runtime = types.SimpleNamespace(driver=config)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setattr(cuda_probes, "_answers_device_probes", lambda: True)
    return config


def import_time_probes() -> dict[str, Any]:
    """What vLLM 0.26's FLA utilities read at import (``get_available_device``, ``is_nvidia_hopper``,
    ``check_shared_mem``), through the same calls."""
    import triton

    driver = triton.runtime.driver.active
    return {
        "target": driver.get_current_target(),
        "available": torch.cuda.is_available(),
        "hopper": "NVIDIA H" in torch.cuda.get_device_name(0) or torch.cuda.get_device_capability()[0] >= 9,
        "name of cuda:1": torch.cuda.get_device_name("cuda:1"),
        "capability of a torch.device": torch.cuda.get_device_capability(torch.device("cuda", 1)),
        "shared memory": [driver.utils.get_device_properties(index)["max_shared_mem"] for index in range(2)],
    }


def test_probes_inside_the_block_are_answered_from_the_facts(cuda_machine: StandInDriverConfig) -> None:
    from clef_plugin.compat.cuda_probes import DEVICE_PROBES, cuda_left_uninitialised

    originals = {name: getattr(torch.cuda, name) for name in DEVICE_PROBES}
    with cuda_left_uninitialised(facts=lambda: FACTS):
        seen = import_time_probes()
    assert seen == {
        "target": ("cuda", 90),
        "available": True,
        "hopper": True,
        "name of cuda:1": "NVIDIA H100 80GB HBM3",
        "capability of a torch.device": (9, 0),
        "shared memory": [232448, 232448],
    }
    # afterwards torch's own functions are back, and Triton's driver keeps torch's, not the stand-ins
    assert {name: getattr(torch.cuda, name) for name in DEVICE_PROBES} == originals
    driver = cuda_machine.active
    assert driver.get_current_device is originals["current_device"]
    assert driver.get_device_capability is originals["get_device_capability"]
    with pytest.raises(AssertionError, match="get_device_properties"):
        driver.utils.get_device_properties(0)


def test_the_block_is_left_alone_where_nothing_needs_answering(monkeypatch: pytest.MonkeyPatch) -> None:
    from clef_plugin.compat import cuda_probes

    def facts() -> dict[str, list[Any]]:
        raise AssertionError("no child process is needed here")

    monkeypatch.setattr(cuda_probes, "_answers_device_probes", lambda: False)
    available = torch.cuda.is_available
    with cuda_probes.cuda_left_uninitialised(facts=facts):
        assert torch.cuda.is_available is available


def test_a_child_that_fails_leaves_the_imports_as_they_were(
    cuda_machine: StandInDriverConfig, caplog: pytest.LogCaptureFixture
) -> None:
    from clef_plugin.compat.cuda_probes import cuda_left_uninitialised

    def facts() -> dict[str, list[Any]]:
        raise RuntimeError("no CUDA in the child")

    with (
        caplog.at_level(logging.WARNING, logger="clef_plugin.compat.cuda_probes"),
        cuda_left_uninitialised(facts=facts),
        pytest.raises(AssertionError, match="get_device_name"),
    ):
        torch.cuda.get_device_name(0)  # torch's own probe, as before
    assert "imports may initialise CUDA" in caplog.text


def test_an_import_that_fails_inside_the_block_restores_torch(cuda_machine: StandInDriverConfig) -> None:
    from clef_plugin.compat.cuda_probes import cuda_left_uninitialised

    name = torch.cuda.get_device_name
    with pytest.raises(ImportError), cuda_left_uninitialised(facts=lambda: FACTS):
        raise ImportError("a module of vLLM failed to import")
    assert torch.cuda.get_device_name is name


def test_only_a_main_process_of_a_cuda_build_without_cuda_initialised_is_shielded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import multiprocessing

    from clef_plugin.compat.cuda_probes import _answers_device_probes

    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    assert _answers_device_probes()
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # vLLM spawns anyway: nothing to gain
    assert not _answers_device_probes()
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not _answers_device_probes()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert not _answers_device_probes()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())  # a spawned engine core or worker
    assert not _answers_device_probes()
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU build of torch
    assert not _answers_device_probes()


def test_vllm_still_forks_its_engine_core_unless_cuda_is_initialised() -> None:
    """The reason for the shield: vLLM's choice between fork and spawn (what the plugin's block keeps at fork)."""
    from vllm.utils import system_utils

    source = inspect.getsource(system_utils._maybe_force_spawn)
    assert "cuda_is_initialized()" in source, "vLLM no longer decides by cuda_is_initialized: re-check the shield"
    assert "_maybe_force_spawn()" in inspect.getsource(system_utils.get_mp_context)


def test_the_facts_come_back_from_a_forked_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child runs the function this process holds (a bare fork: no import, so none waits on the import lock this
    module's own import holds) and sends its result back; an error there is raised here."""
    import os

    from clef_plugin.compat import cuda_probes

    monkeypatch.setattr(cuda_probes, "device_facts", lambda: {**FACTS, "pid": [os.getpid()]})
    facts = cuda_probes.facts_from_child()
    assert facts["names"] == FACTS["names"] and facts["pid"] != [os.getpid()]

    def fails() -> dict[str, list[Any]]:
        raise RuntimeError("CUDA error: no device")

    monkeypatch.setattr(cuda_probes, "device_facts", fails)
    with pytest.raises(RuntimeError, match="no device"):
        cuda_probes.facts_from_child()


def test_one_child_answers_the_imports_of_every_module_of_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each module of clef_plugin.compat imports vLLM inside the block: the facts are read in a child once."""
    from clef_plugin.compat import cuda_probes

    reads: list[int] = []

    def facts() -> dict[str, list[Any]]:
        reads.append(1)
        return FACTS

    monkeypatch.setattr(cuda_probes, "facts_from_child", facts)
    cuda_probes.facts_read_once.cache_clear()
    try:
        assert cuda_probes.facts_read_once() is cuda_probes.facts_read_once() is FACTS
    finally:
        cuda_probes.facts_read_once.cache_clear()
    assert len(reads) == 1
    assert (
        inspect.signature(cuda_probes.cuda_left_uninitialised).parameters["facts"].default
        is cuda_probes.facts_read_once
    )
