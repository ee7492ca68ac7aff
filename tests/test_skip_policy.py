"""The suite's skip policy (tests/skip_policy.py): only a missing CUDA device or GPU may skip a test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLE = """
import pytest

def test_needs_cuda():
    pytest.skip("needs a CUDA device: CUDA graphs")

@pytest.mark.skipif(True, reason="needs a GPU")
def test_needs_gpu():
    pass

def test_missing_tool():
    pytest.skip("hadolint not installed")

def test_missing_package():
    pytest.importorskip("a_package_nobody_installed")

@pytest.mark.xfail(reason="known")
def test_known_failure():
    assert False
"""


def _run(tmp_path: Path, files: dict[str, str], *options: str) -> subprocess.CompletedProcess[str]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.skip_policy",
            "-p",
            "no:cacheprovider",
            "-rA",
            "-q",
            "--rootdir",
            str(tmp_path),
            *options,
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# The suite runs on two xdist workers (scripts/test.sh): a worker's skip must fail there too.
@pytest.mark.parametrize("options", [(), ("-n", "2")], ids=["one-process", "xdist"])
def test_skips_off_the_allow_list_fail(tmp_path: Path, options: tuple[str, ...]) -> None:
    done = _run(tmp_path, {"test_sample.py": SAMPLE}, *options)
    out = done.stdout
    assert done.returncode == 1, out
    assert "2 failed, 2 skipped, 1 xfailed" in out, out
    assert "SKIPPED [1] test_sample.py:5: needs a CUDA device" in out
    assert "SKIPPED [1] test_sample.py:7: needs a GPU" in out
    assert "FAILED test_sample.py::test_missing_tool" in out, out
    assert "FAILED test_sample.py::test_missing_package" in out, out
    assert "not on the allow-list" in out and "hadolint not installed" in out, out


def test_a_module_level_skip_fails(tmp_path: Path) -> None:
    done = _run(
        tmp_path,
        {
            "test_module.py": 'import pytest\npytest.importorskip("a_package_nobody_installed")\n'
            "def test_anything():\n    pass\n"
        },
    )
    assert done.returncode != 0 and "not on the allow-list" in done.stdout, done.stdout
    assert "a_package_nobody_installed" in done.stdout, done.stdout
