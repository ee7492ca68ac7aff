"""Shared pieces: loopback-only URLs, valid requests, process memory and latency percentiles."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

MODEL_NAME = "clef-flash"


def loopback_url(url: str) -> str:
    """``url`` unchanged if its host is a loopback address; these scripts never attack another machine."""
    host = urlsplit(url).hostname or ""
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except socket.gaierror as exc:
        raise SystemExit(f"cannot resolve {host!r}: {exc}") from None
    if not addresses or not all(ipaddress.ip_address(address.split("%")[0]).is_loopback for address in addresses):
        raise SystemExit(f"{url} is not a loopback address: these scripts only run against this machine")
    return url.rstrip("/")


def valid_request(index: int, model: str = MODEL_NAME) -> dict[str, Any]:
    """A valid System One request that varies with ``index`` (state, question ids and option counts)."""
    labels = {f"label_{j}": (f"meaning {j}" if j % 2 else None) for j in range(2 + index % 4)}
    return {
        "model": model,
        "state": {"ticket": f"customer {index} writes about case {index * 7}", "lines": ["again"] * (index % 9)},
        "questions": {
            f"urgent_{index % 5}": {"type": "noul", "instructions": "Does this need a reply today?"},
            "topic": {"type": "choice", "criteria": labels},
            "tone": {"type": "score", "criteria": ["calm", "annoyed", "angry"][: 2 + index % 2]},
        },
    }


def rss_bytes(pid: int, with_children: bool = True) -> int:
    """Resident memory of ``pid`` (and, by default, of its child processes), from /proc."""
    total = _rss_of(pid)
    if with_children:
        for child in _children(pid):
            total += _rss_of(child)
    return total


def _rss_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        for task in Path(f"/proc/{parent}/task").glob("*") if Path(f"/proc/{parent}/task").exists() else ():
            try:
                kids = [int(kid) for kid in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            pending += kids
    return found


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, 0.0 for none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def mib(value: int) -> float:
    """Bytes as MiB, rounded to 0.1."""
    return round(value / (1 << 20), 1)


def process_exists(pid: int) -> bool:
    """Whether ``pid`` is alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
