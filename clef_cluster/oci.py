"""OCI image archives of one static binary, FROM scratch: the node's sandbox (pause) image and its test workload.

The archive is an OCI image layout in a tar file (``oci-layout``, ``index.json``, ``blobs/sha256/...``) with one
uncompressed layer, reproducible (fixed times and owners), and names itself through the ``io.containerd.image.name``
annotation, so ``ctr images import`` stores it under that reference.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class ScratchImage:
    """An image holding ``binary`` at ``/<its name>``, run as ``entrypoint`` by ``user``."""

    reference: str
    binary: Path
    entrypoint: tuple[str, ...]
    user: str = "65534:65534"

    def write(self, archive: Path) -> Path:
        """Write the image's OCI archive to ``archive`` (replaced atomically) and return it."""
        layer = _layer(self.binary)
        diff_id = _digest(layer)
        config = _json(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {"Entrypoint": list(self.entrypoint), "User": self.user, "Env": ["PATH=/"]},
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            }
        )
        manifest = _json(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": _descriptor(CONFIG, config),
                "layers": [_descriptor(LAYER, layer)],
            }
        )
        tag = self.reference.rsplit(":", 1)[1]
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    **_descriptor(MANIFEST, manifest),
                    "annotations": {
                        "io.containerd.image.name": self.reference,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
        members = {
            "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
            "index.json": _json(index),
            **{f"blobs/sha256/{_digest(blob).split(':')[1]}": blob for blob in (layer, config, manifest)},
        }
        archive.parent.mkdir(parents=True, exist_ok=True)
        scratch = archive.with_suffix(".part")
        scratch.write_bytes(_tar(members))
        scratch.replace(archive)
        return archive


def _layer(binary: Path) -> bytes:
    return _tar({binary.name: binary.read_bytes()}, mode=0o755)


def _tar(members: dict[str, bytes], mode: int = 0o644) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _digest(blob: bytes) -> str:
    return f"sha256:{hashlib.sha256(blob).hexdigest()}"


def _descriptor(media_type: str, blob: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": _digest(blob), "size": len(blob)}
