"""The supported vLLM releases (clef_plugin.compat.version): the same as the package's ``vllm`` extra, and a warning
outside them."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[3]


def test_supported_releases_are_the_vllm_extras() -> None:
    from clef_plugin.compat.version import SUPPORTED_VLLM

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    vllm = next(Requirement(line) for line in extras if Requirement(line).name == "vllm")
    assert vllm.specifier == SUPPORTED_VLLM


def test_a_release_outside_them_is_warned_about(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import vllm

    from clef_plugin.compat.version import check_vllm_version

    with caplog.at_level(logging.WARNING, logger="clef_plugin.compat.version"):
        check_vllm_version()  # the installed one
        assert not caplog.records, caplog.text
        monkeypatch.setattr(vllm, "__version__", "0.33.0rc1.dev5+cpu")
        check_vllm_version()
    assert "vLLM 0.33.0rc1.dev5+cpu is installed" in caplog.text
