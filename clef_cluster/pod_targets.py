"""``python -m clef_cluster.pod_targets KUBECONFIG FILE``: Prometheus' targets file of the annotated pods, kept current.

Debian's Prometheus is built without Kubernetes service discovery, so this loop does what Prometheus' own example
Kubernetes configuration does with ``kubernetes_sd_configs`` (role ``pod``) and its relabelling: it keeps the
running pods annotated ``prometheus.io/scrape: "true"``, scrapes each at its IP on the ``prometheus.io/port``
annotation's port and the ``prometheus.io/path`` annotation's path, and labels the series with the pod's
``namespace`` and ``pod``. Prometheus reads the file through ``file_sd_configs`` and notices each rewrite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from clef_cluster.cluster import kubectl_path

SCRAPE = "prometheus.io/scrape"
PORT = "prometheus.io/port"
PATH = "prometheus.io/path"
DEFAULT_PATH = "/metrics"
INTERVAL_S = 1.0


def targets(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The file_sd target groups of ``pods`` (a pod list's items): one per running, annotated pod with an IP."""
    groups = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        annotations = meta.get("annotations") or {}
        address, port = status.get("podIP"), annotations.get(PORT)
        if annotations.get(SCRAPE) != "true" or status.get("phase") != "Running" or not address or not port:
            continue
        labels = {
            "namespace": meta["namespace"],
            "pod": meta["name"],
            "__metrics_path__": annotations.get(PATH) or DEFAULT_PATH,
        }
        groups.append({"targets": [f"{address}:{port}"], "labels": labels})
    return sorted(groups, key=lambda group: (group["labels"]["namespace"], group["labels"]["pod"]))


def write(path: Path, groups: list[dict[str, Any]]) -> bool:
    """Replace ``path`` with ``groups`` in one rename (Prometheus never reads half a file); False when unchanged."""
    text = json.dumps(groups, indent=1)
    if path.exists() and path.read_text() == text:
        return False
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(text)
    os.replace(partial, path)
    return True


def main(argv: list[str]) -> None:
    kubeconfig, out = argv
    path = Path(out)
    write(path, [])
    while True:
        listed = subprocess.run(
            [kubectl_path(), f"--kubeconfig={kubeconfig}", "get", "pods", "--all-namespaces", "-o", "json"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if listed.returncode:
            print(f"listing pods failed: {listed.stderr.strip()}", flush=True)
        elif write(path, targets(json.loads(listed.stdout)["items"])):
            print(f"{time.strftime('%H:%M:%S')} targets: {path.read_text()}", flush=True)
        time.sleep(INTERVAL_S)


if __name__ == "__main__":
    main(sys.argv[1:])
