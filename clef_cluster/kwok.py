"""kwok's configuration for the fake GPU pools: kwok's own default pod stages, plus what a kubelet does that they
leave out.

When a node's heartbeats stop reaching the controllers (an API-server outage longer than the node grace period),
kube-controller-manager's node lifecycle controller marks the node's pods not Ready. A kubelet reports them Ready
again at its next status sync; kwok's default stages only ever make a pod Ready once (while it has no pod IP), so
after such an outage its pods would stay not Ready for good, and their Deployments short of available replicas.
:data:`READY_AGAIN` is that status sync. Pods whose status a test writes itself (``kwok.x-k8s.io/status: custom``,
see clef_cluster.faults) stay out of every stage, this one included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from clef_cluster.build import module_source
from clef_cluster.versions import KWOK_MODULE, KWOK_VERSION

# kwok's default pod stages (what kwok runs when its configuration names none), in its module source.
DEFAULT_POD_STAGES = "kustomize/stage/pod/fast"
KUBELET_STATUS_SYNC_MS = 10_000  # how often a kubelet reconciles the pod statuses the API server holds

READY_AGAIN: dict[str, Any] = {
    "apiVersion": "kwok.x-k8s.io/v1alpha1",
    "kind": "Stage",
    "metadata": {"name": "pod-ready-again"},
    "spec": {
        "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
        "selector": {
            "matchExpressions": [
                {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                {"key": ".status.podIP", "operator": "Exists"},
                {
                    "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
                    "operator": "In",
                    "values": ["False"],
                },
            ]
        },
        "delay": {"durationMilliseconds": KUBELET_STATUS_SYNC_MS},
        "next": {
            "patches": [
                {
                    "subresource": "status",
                    "root": "status",  # the template is the status, as the default stages' statusTemplate
                    "type": "strategic",  # conditions merge by type: only Ready changes
                    "template": "conditions:\n"
                    "- type: Ready\n"
                    '  status: "True"\n'
                    "  lastTransitionTime: {{ Now | Quote }}\n",
                }
            ]
        },
    },
}


def pod_stages() -> list[dict[str, Any]]:
    """kwok's default pod stages, read from its module source at the pinned version, then :data:`READY_AGAIN`."""
    folder = module_source(KWOK_MODULE, KWOK_VERSION) / DEFAULT_POD_STAGES
    names = yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]
    return [*(yaml.safe_load((folder / name).read_text()) for name in names), READY_AGAIN]


def write_config(path: Path) -> Path:
    """kwok's configuration file (its stages) at ``path``."""
    path.write_text(yaml.safe_dump_all(pod_stages(), sort_keys=False))
    return path
