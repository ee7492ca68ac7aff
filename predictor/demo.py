"""The embedded demo release: a tiny RANDOM Clef release built once and cached (no download)."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from clef_head.checkpoint import is_random_release
import clef_tools.tiny as tiny

log = logging.getLogger(__name__)

DEMO_SEED = 0
RANDOM_WARNING = (
    "RANDOM WEIGHTS: this release was generated with random weights (the demo or a test/benchmark build), "
    "not a trained Clef model; its answers carry no meaning. Pass --model-dir to serve a real release."
)


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/clef-serving`` (``~/.cache/clef-serving`` by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "clef-serving"


def _builder_version() -> str:
    """A digest of the builder's source: a changed builder gives a new cache folder."""
    return hashlib.sha256(Path(tiny.__file__).read_bytes()).hexdigest()[:12]


def demo_release(cache_dir: Path | None = None) -> Path:
    """The cached demo release, built on first use (atomically: a half-written one is never reused)."""
    root = cache_dir or default_cache_dir()
    path = root / f"demo-release-{_builder_version()}"
    if is_random_release(path) and (path / "config.json").is_file():
        log.info("reusing the demo release in %s", path)
        return path
    root.mkdir(parents=True, exist_ok=True)
    log.info("building the tiny random demo release in %s (once)", path)
    staging = Path(tempfile.mkdtemp(prefix="demo-release-", dir=root))
    try:
        tiny.build_tiny_release(staging, seed=DEMO_SEED, layout="release")
        try:
            staging.rename(path)
        except OSError:  # another process finished first
            if not is_random_release(path):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path
