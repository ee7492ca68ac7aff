"""Objects within a real API server's limits: capped free-form fields, and an InferenceService that would be too
large reported instead of sent. The largest spec's digest as kopf's diff base, on a real API server:
tests/cluster/test_2b_operator_limits.py (which imports largest_spec and LAST_HANDLED from here)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from clef_operator import spec as spec_module
from clef_operator import writes
from clef_operator.kserve_backend import Placement, build_inferenceservice
from clef_operator.pools import NodePool
from clef_operator.spec import InvalidSpecError, parse_spec
from clef_operator.writes import MAX_INFERENCESERVICE_BYTES
from tests.crd_schema import clef_crd, crd_validator, errors
from tests.operator.emulator import MAX_OBJECT_BYTES
from tests.operator.harness import DECISIONS, NODES, EmulatedCluster, gpu_node, running_operator
from tests.polling import eventually_async

NS = "ml"
H100 = dict(product="NVIDIA-H100-80GB-HBM3", family="hopper", major=9, minor=0)
LAST_HANDLED = "clef-serving.io/last-handled-configuration"
pytestmark = [pytest.mark.timeout(120), pytest.mark.looptime]


def decision(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "clef-serving.io/v1alpha1",
        "kind": "ClefDecision",
        "metadata": {"name": "clef", "namespace": NS},
        "spec": {"model": {"storageUri": "hf://cloudflare/clef-flash-fp8"}, **spec},
    }


def largest_spec() -> dict[str, Any]:
    """Every capped free-form field at its cap."""
    arg = "--" + "x" * (spec_module.MAX_ARG_LENGTH - 2)
    return decision(
        tolerations=[{"key": "k" * 317, "operator": "Equal", "value": "v" * 63, "effect": "NoSchedule"}]
        * spec_module.MAX_TOLERATIONS,
        imagePullSecrets=[{"name": f"s{i}" + "s" * 250} for i in range(spec_module.MAX_PULL_SECRETS)],
        predictor={
            "extraArgs": [arg] * spec_module.MAX_EXTRA_ARGS,
            "env": [
                {"name": f"E{i}" + "N" * (spec_module.MAX_ENV_NAME - 4), "value": "v" * spec_module.MAX_ENV_VALUE}
                for i in range(spec_module.MAX_ENV)
            ],
        },
    )["spec"]


def test_the_300_kb_extra_args_spec_is_refused_by_the_operators_validation() -> None:
    """The API server's refusal of the same specs: tests/cluster/test_2b_operator_limits.py."""
    for extra_args in (["--a=" + "x" * 300_000], ["--a=" + "x" * 2000] * 150):
        body = decision(predictor={"extraArgs": extra_args})
        with pytest.raises(InvalidSpecError, match="spec.predictor.extraArgs"):
            parse_spec(body["spec"])


def test_largest_accepted_spec_yields_objects_within_the_limits() -> None:
    spec = largest_spec()
    body = decision(**spec)
    assert errors(crd_validator(clef_crd(), "v1alpha1"), body) == []
    built = build_inferenceservice(
        Placement(
            decision="clef",
            namespace=NS,
            spec=parse_spec(spec),
            pool=NodePool("h100-pool", "cloud.google.com/gke-nodepool", ()),
        )
    )
    size = len(json.dumps(built, separators=(",", ":")))
    assert size < MAX_INFERENCESERVICE_BYTES < MAX_OBJECT_BYTES
    assert len(json.dumps(body)) < MAX_OBJECT_BYTES


async def test_too_large_inferenceservice_is_reported_not_sent(
    cluster: EmulatedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """affinity is free-form (Kubernetes' own schema): more of it than the operator sends in an
    InferenceService is reported on the pool, and nothing is POSTed. (The limit is lowered to 200 kB here:
    the emulator's HTTP server reads bodies up to 1 MiB.)"""
    monkeypatch.setattr(writes, "MAX_INFERENCESERVICE_BYTES", 200_000)
    await cluster.create(NODES, gpu_node("h100-a", "h100-pool", **H100))
    terms = [{"weight": 1, "podAffinityTerm": {"topologyKey": "t" * 60_000, "labelSelector": {}}}] * 4
    await cluster.create(
        DECISIONS.format(ns=NS),
        decision(affinity={"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}}),
    )
    async with running_operator():

        async def failed() -> dict[str, Any] | None:
            status = (await cluster.get(f"{DECISIONS.format(ns=NS)}/clef")).get("status") or {}
            pool = next(iter(status.get("pools") or []), {})
            return pool if pool.get("state") == "Failed" else None

        pool = await eventually_async(failed)
    assert "would take" in pool["predictorMessage"] and "spec.affinity" in pool["predictorMessage"]
    assert cluster.emulator.operator_writes("inferenceservices") == []
