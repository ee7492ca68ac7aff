"""OCI image archives: an OCI image layout in a tar file (``oci-layout``, ``index.json``, ``blobs/sha256/...``) with
one uncompressed layer, reproducible (fixed times and owners), that names itself through the
``io.containerd.image.name`` annotation, so ``ctr images import`` stores it under that reference.

:func:`write_archive` writes one for any layer (the product images of :mod:`clef_cluster.images`); a
:class:`ScratchImage` is one static binary FROM scratch (the node's sandbox (pause) image and its test workload).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def write_archive(target: Path, reference: str, config: dict[str, Any], layer: Path, mtime: int = 0) -> Path:
    """Write the image ``reference`` (``repository:tag``) of ``config`` (the image configuration without its
    ``rootfs``) over the one uncompressed ``layer`` to ``target`` (replaced atomically); members dated ``mtime``."""
    layer_digest = f"sha256:{file_sha256(layer)}"
    config_blob = _json({**config, "rootfs": {"type": "layers", "diff_ids": [layer_digest]}})
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": _descriptor(CONFIG, config_blob),
            "layers": [{"mediaType": LAYER, "digest": layer_digest, "size": layer.stat().st_size}],
        }
    )
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                **_descriptor(MANIFEST, manifest),
                "annotations": {
                    "io.containerd.image.name": reference,
                    "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[1],
                },
            }
        ],
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
        _add(archive, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}), mtime)
        _add(archive, "index.json", _json(index), mtime)
        for blob in (config_blob, manifest):
            _add(archive, _blob_name(_digest(blob)), blob, mtime)
        with layer.open("rb") as stream:
            _add(archive, _blob_name(layer_digest), stream, mtime, layer.stat().st_size)
    partial.replace(target)
    return target


@dataclass(frozen=True)
class ScratchImage:
    """An image holding ``binary`` at ``/<its name>``, run as ``entrypoint`` by ``user``."""

    reference: str
    binary: Path
    entrypoint: tuple[str, ...]
    user: str = "65534:65534"

    def write(self, archive: Path) -> Path:
        """Write the image's OCI archive to ``archive`` (replaced atomically) and return it."""
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": list(self.entrypoint), "User": self.user, "Env": ["PATH=/"]},
        }
        archive.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=archive.parent) as work:
            layer = Path(work) / "layer.tar"
            with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as tar:
                _add(tar, self.binary.name, self.binary.read_bytes(), 0, mode=0o755)
            return write_archive(archive, self.reference, config, layer)


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _add(
    archive: tarfile.TarFile, name: str, data: bytes | IO[bytes], mtime: int, size: int = 0, mode: int = 0o644
) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.mode = mtime, mode
    if isinstance(data, bytes):
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    else:
        info.size = size
        archive.addfile(info, data)


def _blob_name(digest: str) -> str:
    return f"blobs/sha256/{digest.removeprefix('sha256:')}"


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _digest(blob: bytes) -> str:
    return f"sha256:{hashlib.sha256(blob).hexdigest()}"


def _descriptor(media_type: str, blob: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": _digest(blob), "size": len(blob)}
