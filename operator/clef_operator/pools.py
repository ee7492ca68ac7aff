"""GPU node pools: summarize nodes, group them by pool, and decide which pools may serve the model.

Everything here is pure: it takes plain node dicts (as the API returns them) and returns values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from clef_operator.constants import (
    GPU_COMPUTE_MAJOR_LABEL,
    GPU_COMPUTE_MINOR_LABEL,
    GPU_COUNT_LABEL,
    GPU_FAMILY_LABEL,
    GPU_PRESENT_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    POOL_LABEL_KEYS,
)

# Reasons reported per pool (status.pools[].reason).
ELIGIBLE = "Eligible"
UNVERIFIED_ALLOWED = "UnverifiedAllowed"
COMPUTE_CAPABILITY_TOO_LOW = "ComputeCapabilityTooLow"
MISSING_GPU_LABELS = "MissingGPULabels"
INSUFFICIENT_GPUS = "InsufficientGPUs"
EXCLUDED = "Excluded"
NOT_INCLUDED = "NotIncluded"


@dataclass(frozen=True)
class GpuNode:
    """What the operator needs to know about one GPU node: its labels and GPU count."""

    name: str
    labels: Mapping[str, str]
    gpus: int


@dataclass(frozen=True)
class NodePool:
    """The GPU nodes sharing one value of a pool label."""

    name: str
    label_key: str
    nodes: tuple[GpuNode, ...]


@dataclass(frozen=True)
class GpuInfo:
    """The GPU a pool's nodes report through GPU Feature Discovery (None where a label is missing)."""

    product: str | None
    family: str | None
    capability: tuple[int, int] | None
    gpus_per_node: int

    def as_status(self) -> dict[str, Any]:
        """The status.pools[].gpu entry (camelCase, without unknown fields)."""
        status: dict[str, Any] = {"count": self.gpus_per_node}
        if self.product is not None:
            status["product"] = self.product
        if self.family is not None:
            status["family"] = self.family
        if self.capability is not None:
            status["computeCapability"] = f"{self.capability[0]}.{self.capability[1]}"
        return status


@dataclass(frozen=True)
class PoolDecision:
    """Whether one pool serves the model, why, and what GPU it has."""

    pool: NodePool
    eligible: bool
    reason: str
    message: str
    gpu: GpuInfo


def summarize_node(node: Mapping[str, Any]) -> GpuNode | None:
    """Summarize a Node object; None when it shows no sign of an NVIDIA GPU."""
    metadata = node.get("metadata") or {}
    labels: Mapping[str, str] = metadata.get("labels") or {}
    capacity = (node.get("status") or {}).get("capacity") or {}
    gpus = _to_int(capacity.get(GPU_RESOURCE)) or _to_int(labels.get(GPU_COUNT_LABEL)) or 0
    has_gpu = gpus > 0 or labels.get(GPU_PRESENT_LABEL) == "true" or GPU_PRODUCT_LABEL in labels
    if not has_gpu:
        return None
    return GpuNode(name=str(metadata.get("name", "")), labels=dict(labels), gpus=gpus)


def pool_label_key(node: GpuNode, label_key: str | None) -> str | None:
    """The label naming the node's pool: ``label_key`` if given, else the first well-known one present."""
    if label_key is not None:
        return label_key if label_key in node.labels else None
    return next((key for key in POOL_LABEL_KEYS if key in node.labels), None)


def group_into_pools(nodes: Iterable[GpuNode], label_key: str | None) -> tuple[list[NodePool], list[str]]:
    """Group GPU nodes into pools (sorted by name); also return the names of nodes in no pool."""
    members: dict[tuple[str, str], list[GpuNode]] = {}
    unpooled: list[str] = []
    for node in nodes:
        key = pool_label_key(node, label_key)
        if key is None:
            unpooled.append(node.name)
            continue
        members.setdefault((node.labels[key], key), []).append(node)
    pools = [
        NodePool(name=name, label_key=key, nodes=tuple(sorted(group, key=lambda n: n.name)))
        for (name, key), group in sorted(members.items())
    ]
    return pools, sorted(unpooled)


def describe_gpu(pool: NodePool) -> tuple[GpuInfo, list[str]]:
    """The pool's GPU (its weakest node's capability) and the nodes missing compute-capability labels."""
    products = sorted({n.labels[GPU_PRODUCT_LABEL] for n in pool.nodes if GPU_PRODUCT_LABEL in n.labels})
    families = sorted({n.labels[GPU_FAMILY_LABEL] for n in pool.nodes if GPU_FAMILY_LABEL in n.labels})
    unlabelled: list[str] = []
    capabilities: list[tuple[int, int]] = []
    for node in pool.nodes:
        major = _to_int(node.labels.get(GPU_COMPUTE_MAJOR_LABEL))
        minor = _to_int(node.labels.get(GPU_COMPUTE_MINOR_LABEL))
        if major is None or minor is None:
            unlabelled.append(node.name)
        else:
            capabilities.append((major, minor))
    info = GpuInfo(
        product=",".join(products) or None,
        family=",".join(families) or None,
        capability=min(capabilities) if capabilities else None,
        gpus_per_node=min((n.gpus for n in pool.nodes), default=0),
    )
    return info, unlabelled


def evaluate_pool(
    pool: NodePool,
    *,
    min_capability: tuple[int, int],
    allow_unverified: bool,
    gpus_per_replica: int,
    include: Iterable[str] = (),
    exclude: Iterable[str] = (),
) -> PoolDecision:
    """Decide whether a pool may serve the model; the reason and message say why not."""
    gpu, unlabelled = describe_gpu(pool)
    required = f"{min_capability[0]}.{min_capability[1]}"
    include, exclude = list(include), list(exclude)
    if pool.name in exclude:
        return PoolDecision(pool, False, EXCLUDED, "listed in spec.nodePools.exclude", gpu)
    if include and pool.name not in include:
        return PoolDecision(pool, False, NOT_INCLUDED, "not listed in spec.nodePools.include", gpu)
    if gpu.capability is not None and gpu.capability < min_capability:
        found = f"{gpu.capability[0]}.{gpu.capability[1]}"
        product = f" ({gpu.product})" if gpu.product else ""
        message = f"compute capability {found}{product} is below the required {required}"
        return PoolDecision(pool, False, COMPUTE_CAPABILITY_TOO_LOW, message, gpu)
    if gpu.gpus_per_node and gpus_per_replica > gpu.gpus_per_node:
        message = f"a replica needs {gpus_per_replica} GPUs but the pool's nodes have {gpu.gpus_per_node}"
        return PoolDecision(pool, False, INSUFFICIENT_GPUS, message, gpu)
    if unlabelled:
        labels = f"{GPU_COMPUTE_MAJOR_LABEL}/{GPU_COMPUTE_MINOR_LABEL}"
        nodes = ", ".join(unlabelled)
        if not allow_unverified:
            message = f"nodes without {labels} labels (is GPU Feature Discovery running?): {nodes}"
            return PoolDecision(pool, False, MISSING_GPU_LABELS, message, gpu)
        message = f"compute capability unverified on {nodes}; allowed by spec.allowUnverifiedPools"
        return PoolDecision(pool, True, UNVERIFIED_ALLOWED, message, gpu)
    found = f"{gpu.capability[0]}.{gpu.capability[1]}" if gpu.capability else "unknown"
    return PoolDecision(pool, True, ELIGIBLE, f"compute capability {found} meets the required {required}", gpu)


def _to_int(value: object) -> int | None:
    try:
        return int(str(value)) if value is not None else None
    except ValueError:
        return None
