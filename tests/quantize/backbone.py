"""Reads shared by the quantization tests."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from clef_head.checkpoint import HEAD_WEIGHTS_FILE


def backbone_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """A release's backbone tensors by name (every safetensors file at its root but the head's)."""
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        if path.name == HEAD_WEIGHTS_FILE:
            continue
        with safe_open(str(path), framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})  # noqa: SIM118 (not iterable)
    return tensors
