"""Claims for the README's ClefDecision: it mounts ``clef-models`` and ``clef-compile-cache``, and the scheduler
places no pod whose claim is unbound. The cluster has no storage provisioner, so each claim is pre-bound to a
static hostPath volume of its own (kwok's pods never touch it)."""

from __future__ import annotations

from typing import Any

CLAIMS = ("clef-models", "clef-compile-cache")


def namespace_with_claims(namespace: str) -> list[dict[str, Any]]:
    """The namespace, and for each claim a ReadWriteMany PersistentVolumeClaim bound to its own volume."""
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
                    "hostPath": {"path": f"/srv/{volume}"},
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
