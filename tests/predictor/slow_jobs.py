"""Jobs for encode workers that tests submit directly (importable by a spawned worker)."""

from __future__ import annotations

import time
from typing import Any


def sleep_for(_tokenizer: Any, seconds: float) -> float:
    """Sleep ``seconds`` in the worker and return them: a job that takes as long as asked."""
    time.sleep(seconds)
    return seconds


def loaded_processors(_tokenizer: Any, release_dir: str, seconds: float) -> tuple[int, bool, bool]:
    """After ``seconds`` in the worker (so that jobs submitted together spread over the workers): its process id
    and whether it holds the release's image and video processors already (loading one takes seconds)."""
    import os

    from clef_head.media import release_image_processor, release_video_processor

    time.sleep(seconds)
    image, video = release_image_processor.cache_info(), release_video_processor.cache_info()
    return os.getpid(), image.currsize > 0, video.currsize > 0
