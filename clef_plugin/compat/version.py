"""The vLLM releases the plugin is tested with, checked when it registers."""

from __future__ import annotations

import logging

import vllm
from packaging.specifiers import SpecifierSet
from packaging.version import Version

logger = logging.getLogger(__name__)

SUPPORTED_VLLM = SpecifierSet(">=0.26.0,<0.33")
"""vLLM releases the plugin is tested with (keep in step with the ``vllm`` extra in pyproject.toml)."""


def check_vllm_version() -> None:
    """Warn once when the installed vLLM is outside :data:`SUPPORTED_VLLM`."""
    installed = Version(vllm.__version__)
    if Version(installed.base_version) not in SUPPORTED_VLLM:
        logger.warning("clef_plugin is tested with vLLM %s; vLLM %s is installed", SUPPORTED_VLLM, vllm.__version__)
