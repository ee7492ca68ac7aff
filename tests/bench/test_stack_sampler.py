"""bench.stack_sampler: the module runs as __main__ with its arguments, and the stacks it spent its time in are
counted, most frequent first, in the collapsed form."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BUSY_MODULE = """
import os, sys, time

def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(100))

if __name__ == "__main__":
    print("argv", sys.argv[1:])
    if os.fork() == 0:  # a child that outlives the module and exits through atexit must not rewrite the counts
        time.sleep(float(sys.argv[1]) + 0.5)
        sys.exit(0)
    spin(float(sys.argv[1]))
"""


def test_the_busy_function_leads_the_counts_and_the_arguments_pass_through(tmp_path: Path) -> None:
    (tmp_path / "busy_module.py").write_text(BUSY_MODULE)
    out = tmp_path / "stacks.txt"
    done = subprocess.run(
        [sys.executable, "-m", "bench.stack_sampler", "--out", str(out), "--module", "busy_module",
         "--interval", "0.005", "--flush", "0.1", "--", "1.0", "--flag"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": os.pathsep.join((str(tmp_path), str(REPO)))},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "argv ['1.0', '--flag']" in done.stdout
    lines = out.read_text().splitlines()
    counts = [int(line.split(" ", 1)[0]) for line in lines]
    assert counts == sorted(counts, reverse=True)
    spinning = sum(count for count, line in zip(counts, lines, strict=True) if "busy_module.py:spin:" in line)
    assert spinning >= 0.8 * sum(counts), lines[:3]
    frames = lines[0].split(" ", 1)[1].split(";")
    assert "busy_module.py:<module>:" in frames[-2] and "busy_module.py:spin:" in frames[-1], frames
