"""Running a benchmark script as its users do: ``python -m bench.NAME ...`` from the repository's root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(module: str, *args: str, timeout_s: int = 300) -> str:
    """The standard output of ``python -m bench.<module> args``, which must exit 0 (its standard error's end if not)."""
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
