"""Claims for the README's ClefDecision: it mounts ``clef-models`` and ``clef-compile-cache``, and the scheduler
places no pod whose claim is unbound. The cluster has no storage provisioner, so each claim is pre-bound to a
static hostPath volume of its own: a folder on this machine, which the real node's pods mount (kwok's pods never
touch it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from clef_contract.predictor import PREDICTOR_GID, PREDICTOR_UID

MODELS_CLAIM = "clef-models"
COMPILE_CACHE_CLAIM = "clef-compile-cache"
CLAIMS = (MODELS_CLAIM, COMPILE_CACHE_CLAIM)
DEFAULT_ROOT = Path("/srv")


def volume_folder(namespace: str, claim: str, root: Path = DEFAULT_ROOT) -> Path:
    """The hostPath folder behind ``claim`` in ``namespace``."""
    return root / f"{namespace}-{claim}"


def namespace_with_claims(namespace: str, root: Path = DEFAULT_ROOT) -> list[dict[str, Any]]:
    """The namespace, and for each claim a ReadWriteMany PersistentVolumeClaim bound to its own volume, a hostPath
    folder under ``root``."""
    objects: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}]
    for claim in CLAIMS:
        volume = f"{namespace}-{claim}"
        objects += [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume},
                "spec": {
                    "capacity": {"storage": "100Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "hostPath": {"path": str(volume_folder(namespace, claim, root))},
                    "claimRef": {"namespace": namespace, "name": claim},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": volume,
                    "resources": {"requests": {"storage": "100Gi"}},
                },
            },
        ]
    return objects


def make_volume_folders(namespace: str, root: Path) -> dict[str, Path]:
    """Create the claims' folders under ``root``: the models' readable by every user, the compile cache owned by the
    predictor's uid/gid 10001 (Kubernetes applies no fsGroup to a hostPath volume). By claim name."""
    folders = {claim: volume_folder(namespace, claim, root) for claim in CLAIMS}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o755)
    os.chown(folders[COMPILE_CACHE_CLAIM], PREDICTOR_UID, PREDICTOR_GID)
    return folders
