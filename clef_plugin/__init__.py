"""vLLM plugin: Qwen3.5 + Clef's joint schema head as a pooling model, and helpers to use it.

Importing this package does not import vLLM; :func:`register` (vLLM's ``vllm.general_plugins``
entry point) registers the architecture lazily, by a ``module:Class`` string.
"""

from clef_plugin.api import engine_kwargs, option_logits, pooling_params, score_requests
from clef_plugin.names import ARCHITECTURE, LAYOUT_KEY, MODEL_CLASS, POOLING_TASK

__all__ = [
    "ARCHITECTURE",
    "LAYOUT_KEY",
    "POOLING_TASK",
    "engine_kwargs",
    "option_logits",
    "pooling_params",
    "register",
    "score_requests",
]


def register() -> None:
    """Register the architecture and its engine-config rules with vLLM (idempotent)."""
    from vllm import ModelRegistry

    from clef_plugin.compat import check_vllm_version, install_config_hook
    from clef_plugin.engine_config import ClefEngineConfig

    check_vllm_version()
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
    install_config_hook(ARCHITECTURE, ClefEngineConfig)
