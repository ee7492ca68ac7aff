"""The --work folder: log lines, whole-file JSON writes, the encoded records and saved logits."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def log(message: str) -> None:
    print(f"[gpu_benchmark {time.strftime('%H:%M:%S')}] {message}", flush=True)


def write_json(path: Path, data: Any) -> None:
    """Write ``path`` whole or not at all: invocations sharing a ``--work`` folder (one per GPU) read
    ``releases.json`` and the records while another may be writing them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(data, indent=2, default=str) + "\n")
    partial.replace(path)


def load_encoded(work: Path) -> tuple[list[list[int]], list[Any]]:
    from clef_head.layout import RecordLayout

    data = json.loads((work / "encoded.json").read_text())
    return [item["input_ids"] for item in data], [RecordLayout.from_wire(item["layout"]) for item in data]


LONE = "lone"
"""The logits kind of a case's lone records."""


def group_kind(size: int) -> str:
    """The logits kind of a case's records sent ``size`` at a time."""
    return f"groups-of-{size}"


def logits_file(work: Path, case: str, kind: str = "") -> Path:
    """Where a case's option logits are kept: its batched passes', or those of its records sent as ``kind`` says
    (:data:`LONE`, :func:`group_kind`)."""
    return work / f"{kind + '-' if kind else ''}logits-{case}.pt"


def logits_kinds(work: Path) -> list[str]:
    """The kinds of logits kept in ``work``: the batched passes' (``""``) first."""
    kinds = {path.name.split("logits-", 1)[0].removesuffix("-") for path in work.glob("*logits-*.pt")}
    return sorted(kinds, key=lambda kind: (kind != "", kind))


def save_logits(work: Path, case: str, logits: list[Any], kind: str = "") -> None:
    import torch

    torch.save([value.float().cpu() for value in logits], logits_file(work, case, kind))
