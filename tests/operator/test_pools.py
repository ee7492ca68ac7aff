"""Eligibility of GPU node pools: compute capability, missing labels, mixed pools, include/exclude."""

from __future__ import annotations

from typing import Any

import pytest

from clef_operator import pools as p
from clef_operator.spec import parse_spec
from tests.operator.harness import gpu_node


def _pools(*nodes: dict[str, Any], label_key: str | None = None) -> list[p.NodePool]:
    summaries = [s for s in (p.summarize_node(n) for n in nodes) if s is not None]
    return p.group_into_pools(summaries, label_key)[0]


def _evaluate(
    pool: p.NodePool,
    *,
    min_capability: tuple[int, int] = (8, 9),
    allow_unverified: bool = False,
    gpus_per_replica: int = 1,
    include: Any = (),
    exclude: Any = (),
) -> p.PoolDecision:
    spec = parse_spec(
        {
            "model": {"storageUri": "s3://m/clef"},
            "quantization": "fp8" if min_capability >= (8, 9) else "bf16",
            "minComputeCapability": f"{min_capability[0]}.{min_capability[1]}",
            "allowUnverifiedPools": allow_unverified,
            "gpusPerReplica": gpus_per_replica,
            "nodePools": {"include": list(include), "exclude": list(exclude)},
        }
    )
    return p.evaluate_pool(pool, spec)


@pytest.mark.parametrize(
    ("major", "minor", "product"),
    [
        (8, 9, "NVIDIA-L4"),
        (9, 0, "NVIDIA-H100-80GB-HBM3"),
        (10, 0, "NVIDIA-B200"),
        (12, 0, "NVIDIA-RTX-PRO-6000"),
    ],
)
def test_fp8_capable_gpus_are_accepted(major: int, minor: int, product: str) -> None:
    (pool,) = _pools(gpu_node("n1", "pool", product=product, major=major, minor=minor))
    decision = _evaluate(pool)
    assert decision.eligible and decision.reason == p.ELIGIBLE
    assert decision.gpu.capability == (major, minor) and decision.gpu.product == product


@pytest.mark.parametrize(("major", "minor"), [(8, 6), (8, 0), (7, 5)])
def test_older_gpus_are_refused(major: int, minor: int) -> None:
    (pool,) = _pools(gpu_node("n1", "pool", product="NVIDIA-A10", major=major, minor=minor))
    decision = _evaluate(pool)
    assert not decision.eligible and decision.reason == p.COMPUTE_CAPABILITY_TOO_LOW
    assert f"{major}.{minor}" in decision.message and "8.9" in decision.message


def test_missing_labels_refused_unless_allowed() -> None:
    (pool,) = _pools(gpu_node("n1", "pool", product=None, major=None, minor=None))
    refused = _evaluate(pool)
    assert not refused.eligible and refused.reason == p.MISSING_GPU_LABELS and "n1" in refused.message
    allowed = _evaluate(pool, allow_unverified=True)
    assert allowed.eligible and allowed.reason == p.UNVERIFIED_ALLOWED


def test_mixed_pool_serves_on_its_capable_nodes() -> None:
    (pool,) = _pools(
        gpu_node("n1", "pool", product="NVIDIA-H100-80GB-HBM3", major=9, minor=0),
        gpu_node("n2", "pool", product="NVIDIA-A10", major=8, minor=6),
    )
    decision = _evaluate(pool)
    assert decision.eligible and decision.reason == p.ELIGIBLE
    assert decision.gpu.capability == (9, 0) and decision.gpu.product == "NVIDIA-H100-80GB-HBM3"
    assert "1 of 2 nodes" in decision.message and "node affinity" in decision.message


def test_only_older_gpus_in_a_pool_are_refused_by_the_weakest() -> None:
    (pool,) = _pools(
        gpu_node("n1", "pool", product="NVIDIA-A100", major=8, minor=0),
        gpu_node("n2", "pool", product="NVIDIA-A10", major=8, minor=6),
    )
    decision = _evaluate(pool)
    assert not decision.eligible and decision.gpu.capability == (8, 0)


def test_unlabelled_nodes_do_not_condemn_a_labelled_pool() -> None:
    (pool,) = _pools(
        gpu_node("n1", "pool", product="NVIDIA-H100-80GB-HBM3", major=9, minor=0),
        gpu_node("n2", "pool", product=None, major=None, minor=None),
    )
    assert _evaluate(pool).eligible


