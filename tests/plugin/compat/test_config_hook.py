"""vLLM runs an architecture's config hook from ``MODELS_CONFIG_MAP`` (clef_plugin.compat.config_hook)."""

from __future__ import annotations

import inspect

import pytest

pytestmark = pytest.mark.vllm


def test_vllm_runs_the_hook_it_finds_for_the_architecture() -> None:
    from vllm.config.vllm import VllmConfig

    source = inspect.getsource(VllmConfig.try_verify_and_update_config)
    assert "MODELS_CONFIG_MAP.get(architecture" in source and ".verify_and_update_config(self)" in source


def test_qwen3_5s_hook_is_the_one_clefs_chains() -> None:
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from clef_plugin.compat.config_hook import QWEN3_5_CONFIG_HOOK

    assert MODELS_CONFIG_MAP["Qwen3_5ForConditionalGeneration"] is QWEN3_5_CONFIG_HOOK
    assert callable(QWEN3_5_CONFIG_HOOK.verify_and_update_config)


def test_an_installed_hook_is_found_for_its_architecture(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from clef_plugin.compat.config_hook import install_config_hook

    class Hook:
        pass

    monkeypatch.delitem(MODELS_CONFIG_MAP, "ClefTestArchitecture", raising=False)  # removed again after the test
    install_config_hook("ClefTestArchitecture", Hook)
    assert MODELS_CONFIG_MAP["ClefTestArchitecture"] is Hook
