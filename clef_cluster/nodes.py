"""Fake GPU node pools, labelled as NVIDIA GPU Feature Discovery and the clouds' node pools label them.

kwok manages every node carrying ``kwok.x-k8s.io/node: fake`` (marks it Ready, keeps its lease, and runs the
pods the scheduler binds to it). GPU nodes are tainted ``nvidia.com/gpu:NoSchedule``, as GPU pools usually are,
and advertise ``nvidia.com/gpu`` in capacity as the device plugin would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_VALUE = "fake"
# Pods (or nodes) carrying this annotation are left to whoever sets their status (see clef_cluster.faults).
CUSTOM_STATUS_ANNOTATION = "kwok.x-k8s.io/status"
CUSTOM_STATUS_VALUE = "custom"
GKE_POOL = "cloud.google.com/gke-nodepool"
EKS_POOL = "eks.amazonaws.com/nodegroup"
KARPENTER_POOL = "karpenter.sh/nodepool"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@dataclass(frozen=True)
class GpuPool:
    """One node pool: how it is named, what GPU its nodes have, how many nodes it starts with."""

    name: str
    label_key: str
    product: str
    family: str
    compute: tuple[int, int]
    gpus: int
    nodes: int
    instance_type: str

    def node_name(self, index: int) -> str:
        """The name of the pool's ``index``-th node."""
        return f"{self.name}-{index}"

    def gfd_labels(self) -> dict[str, str]:
        """What GPU Feature Discovery labels a node of this pool with."""
        return {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": self.product,
            "nvidia.com/gpu.family": self.family,
            "nvidia.com/gpu.count": str(self.gpus),
            "nvidia.com/gpu.compute.major": str(self.compute[0]),
            "nvidia.com/gpu.compute.minor": str(self.compute[1]),
            "nvidia.com/gpu.memory": "81559",
        }

    def node(self, index: int, gfd: bool = True) -> dict[str, Any]:
        """The Node object of the pool's ``index``-th node; ``gfd=False``: before GFD has labelled it."""
        return fake_node(
            self.node_name(index),
            {self.label_key: self.name, **(self.gfd_labels() if gfd else {})},
            self.instance_type,
            gpus=self.gpus,
        )


# The pools of every real-cluster test: two Hopper pools and an Ada pool that can run FP8 (>= 8.9), a Blackwell
# pool, and two pools too old for FP8; GKE, EKS and Karpenter pool labels.
GPU_POOLS: tuple[GpuPool, ...] = (
    GpuPool("h200-pool", GKE_POOL, "NVIDIA-H200", "hopper", (9, 0), 8, 1, "a3-ultragpu-8g"),
    GpuPool("h100-pool", EKS_POOL, "NVIDIA-H100-80GB-HBM3", "hopper", (9, 0), 8, 2, "p5.48xlarge"),
    GpuPool("l4-pool", GKE_POOL, "NVIDIA-L4", "ada-lovelace", (8, 9), 1, 1, "g2-standard-8"),
    GpuPool("b200-pool", KARPENTER_POOL, "NVIDIA-B200", "blackwell", (10, 0), 8, 1, "p6-b200.48xlarge"),
    GpuPool("a100-pool", GKE_POOL, "NVIDIA-A100-SXM4-80GB", "ampere", (8, 0), 8, 1, "a2-ultragpu-8g"),
    GpuPool("t4-pool", EKS_POOL, "Tesla-T4", "turing", (7, 5), 1, 1, "g4dn.xlarge"),
)
# The real node's pool (clef_cluster.node): one node, GFD-labelled as one H100 (FP8-capable), whose pods are real
# containers running on the CPU.
REAL_POOL = GpuPool("real-pool", GKE_POOL, "NVIDIA-H100-80GB-HBM3", "hopper", (9, 0), 1, 1, "real")
# A CPU pool for everything else (the operator's own Deployment); the README's ClefDecision excludes it.
SYSTEM_POOL = "system-pool"


def fake_node(name: str, labels: dict[str, str], instance_type: str, gpus: int = 0) -> dict[str, Any]:
    """A Node that kwok runs: Ready, with the given labels, and ``gpus`` NVIDIA GPUs (tainted if any)."""
    capacity = {"cpu": "96", "memory": "1024Gi", "pods": "110", "ephemeral-storage": "2000Gi"}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: KWOK_VALUE},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": instance_type,
                "type": "kwok",
                **labels,
            },
        },
        "spec": {"taints": [GPU_TAINT]} if gpus else {},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def all_nodes() -> list[dict[str, Any]]:
    """Every node of the GPU pools, GFD-labelled, plus one system-pool node."""
    nodes = [pool.node(index) for pool in GPU_POOLS for index in range(pool.nodes)]
    nodes.append(fake_node(f"{SYSTEM_POOL}-0", {GKE_POOL: SYSTEM_POOL}, "e2-standard-8"))
    return nodes


def pool(name: str) -> GpuPool:
    """The GPU pool called ``name``."""
    return next(p for p in GPU_POOLS if p.name == name)
