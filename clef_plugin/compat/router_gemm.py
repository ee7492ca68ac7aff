"""vLLM 0.26's router-GEMM warm-up, skipped for models without a MoE router."""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Callable

import torch
import vllm

logger = logging.getLogger(__name__)

ROUTER_GEMM_WARMUP = "_warmup_ll_bf16_router_gemm"
"""vLLM's start-up warm-up of its CuTe-DSL BF16 GEMMs for MoE routers, a function of
``vllm.model_executor.warmup.kernel_warmup`` that ``kernel_warmup(worker)`` calls on every engine start on SM90 or
newer. vLLM 0.26's takes no arguments and compiles the GEMMs of fixed DeepSeek-sized router shapes whatever the model
(12 to 15 s of every start on an H200, kept in memory only); vLLM 0.32's takes the model and warms up only the shapes
of its own routers (none for Clef's dense backbone)."""

_ROUTERLESS_MODELS: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
"""The models without a MoE router built in this process and still alive (vLLM builds one per worker process)."""


class RouterGemmWarmupUnlessRouterless:
    """vLLM 0.26's router-GEMM warm-up, skipped while a model without MoE routers is alive in this process."""

    def __init__(self, original: Callable[[], None]) -> None:
        self.original = original

    def __call__(self) -> None:
        if _ROUTERLESS_MODELS:
            names = sorted({type(model).__name__ for model in _ROUTERLESS_MODELS})
            logger.info("vLLM's ll_bf16 router GEMM warm-up skipped: %s has no MoE router", ", ".join(names))
            return
        self.original()


def skip_router_gemm_warmup(model: torch.nn.Module) -> None:
    """Have vLLM skip its router-GEMM warm-up (:data:`ROUTER_GEMM_WARMUP`) for ``model``, which has no MoE router.

    Where vLLM's warm-up takes the model, it finds no router in it and skips by itself: nothing is changed. Where it
    takes no arguments (vLLM 0.26), it is replaced, in its module, by :class:`RouterGemmWarmupUnlessRouterless`, which
    skips it while ``model`` is alive in this process (``kernel_warmup`` runs in the worker process that built the
    model, after building it); an engine of another model built later in the same process, once ``model`` is gone,
    gets vLLM's warm-up as before. vLLM offers no engine argument or variable for it (its ``kernel_config`` switches
    cover FlashInfer's autotuning and the registered CuTe-DSL compile units, not this warm-up).
    """
    from vllm.model_executor.warmup import kernel_warmup

    warmup = getattr(kernel_warmup, ROUTER_GEMM_WARMUP, None)
    if warmup is None:
        logger.warning(
            "vLLM %s has no %s: its router-GEMM warm-up is left to vLLM", vllm.__version__, ROUTER_GEMM_WARMUP
        )
        return
    if isinstance(warmup, RouterGemmWarmupUnlessRouterless):
        _ROUTERLESS_MODELS.add(model)
        return
    if inspect.signature(warmup).parameters:  # it reads the model's own router shapes
        return
    _ROUTERLESS_MODELS.add(model)
    setattr(kernel_warmup, ROUTER_GEMM_WARMUP, RouterGemmWarmupUnlessRouterless(warmup))
