"""Jobs for encode workers that tests submit directly (importable by a spawned worker)."""

from __future__ import annotations

import time
from typing import Any


def sleep_for(_tokenizer: Any, seconds: float) -> float:
    """Sleep ``seconds`` in the worker and return them: a job that takes as long as asked."""
    time.sleep(seconds)
    return seconds