def test_declared_pool_without_nodes() -> None:
    spec = parse_spec(
        {
            "model": {"storageUri": "s3://m/clef"},
            "nodePools": {
                "declared": [
                    {
                        "name": "karp-h100",
                        "labelKey": "karpenter.sh/nodepool",
                        "computeCapability": "9.0",
                        "gpusPerNode": 8,
                    },
                    {"name": "karp-a100", "labelKey": "karpenter.sh/nodepool", "computeCapability": "8.0"},
                ]
            },
        }
    )
    pools, _ = p.group_into_pools([], None, spec.nodePools.declared)
    decisions = {pool.name: p.evaluate_pool(pool, spec) for pool in pools}
    assert decisions["karp-h100"].eligible and decisions["karp-h100"].reason == p.DECLARED
    assert decisions["karp-h100"].gpu.capability == (9, 0) and decisions["karp-h100"].gpu.gpus_per_node == 8
    assert not decisions["karp-a100"].eligible


def test_fingerprint_ignores_labels_that_do_not_matter() -> None:
    node = gpu_node("n1", "pool", product="NVIDIA-L4", major=8, minor=9)
    before = p.node_fingerprint([p.summarize_node(node)], ())
    node["metadata"]["labels"]["nvidia.com/gfd.timestamp"] = "1767225600"
    node["metadata"]["labels"]["team"] = "ml"
    assert p.node_fingerprint([p.summarize_node(node)], ()) == before
    assert p.node_fingerprint([p.summarize_node(node)], ("team",)) != before
    node["metadata"]["labels"]["nvidia.com/gpu.compute.minor"] = "0"
    assert p.node_fingerprint([p.summarize_node(node)], ()) != before


def test_mixed_pools_are_decided_independently() -> None:
    pools = _pools(
        gpu_node("h", "h100", product="NVIDIA-H100-80GB-HBM3", major=9, minor=0),
        gpu_node("a", "a100", product="NVIDIA-A100-SXM4-80GB", major=8, minor=0),
        gpu_node("l", "l4", product="NVIDIA-L4", major=8, minor=9),
    )
    assert {pool.name: _evaluate(pool).eligible for pool in pools} == {"a100": False, "h100": True, "l4": True}
    assert {pool.name: _evaluate(pool, min_capability=(8, 0)).eligible for pool in pools} == {
        "a100": True,
        "h100": True,
        "l4": True,
    }


def test_include_exclude_and_gpu_count() -> None:
    (pool,) = _pools(gpu_node("n1", "pool", product="NVIDIA-L4", major=8, minor=9, gpus=4))
    assert _evaluate(pool, exclude=["pool"]).reason == p.EXCLUDED
    assert _evaluate(pool, include=["other"]).reason == p.NOT_INCLUDED
    assert _evaluate(pool, include=["pool"]).eligible
    assert _evaluate(pool, gpus_per_replica=8).reason == p.INSUFFICIENT_GPUS
    assert _evaluate(pool, gpus_per_replica=4).eligible


@pytest.mark.parametrize("key", p.POOL_LABEL_KEYS)
def test_pool_label_autodetection(key: str) -> None:
    (pool,) = _pools(gpu_node("n1", "gpu-pool", product="NVIDIA-L4", major=8, minor=9, pool_key=key))
    assert (pool.name, pool.label_key) == ("gpu-pool", key)


def test_explicit_label_key_and_unpooled_nodes() -> None:
    node = gpu_node("n1", "ignored", product="NVIDIA-L4", major=8, minor=9)
    node["metadata"]["labels"]["example.com/pool"] = "custom"
    summary = p.summarize_node(node)
    assert summary is not None
    pools, unpooled = p.group_into_pools([summary], "example.com/pool")
    assert [(x.name, x.label_key) for x in pools] == [("custom", "example.com/pool")]
    pools, unpooled = p.group_into_pools([summary], "example.com/other")
    assert pools == [] and unpooled == ["n1"]


def test_nodes_without_gpus_are_ignored() -> None:
    assert p.summarize_node({"metadata": {"name": "cpu", "labels": {"cloud.google.com/gke-nodepool": "x"}}}) is None
    by_label = p.summarize_node({"metadata": {"name": "g", "labels": {"nvidia.com/gpu.present": "true"}}})
    assert by_label is not None and by_label.gpus == 0
