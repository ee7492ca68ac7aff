"""The per-architecture config hook vLLM runs when it builds an engine's config."""

from __future__ import annotations

from clef_plugin.compat.cuda_probes import cuda_left_uninitialised

with cuda_left_uninitialised():
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP, Qwen3_5ForConditionalGenerationConfig


def install_config_hook(architecture: str, hook: type) -> None:
    """Run ``hook.verify_and_update_config(vllm_config)`` for engines of ``architecture``.

    vLLM looks up per-architecture config hooks in ``MODELS_CONFIG_MAP`` when it builds an
    engine's config (before the scheduler and KV cache exist). The hook must chain Qwen3.5's own
    hook (:data:`QWEN3_5_CONFIG_HOOK`), which sets the Gated DeltaNet state dtype.
    """
    MODELS_CONFIG_MAP[architecture] = hook


QWEN3_5_CONFIG_HOOK = Qwen3_5ForConditionalGenerationConfig
"""vLLM's config hook for Qwen3.5 (state dtypes of the linear-attention layers)."""
