"""Head discovery in both release layouts, strict loading and clear errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from clef_head.checkpoint import RANDOM_MARKER, CheckpointError, find_head_files, is_random_release, load_head
from clef_head.request import parse_request
from clef_tools.sample_requests import make_requests
from predictor.engines.reference import TransformersScorer


def _head_only(src: Path, dst: Path, subfolder: str = "") -> Path:
    (dst / subfolder).mkdir(parents=True, exist_ok=True)
    files = find_head_files(src)
    shutil.copy(files.config, dst / subfolder / files.config.name)
    shutil.copy(files.weights, dst / subfolder / files.weights.name)
    return dst


def test_finds_head_at_root_and_in_subfolder(tiny_release: Path, toy_release_fp8_layout: Path) -> None:
    assert find_head_files(tiny_release).weights == tiny_release / "joint_head.safetensors"
    assert (
        find_head_files(toy_release_fp8_layout).weights
        == toy_release_fp8_layout / "clef_head" / "joint_head.safetensors"
    )


def test_both_layouts_load_strictly(tiny_release: Path, toy_release_fp8_layout: Path) -> None:
    for release in (tiny_release, toy_release_fp8_layout):
        head = load_head(release)
        state = load_file(str(find_head_files(release).weights))
        assert set(state) == set(head.state_dict())
        assert head.residual_gate.item() != 0.0 and head.joint_logit_scale.item() != 0.0


def test_release_head_loads_into_original_module(tiny_release: Path, reference) -> None:
    config = json.loads((tiny_release / "joint_head_config.json").read_text())
    original = reference.JointSchemaHead(**config)
    original.load_state_dict(load_file(str(tiny_release / "joint_head.safetensors")), strict=True)
    ours = load_head(tiny_release)
    assert {k: v.shape for k, v in original.state_dict().items()} == {k: v.shape for k, v in ours.state_dict().items()}


def test_missing_head_names_the_files(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="joint_head_config.json and joint_head.safetensors"):
        find_head_files(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        find_head_files(tmp_path / "nope")


def test_half_a_head_names_the_missing_file(tiny_release: Path, tmp_path: Path) -> None:
    _head_only(tiny_release, tmp_path, "clef_head")
    (tmp_path / "clef_head" / "joint_head.safetensors").unlink()
    with pytest.raises(CheckpointError, match="joint_head.safetensors is missing"):
        find_head_files(tmp_path)


def test_mismatched_key_is_named(tiny_release: Path, tmp_path: Path) -> None:
    _head_only(tiny_release, tmp_path)
    state = load_file(str(tmp_path / "joint_head.safetensors"))
    state["extra.weight"] = state.pop("residual_gate")
    save_file(state, str(tmp_path / "joint_head.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing \['residual_gate'\].*unexpected \['extra.weight'\]"):
        load_head(tmp_path)


def test_mismatched_shape_is_named(tiny_release: Path, tmp_path: Path) -> None:
    _head_only(tiny_release, tmp_path)
    config = json.loads((tmp_path / "joint_head_config.json").read_text())
    config["feedforward"] *= 2
    (tmp_path / "joint_head_config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match=r"evidence_layers.0.feedforward.0.bias has shape \(128,\), config expects \(256,\)"
    ):
        load_head(tmp_path)


def test_bad_config_keys_are_named(tiny_release: Path, tmp_path: Path) -> None:
    _head_only(tiny_release, tmp_path)
    config = json.loads((tmp_path / "joint_head_config.json").read_text())
    del config["width"]
    config["colour"] = "red"
    (tmp_path / "joint_head_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unknown key"):
        load_head(tmp_path)
    (tmp_path / "joint_head_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read head config"):
        load_head(tmp_path)


def test_tiny_command_line_builds_a_loadable_release(tmp_path: Path) -> None:
    """The command line with its options; the session's ``tiny_release`` is the default vocabulary's build."""
    out = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "clef_tools.tiny", str(out), "--seed", "5", "--layout", "fp8", "--vocabulary", "toy"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "tiny random release" in result.stdout
    assert is_random_release(out) and (out / RANDOM_MARKER).read_text().startswith("Random weights")
    scorer = TransformersScorer(out, dtype=torch.float32)
    bodies = make_requests(seed=2, count=3)
    answers = scorer.answer([parse_request(body) for body in bodies])
    for body, answer in zip(bodies, answers, strict=True):
        assert answer["answers"].keys() == body["questions"].keys()
        assert answer["usage"]["output_tokens"] == 0 and answer["usage"]["input_tokens"] > 0


def test_tiny_release_is_deterministic_per_seed(tmp_path: Path) -> None:
    from clef_tools.tiny import build_tiny_release

    # Toy vocabulary for speed: three releases with Qwen3.5's 248,320-row embedding take minutes on a
    # 2-core machine, and the weights' determinism does not depend on the vocabulary (the real
    # tokenizer.json is one cached file, copied as it is).
    first = build_tiny_release(tmp_path / "a", seed=3, vocabulary="toy").path
    second = build_tiny_release(tmp_path / "b", seed=3, vocabulary="toy").path
    other = build_tiny_release(tmp_path / "c", seed=4, vocabulary="toy").path
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert (first / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
