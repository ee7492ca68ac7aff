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
from clef_operator.spec import ClefDecisionSpec, DeclaredPool, Variant, parse_capability

# Reasons reported per pool (status.pools[].reason).
ELIGIBLE = "Eligible"
DECLARED = "Declared"
UNVERIFIED_ALLOWED = "UnverifiedAllowed"
COMPUTE_CAPABILITY_TOO_LOW = "ComputeCapabilityTooLow"
MISSING_GPU_LABELS = "MissingGPULabels"
INSUFFICIENT_GPUS = "InsufficientGPUs"
NO_NODES = "NoNodes"
EXCLUDED = "Excluded"
NOT_INCLUDED = "NotIncluded"
# Reasons that the spec's author chose: the predictor goes at once, not after the removal grace period.
CHOSEN_BY_SPEC: frozenset[str] = frozenset({EXCLUDED, NOT_INCLUDED})

# The node labels that can change a pool's decision: pool names, GPU Feature Discovery's GPU description.
# Anything else (GFD's timestamp, cloud bookkeeping) is ignored, so relabelling it triggers no reconcile.
GPU_LABELS: tuple[str, ...] = (
    GPU_PRESENT_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_FAMILY_LABEL,
    GPU_COUNT_LABEL,
    GPU_COMPUTE_MAJOR_LABEL,
    GPU_COMPUTE_MINOR_LABEL,
)


@dataclass(frozen=True)
class GpuNode:
    """What the operator needs to know about one GPU node: its labels and GPU count."""

    name: str
    labels: Mapping[str, str]
    gpus: int

    @property
    def capability(self) -> tuple[int, int] | None:
        """The node's compute capability from GPU Feature Discovery's labels (None until labelled)."""
        major = _to_int(self.labels.get(GPU_COMPUTE_MAJOR_LABEL))
        minor = _to_int(self.labels.get(GPU_COMPUTE_MINOR_LABEL))
        return None if major is None or minor is None else (major, minor)


@dataclass(frozen=True)
class NodePool:
    """The GPU nodes sharing one value of a pool label, and what the spec declares about the pool."""

    name: str
    label_key: str
    nodes: tuple[GpuNode, ...]
    declared: DeclaredPool | None = None

    @property
    def key(self) -> tuple[str, str]:
        """(label key, name): what identifies a pool (two label keys may use the same pool name)."""
        return self.label_key, self.name


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
    """Whether one pool serves the model, why, what GPU it has and which release it runs."""

    pool: NodePool
    eligible: bool
    reason: str
    message: str
    gpu: GpuInfo
    variant: Variant | None = None


def summarize_node(node: Mapping[str, Any]) -> GpuNode | None:
    """Summarize a Node object; None when it shows no sign of an NVIDIA GPU.

    GPU Feature Discovery's and Node Feature Discovery's many other labels (``nvidia.com/*``,
    ``feature.node.kubernetes.io/*``: driver versions, timestamps) are dropped; the rest may name a pool.
    """
    metadata = node.get("metadata") or {}
    labels: Mapping[str, str] = metadata.get("labels") or {}
    capacity = (node.get("status") or {}).get("capacity") or {}
    gpus = _to_int(capacity.get(GPU_RESOURCE)) or _to_int(labels.get(GPU_COUNT_LABEL)) or 0
    has_gpu = gpus > 0 or labels.get(GPU_PRESENT_LABEL) == "true" or GPU_PRODUCT_LABEL in labels
    if not has_gpu:
        return None
    kept = {
        key: value
        for key, value in labels.items()
        if key in GPU_LABELS or not key.startswith(("nvidia.com/", "feature.node.kubernetes.io/"))
    }
    return GpuNode(name=str(metadata.get("name", "")), labels=kept, gpus=gpus)


def node_fingerprint(nodes: Iterable[GpuNode], label_keys: Iterable[str]) -> frozenset[Any]:
    """What about the GPU nodes can change a pool decision: names, GPU counts, GPU labels and pool labels.

    ``label_keys`` are the pool labels ClefDecisions name besides the well-known ones.
    """
    wanted = {*GPU_LABELS, *POOL_LABEL_KEYS, *label_keys}
    return frozenset(
        (node.name, node.gpus, tuple(sorted((k, v) for k, v in node.labels.items() if k in wanted))) for node in nodes
    )


def pool_label_key(node: GpuNode, label_key: str | None) -> str | None:
    """The label naming the node's pool: ``label_key`` if given, else the first well-known one present."""
    if label_key is not None:
        return label_key if label_key in node.labels else None
    return next((key for key in POOL_LABEL_KEYS if key in node.labels), None)


def pool_labels_carried(nodes: Iterable[GpuNode]) -> list[str]:
    """The well-known pool labels (POOL_LABEL_KEYS) any of ``nodes`` carries, in that order."""
    carried = {key for node in nodes for key in node.labels}
    return [key for key in POOL_LABEL_KEYS if key in carried]


