"""Failures on demand: a pod whose container crashes, as a kubelet would report it.

kwok leaves alone the status of a pod annotated ``kwok.x-k8s.io/status: custom``; the status written here then
stays until the pod is deleted, at once (``--grace-period=0 --force``: nothing confirms a graceful deletion of a
pod kwok no longer runs); its ReplicaSet makes a new one, which kwok runs normally.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from clef_cluster.nodes import CUSTOM_STATUS_ANNOTATION, CUSTOM_STATUS_VALUE

if TYPE_CHECKING:
    from clef_cluster.cluster import Cluster


def crash_pod(cluster: Cluster, namespace: str, name: str) -> None:
    """Make a running pod's containers crash-loop: not ready, waiting in CrashLoopBackOff after exit code 1."""
    cluster.kubectl(
        "annotate",
        "pod",
        name,
        f"--namespace={namespace}",
        "--overwrite",
        f"{CUSTOM_STATUS_ANNOTATION}={CUSTOM_STATUS_VALUE}",
    )
    pod = json.loads(cluster.kubectl("get", "pod", name, f"--namespace={namespace}", "-o", "json").stdout)
    containers: list[dict[str, Any]] = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": 1,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
        }
        for c in pod["spec"]["containers"]
    ]
    conditions = [
        {**c, "status": "False", "reason": "ContainersNotReady"} if c["type"] in ("Ready", "ContainersReady") else c
        for c in pod["status"].get("conditions", [])
    ]
    patch = {"status": {"conditions": conditions, "containerStatuses": containers}}
    cluster.kubectl(
        "patch",
        "pod",
        name,
        f"--namespace={namespace}",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(patch),
    )
