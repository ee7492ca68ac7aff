"""Find and load a release's joint schema head.

Two layouts exist: Cloudflare's release puts ``joint_head_config.json`` and
``joint_head.safetensors`` at the model directory's root; the FP8 repository layout puts them in a
``clef_head/`` subfolder (the root then holds the quantized backbone).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from clef_head.head import HeadConfig, JointSchemaHead

HEAD_CONFIG_FILE = "joint_head_config.json"
HEAD_WEIGHTS_FILE = "joint_head.safetensors"
HEAD_SUBFOLDER = "clef_head"
# Releases generated with random weights (demo, tests, benchmarks) carry this file; servers warn loudly.
RANDOM_MARKER = "RANDOM_WEIGHTS.txt"


class CheckpointError(ValueError):
    """A head that cannot be found or does not match its config."""


@dataclass(frozen=True)
class HeadFiles:
    """Paths of a head's config and weights."""

    config: Path
    weights: Path


def find_head_files(model_dir: str | Path) -> HeadFiles:
    """Locate the head in ``model_dir/clef_head/`` or at ``model_dir``'s root (first found wins)."""
    root = Path(model_dir)
    if not root.is_dir():
        raise CheckpointError(f"model directory {root} does not exist")
    for folder in (root / HEAD_SUBFOLDER, root):
        config, weights = folder / HEAD_CONFIG_FILE, folder / HEAD_WEIGHTS_FILE
        if config.is_file() and weights.is_file():
            return HeadFiles(config=config, weights=weights)
        if config.is_file() != weights.is_file():
            missing = weights if config.is_file() else config
            raise CheckpointError(f"incomplete head in {folder}: {missing.name} is missing")
    raise CheckpointError(
        f"no joint schema head in {root}: expected {HEAD_CONFIG_FILE} and {HEAD_WEIGHTS_FILE} "
        f"at the root or in {HEAD_SUBFOLDER}/"
    )


def read_head_config(path: Path) -> HeadConfig:
    """Parse ``joint_head_config.json``, naming the file and key on any problem."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read head config: {exc}") from None
    fields = HeadConfig.__dataclass_fields__
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise CheckpointError(f"{path}: unknown key(s) {', '.join(unknown)}")
    missing = sorted(name for name, f in fields.items() if name not in data and name != "dropout")
    if missing:
        raise CheckpointError(f"{path}: missing key(s) {', '.join(missing)}")
    return HeadConfig(**data)


def load_head(
    model_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> JointSchemaHead:
    """Build the head from its config and load its weights with ``strict=True``."""
    files = find_head_files(model_dir)
    head = JointSchemaHead.from_config(read_head_config(files.config))
    state = load_file(str(files.weights))
    expected = head.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{files.weights}: keys do not match {files.config.name}: "
            f"missing {missing[:5]}{'…' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'…' if len(unexpected) > 5 else ''}"
        )
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            raise CheckpointError(
                f"{files.weights}: {key} has shape {tuple(tensor.shape)}, config expects {tuple(expected[key].shape)}"
            )
    head.load_state_dict(state, strict=True)
    return head.to(device=device, dtype=dtype).eval()


def is_random_release(model_dir: str | Path) -> bool:
    """True when ``model_dir`` carries the random-weights marker."""
    return (Path(model_dir) / RANDOM_MARKER).is_file()
