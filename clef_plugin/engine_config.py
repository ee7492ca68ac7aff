"""Engine-config rules for the plugin's architecture, applied when vLLM builds an engine's config."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from clef_plugin.compat.config_hook import QWEN3_5_CONFIG_HOOK

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger(__name__)

PREFIX_CACHING_OFF = (
    "prefix caching is turned off for Clef: the joint schema head reads every prompt token's "
    "hidden state, so cached prefixes cannot be reused (and would only cost time)"
)


class ClefEngineConfig(QWEN3_5_CONFIG_HOOK):
    """Qwen3.5's own config rules, plus: prefix caching is always off."""

    @staticmethod
    def verify_and_update_config(vllm_config: VllmConfig) -> None:
        """Apply Qwen3.5's rules, then force ``enable_prefix_caching`` off (with a warning)."""
        QWEN3_5_CONFIG_HOOK.verify_and_update_config(vllm_config)
        if vllm_config.cache_config.enable_prefix_caching:
            logger.warning(PREFIX_CACHING_OFF)
            vllm_config.cache_config.enable_prefix_caching = False
