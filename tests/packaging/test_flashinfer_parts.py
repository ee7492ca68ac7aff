"""scripts/flashinfer_parts.sh install: each part unpacks into the site folder once, in any number of runs."""

from __future__ import annotations

import io
import lzma
import os
import subprocess
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "flashinfer_parts.sh"


def _part(path: Path, files: dict[str, bytes]) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    path.write_bytes(lzma.compress(buffer.getvalue()))


def _install(parts: Path, site: Path) -> str:
    result = subprocess.run(
        ["bash", str(SCRIPT), "install", str(parts)],
        env={**os.environ, "SITE": str(site)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return result.stdout.strip()


def test_parts_unpack_once_each_as_they_arrive(tmp_path: Path) -> None:
    parts, site = tmp_path / "parts", tmp_path / "site"
    parts.mkdir()
    _part(parts / "fi-ir.tar.xz", {"nvidia_cutlass_dsl/dsl_packages/cutlass/ir.so": b"ir"})
    assert _install(parts, site) == f"{site}/nvidia_cutlass_dsl/dsl_packages"
    assert (site / "nvidia_cutlass_dsl/dsl_packages/cutlass/ir.so").read_bytes() == b"ir"

    (site / "nvidia_cutlass_dsl/dsl_packages/cutlass/ir.so").write_bytes(b"kept")  # an unpacked part is not redone
    _part(parts / "fi-small.tar.xz", {"flashinfer/__init__.py": b"# flashinfer"})
    _install(parts, site)
    assert (site / "nvidia_cutlass_dsl/dsl_packages/cutlass/ir.so").read_bytes() == b"kept"
    assert (site / "flashinfer/__init__.py").read_bytes() == b"# flashinfer"


def test_unknown_verb_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(SCRIPT), "unpack", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "usage" in result.stderr