def group_into_pools(
    nodes: Iterable[GpuNode], label_key: str | None, declared: Iterable[DeclaredPool] = ()
) -> tuple[list[NodePool], list[str]]:
    """Group GPU nodes into pools, add the declared ones (sorted by key); also return nodes in no pool."""
    members: dict[tuple[str, str], list[GpuNode]] = {}
    unpooled: list[str] = []
    for node in nodes:
        key = pool_label_key(node, label_key)
        if key is None:
            unpooled.append(node.name)
            continue
        members.setdefault((key, node.labels[key]), []).append(node)
    declarations: dict[tuple[str, str], DeclaredPool] = {}
    for pool in declared:
        key = pool.labelKey or label_key
        if key is not None:
            declarations[(key, pool.name)] = pool
            members.setdefault((key, pool.name), [])
    pools = [
        NodePool(
            name=name,
            label_key=key,
            nodes=tuple(sorted(group, key=lambda n: n.name)),
            declared=declarations.get((key, name)),
        )
        for (key, name), group in sorted(members.items())
    ]
    return pools, sorted(unpooled)


def describe_gpu(pool: NodePool, min_capability: tuple[int, int]) -> tuple[GpuInfo, list[GpuNode], list[str]]:
    """The pool's GPU, its nodes able to run the model, and its nodes without compute-capability labels.

    The capability reported is that of the weakest capable node (of the weakest node when none is capable;
    the declared one when no node is labelled); the GPU count per node likewise.
    """
    labelled = [node for node in pool.nodes if node.capability is not None]
    unlabelled = [node.name for node in pool.nodes if node.capability is None]
    capable = [node for node in labelled if node.capability >= min_capability]  # type: ignore[operator]
    described = capable or labelled
    products = sorted({n.labels[GPU_PRODUCT_LABEL] for n in described if GPU_PRODUCT_LABEL in n.labels})
    families = sorted({n.labels[GPU_FAMILY_LABEL] for n in described if GPU_FAMILY_LABEL in n.labels})
    capability = min((n.capability for n in described), default=None)  # type: ignore[type-var]
    gpus = min((n.gpus for n in described or pool.nodes), default=0)
    if not labelled and pool.declared is not None:
        capability = parse_capability(pool.declared.computeCapability)
        gpus = pool.declared.gpusPerNode or gpus
    info = GpuInfo(
        product=",".join(products) or None, family=",".join(families) or None, capability=capability, gpus_per_node=gpus
    )
    return info, capable, unlabelled


def evaluate_pool(pool: NodePool, spec: ClefDecisionSpec) -> PoolDecision:
    """Decide whether a pool may serve the model, and with which release; the reason and message say why.

    Nodes without GPU Feature Discovery labels yet are left out of the decision (the predictor's node
    affinity keeps pods off them until they are labelled); a pool with some capable nodes serves on those.
    """
    min_capability = spec.min_capability
    required = f"{min_capability[0]}.{min_capability[1]}"
    gpu, capable, unlabelled = describe_gpu(pool, min_capability)
    gpus_per_replica = spec.gpus_for(pool.name)

    def refuse(reason: str, message: str) -> PoolDecision:
        return PoolDecision(pool, False, reason, message, gpu)

    if pool.name in spec.nodePools.exclude:
        return refuse(EXCLUDED, "listed in spec.nodePools.exclude")
    if spec.nodePools.include and pool.name not in spec.nodePools.include:
        return refuse(NOT_INCLUDED, "not listed in spec.nodePools.include")
    labelled = [node for node in pool.nodes if node.capability is not None]
    if labelled and not capable:
        found = f"{gpu.capability[0]}.{gpu.capability[1]}" if gpu.capability else "unknown"
        product = f" ({gpu.product})" if gpu.product else ""
        return refuse(
            COMPUTE_CAPABILITY_TOO_LOW, f"compute capability {found}{product} is below the required {required}"
        )
    if gpu.gpus_per_node and gpus_per_replica > gpu.gpus_per_node:
        return refuse(
            INSUFFICIENT_GPUS, f"a replica needs {gpus_per_replica} GPUs but the pool's nodes have {gpu.gpus_per_node}"
        )
    if capable:
        variant = spec.best_variant(gpu.capability)
        found = f"{gpu.capability[0]}.{gpu.capability[1]}"  # type: ignore[index]
        message = f"compute capability {found} meets the required {required}"
        left_out = len(pool.nodes) - len(capable)
        if left_out:
            message += (
                f"; {len(capable)} of {len(pool.nodes)} nodes can run it and node affinity keeps the predictor on those"
            )
        return PoolDecision(pool, True, ELIGIBLE, message, gpu, variant)
    if pool.declared is not None:
        declared = parse_capability(pool.declared.computeCapability)
        if declared < min_capability:
            return refuse(
                COMPUTE_CAPABILITY_TOO_LOW,
                f"declared compute capability {pool.declared.computeCapability} is below the required {required}",
            )
        what = "no nodes yet" if not pool.nodes else f"nodes without GPU labels yet: {', '.join(unlabelled)}"
        message = f"declared with compute capability {pool.declared.computeCapability} ({what})"
        return PoolDecision(pool, True, DECLARED, message, gpu, spec.best_variant(declared))
    if not pool.nodes:
        return refuse(NO_NODES, "the pool has no nodes")
    labels = f"{GPU_COMPUTE_MAJOR_LABEL}/{GPU_COMPUTE_MINOR_LABEL}"
    nodes = ", ".join(unlabelled)
    if spec.allowUnverifiedPools:
        message = f"compute capability unverified on {nodes}; allowed by spec.allowUnverifiedPools"
        return PoolDecision(pool, True, UNVERIFIED_ALLOWED, message, gpu, spec.best_variant(None))
    return refuse(MISSING_GPU_LABELS, f"nodes without {labels} labels (is GPU Feature Discovery running?): {nodes}")


def _to_int(value: object) -> int | None:
    try:
        return int(str(value)) if value is not None else None
    except ValueError:
        return None
