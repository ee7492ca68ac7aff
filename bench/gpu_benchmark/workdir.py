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


def logits_file(work: Path, case: str, *, lone: bool = False) -> Path:
    """Where a case's option logits are kept: its batched passes', or (``lone``) its lone records'."""
    return work / f"{'lone-' if lone else ''}logits-{case}.pt"


def save_logits(work: Path, case: str, logits: list[Any], *, lone: bool = False) -> None:
    import torch

    torch.save([value.float().cpu() for value in logits], logits_file(work, case, lone=lone))
