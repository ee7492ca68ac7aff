"""Run a Python module with a thread that samples its main thread's stack (BENCHMARKS.md, R33).

    python -m bench.stack_sampler --out stacks.txt --module predictor -- --model-dir DIR --engine vllm --vision ...

Every ``--interval`` seconds the sampler reads the main thread's frames and counts each stack; every
``--flush`` seconds (and at exit) it rewrites ``--out`` with one line per stack, most frequent first: the count, then
the frames from the outermost, ``file:function:line``, joined by ``;`` (the collapsed form flame-graph tools read).
The file is rewritten while the module runs, so a process that is killed still leaves its last counts. Only the
process started here is sampled: a child it forks has no sampler thread and writes nothing.

A sample needs the GIL: while the main thread runs native code that holds it, no sample is taken, so a long gap in
the counts against a wall-clock time in the module's log is itself a finding (native code holding the GIL).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import os
import runpy
import sys
import threading
import time
from pathlib import Path
from types import FrameType


def stack_of(frame: FrameType | None) -> str:
    """``frame``'s stack, outermost first, as ``file:function:line`` joined by ``;``."""
    frames = []
    while frame is not None:
        code = frame.f_code
        frames.append(f"{code.co_filename.split('site-packages/')[-1]}:{code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return ";".join(reversed(frames))


class Sampler:
    """Counts of the main thread's stacks, written to ``out``."""

    def __init__(self, out: Path, interval: float, flush: float) -> None:
        self.out = out
        self.interval = interval
        self.flush = flush
        self.counts: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        main = threading.main_thread().ident
        if main is None:
            raise RuntimeError("the main thread has not started")
        self.main = main
        self.pid = os.getpid()

    def write(self) -> None:
        """Rewrite ``out``; nothing in a forked child (the module's own processes: their counts are not kept)."""
        if os.getpid() != self.pid:
            return
        with self.lock:
            lines = [f"{count} {stack}\n" for stack, count in self.counts.most_common()]
        partial = self.out.with_name(self.out.name + ".partial")
        partial.write_text("".join(lines))
        os.replace(partial, self.out)

    def run(self) -> None:
        written = time.monotonic()
        while True:
            time.sleep(self.interval)
            frame = sys._current_frames().get(self.main)
            with self.lock:
                self.counts[stack_of(frame)] += 1
            if time.monotonic() - written >= self.flush:
                self.write()
                written = time.monotonic()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.stack_sampler", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the collapsed stacks' file")
    parser.add_argument("--module", required=True, help="the module to run as __main__")
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between samples")
    parser.add_argument("--flush", type=float, default=2.0, help="seconds between rewrites of --out")
    parser.add_argument("module_args", nargs="*", help="the module's arguments (after --)")
    args = parser.parse_args(argv)
    sampler = Sampler(args.out, args.interval, args.flush)
    threading.Thread(target=sampler.run, name="stack-sampler", daemon=True).start()
    atexit.register(sampler.write)
    sys.argv = [args.module, *args.module_args]
    runpy.run_module(args.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
