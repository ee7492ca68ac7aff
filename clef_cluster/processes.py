"""Start the cluster's processes detached, record them, and stop exactly those.

A process is recorded with its pid and its start time (``/proc/<pid>/stat``), so ``stop`` never signals a
process that merely reuses a recorded pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Recorded:
    """A started process: its name, pid, start time (clock ticks after boot) and log file."""

    name: str
    pid: int
    started: int
    log: str

    def as_dict(self) -> dict[str, Any]:
        """The JSON form kept in the cluster's state file."""
        return asdict(self)

    def alive(self) -> bool:
        """Whether this very process still runs (not a later one with the same pid, not a zombie)."""
        stat = _stat(self.pid)
        return stat is not None and stat[1] != "Z" and int(stat[19]) == self.started


def start(name: str, args: list[str], folder: Path, env: dict[str, str] | None = None) -> Recorded:
    """Start ``args`` in its own session, output to ``folder/<name>.log``."""
    log = folder / f"{name}.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=folder,
        )
    stat = _stat(process.pid)
    return Recorded(name, process.pid, int(stat[19]) if stat else 0, str(log))


def stop(process: Recorded, grace: float = 10.0) -> None:
    """SIGTERM the process, SIGKILL it after ``grace`` seconds; nothing if it is already gone."""
    if not process.alive():
        return
    os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while process.alive() and time.monotonic() < deadline:
        _reap(process.pid)
        time.sleep(0.1)
    if process.alive():
        os.kill(process.pid, signal.SIGKILL)
        while process.alive():
            _reap(process.pid)
            time.sleep(0.05)
    _reap(process.pid)


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our child (so it does not linger as a zombie)."""
    with contextlib.suppress(ChildProcessError):  # not our child: nothing to collect
        os.waitpid(pid, os.WNOHANG)


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (index 0 is the state), or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()
