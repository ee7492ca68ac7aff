"""vLLM plugin: Qwen3.5 + Clef's joint schema head as a pooling model, and helpers to use it.

Importing this package does not import vLLM; :func:`register` (vLLM's ``vllm.general_plugins``
entry point) registers the architecture lazily, by a ``module:Class`` string.

The FP8 model card's client names work too: ``ARCHITECTURE``, ``TASK`` and ``schema_layout`` (its
layout under ``PoolingParams.extra_kwargs["clef_questions"]``), and its architecture name
``ClefFlashForDecision`` is registered as well, so its offline snippet runs with only its import
line changed (``from clef_plugin import ARCHITECTURE, TASK, schema_layout``).
"""

import logging

from clef_plugin.api import engine_kwargs, engine_prompt, option_logits, pooling_params, score_requests
from clef_plugin.card import schema_layout
from clef_plugin.names import ARCHITECTURE, CARD_ARCHITECTURE, LAYOUT_KEY, MODEL_CLASS, POOLING_TASK

TASK: str = POOLING_TASK
"""The pooling task to ask for (the card's client name for it)."""

__all__ = [
    "ARCHITECTURE",
    "CARD_ARCHITECTURE",
    "LAYOUT_KEY",
    "POOLING_TASK",
    "TASK",
    "engine_kwargs",
    "engine_prompt",
    "option_logits",
    "pooling_params",
    "register",
    "schema_layout",
    "score_requests",
]


ENGINE_SIDE_LOGGERS = ("clef_plugin", "clef_head")
"""The packages that log from inside vLLM's engine processes (the model, its head and their CUDA graphs)."""


def log_where_vllm_logs() -> None:
    """Send the engine-side packages' records to vLLM's own handlers, at vLLM's level, when they would reach none.

    vLLM configures only its ``vllm`` logger, so in an offline ``LLM`` the plugin's records (which graphs were
    captured, which settings were overridden) reached no handler. Where the application configured logging itself
    (a root handler, or these loggers' own: the predictor gives them KServe's format), nothing changes. Like vLLM's
    own logger, a logger given vLLM's handlers stops propagating, so a root handler added later (a library's
    ``basicConfig`` in the engine process) does not print each record a second time.
    """
    vllm_logger = logging.getLogger("vllm")
    if not vllm_logger.handlers or logging.getLogger().handlers:
        return
    for name in ENGINE_SIDE_LOGGERS:
        ours = logging.getLogger(name)
        if not ours.handlers:
            ours.handlers = list(vllm_logger.handlers)
            ours.setLevel(vllm_logger.level)
            ours.propagate = vllm_logger.propagate


def register() -> None:
    """Register the architecture (under our name and the card's) and its engine-config rules with vLLM (idempotent),
    and log where vLLM logs (:func:`log_where_vllm_logs`)."""
    from vllm import ModelRegistry

    from clef_plugin.compat.config_hook import install_config_hook
    from clef_plugin.compat.version import check_vllm_version
    from clef_plugin.engine_config import ClefEngineConfig

    log_where_vllm_logs()
    check_vllm_version()
    for name in (ARCHITECTURE, CARD_ARCHITECTURE):
        if name not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(name, MODEL_CLASS)
        install_config_hook(name, ClefEngineConfig)
