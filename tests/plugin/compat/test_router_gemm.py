"""vLLM's router-GEMM warm-up is skipped for Clef's model only (clef_plugin.compat.router_gemm).

vLLM 0.26 (the GPU release) compiles CuTe-DSL GEMMs for DeepSeek-sized MoE routers at every engine start on SM90,
whatever the model; the plugin replaces that function in its module while a Clef model is alive in the process.
The installed CPU vLLM (0.32) reads the model's own routers instead, so these tests stand its function in with one
of 0.26's shape where they check the replacement.
"""

from __future__ import annotations

import gc
import inspect
import weakref

import pytest
import torch

pytestmark = pytest.mark.vllm


def test_vllm_still_calls_its_router_gemm_warmup_by_its_module_name() -> None:
    """The symbol the plugin replaces exists, and ``kernel_warmup`` looks it up in its module at call time."""
    from vllm.model_executor.warmup import kernel_warmup

    from clef_plugin.compat.router_gemm import ROUTER_GEMM_WARMUP

    assert callable(getattr(kernel_warmup, ROUTER_GEMM_WARMUP, None)), (
        f"vLLM no longer has kernel_warmup.{ROUTER_GEMM_WARMUP}: re-check clef_plugin/compat/router_gemm.py"
    )
    assert f"{ROUTER_GEMM_WARMUP}(" in inspect.getsource(kernel_warmup.kernel_warmup), (
        f"kernel_warmup() no longer calls {ROUTER_GEMM_WARMUP}: re-check clef_plugin/compat/router_gemm.py"
    )


@pytest.fixture
def argless_warmup(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """vLLM 0.26's shape of the warm-up (no arguments) in place of the installed one; its calls are recorded. No Clef
    model of an earlier test in this process counts (the plugin's set of them starts empty)."""
    from vllm.model_executor.warmup import kernel_warmup

    from clef_plugin.compat import router_gemm

    calls: list[str] = []
    monkeypatch.setattr(router_gemm, "_ROUTERLESS_MODELS", weakref.WeakSet())

    def warmup() -> None:
        calls.append("warmed up")

    monkeypatch.setattr(kernel_warmup, router_gemm.ROUTER_GEMM_WARMUP, warmup)
    return calls


def run_vllm_warmup() -> None:
    """What ``kernel_warmup(worker)`` does: call the function by its name in its module."""
    from vllm.model_executor.warmup import kernel_warmup

    from clef_plugin.compat.router_gemm import ROUTER_GEMM_WARMUP

    getattr(kernel_warmup, ROUTER_GEMM_WARMUP)()


def test_the_warmup_runs_for_other_models(argless_warmup: list[str]) -> None:
    run_vllm_warmup()
    assert argless_warmup == ["warmed up"]


def test_the_warmup_is_skipped_while_a_clef_model_is_alive(argless_warmup: list[str]) -> None:
    from clef_plugin.compat.router_gemm import skip_router_gemm_warmup

    clef_model = torch.nn.Linear(2, 2)  # stands in for ClefQwen3_5ForJointSchema, which registers itself
    skip_router_gemm_warmup(clef_model)
    skip_router_gemm_warmup(clef_model)  # a second engine in the process: still one replacement
    run_vllm_warmup()
    assert argless_warmup == []

    del clef_model  # the engine is gone; a stock model's engine built next in this process warms up as before
    gc.collect()
    run_vllm_warmup()
    assert argless_warmup == ["warmed up"]


def test_the_installed_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM >= 0.32 warms up only the router shapes it finds in the model (none in Clef's): its function is left as it
    is. vLLM 0.26's (no arguments) is replaced."""
    from vllm.model_executor.warmup import kernel_warmup

    from clef_plugin.compat.router_gemm import (
        ROUTER_GEMM_WARMUP,
        RouterGemmWarmupUnlessRouterless,
        skip_router_gemm_warmup,
    )

    installed = getattr(kernel_warmup, ROUTER_GEMM_WARMUP)
    monkeypatch.setattr(kernel_warmup, ROUTER_GEMM_WARMUP, installed)  # put back after the test
    clef_model = torch.nn.Linear(2, 2)
    skip_router_gemm_warmup(clef_model)
    now = getattr(kernel_warmup, ROUTER_GEMM_WARMUP)
    if inspect.signature(installed).parameters:
        assert now is installed
    else:
        assert isinstance(now, RouterGemmWarmupUnlessRouterless) and now.original is installed


def test_the_clef_model_registers_itself() -> None:
    """ClefQwen3_5ForJointSchema asks for the skip when it is built (in the worker process, before vLLM's warm-up)."""
    from clef_plugin.model import ClefQwen3_5ForJointSchema

    assert "skip_router_gemm_warmup(self)" in inspect.getsource(ClefQwen3_5ForJointSchema.__init__)
