"""The ClefDecision CRD: names and columns the chart relies on, defaults matching the operator's, examples valid."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from pydantic import BaseModel

from clef_operator.spec import ClefDecisionSpec, parse_spec
from tests.crd_schema import KEDA_CRD, KSERVE_ISVC_CRD, clef_crd, crd_validator, errors, load_crd

EXAMPLE = {
    "apiVersion": "clef-serving.io/v1alpha1",
    "kind": "ClefDecision",
    "metadata": {"name": "clef", "namespace": "ml"},
    "spec": {
        "model": {"storageUri": "hf://cloudflare/clef-flash-fp8", "name": "clef-flash"},
        "quantization": "fp8",
        "nodePools": {"exclude": ["system"]},
        "replicas": 1,
        "gpusPerReplica": 1,
        "poolOverrides": [{"name": "h100-pool", "replicas": 2, "gpusPerReplica": 8}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "predictor": {
            "resources": {"requests": {"cpu": "8", "memory": "64Gi"}},
            "maxModelLen": 8192,
            "extraArgs": ["--log-level=info"],
        },
    },
}


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return clef_crd()


def test_names_scope_and_columns(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "clefdecisions.clef-serving.io"
    assert (spec["group"], spec["scope"]) == ("clef-serving.io", "Namespaced")
    assert spec["names"] == {
        **spec["names"],
        "kind": "ClefDecision",
        "plural": "clefdecisions",
        "singular": "clefdecision",
        "shortNames": ["clef"],
    }
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Ready", "Pools", "Age"]


def _crd_defaults(schema: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}{name}"
        if "default" in sub and sub["default"] != {}:
            found[path] = sub["default"]
        found.update(_crd_defaults(sub, f"{path}."))
    return found


def _model_defaults(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        # Optional sub-objects (`Keda | None`) have defaults of their own too.
        annotation = next((arg for arg in typing.get_args(annotation) if arg is not type(None)), annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found.update(_model_defaults(annotation, f"{prefix}{name}."))
        elif not field.is_required() and field.default is not None and field.default_factory is None:
            found[f"{prefix}{name}"] = field.default
    return found


def test_crd_defaults_match_the_operator(crd: dict[str, Any]) -> None:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert _crd_defaults(schema) == _model_defaults(ClefDecisionSpec)


def test_example_is_valid(crd: dict[str, Any]) -> None:
    assert errors(crd_validator(crd, "v1alpha1"), EXAMPLE) == []
    parse_spec(EXAMPLE["spec"])


def test_schema_rejects_bad_input(crd: dict[str, Any]) -> None:
    validator = crd_validator(crd, "v1alpha1")
    bad = {**EXAMPLE, "spec": {**EXAMPLE["spec"], "quantization": "int4", "model": {"storageUri": "ftp://x"}}}
    problems = errors(validator, bad)
    assert any(p.startswith("spec.quantization") for p in problems)
    assert any(p.startswith("spec.model.storageUri") for p in problems)
    assert errors(validator, {**EXAMPLE, "spec": {**EXAMPLE["spec"], "typo": 1}})
    lots = {**EXAMPLE, "spec": {**EXAMPLE["spec"], "predictor": {"resources": {"requests": {"cpu": "lots"}}}}}
    assert any(p.startswith("spec.predictor.resources.requests.cpu") for p in errors(validator, lots))
    quantities = {"resources": {"requests": {"cpu": "500m", "memory": 64}}}
    fine = {**EXAMPLE, "spec": {**EXAMPLE["spec"], "predictor": quantities}}
    assert errors(validator, fine) == []


def test_compile_cache_is_one_volume_source(crd: dict[str, Any]) -> None:
    validator = crd_validator(crd, "v1alpha1")

    def with_cache(cache: Any) -> dict[str, Any]:
        return {
            **EXAMPLE,
            "spec": {**EXAMPLE["spec"], "predictor": {**EXAMPLE["spec"]["predictor"], "compileCache": cache}},
        }

    for cache in (
        {"persistentVolumeClaim": {"claimName": "clef-compile-cache"}},
        {"hostPath": {"path": "/var/cache/clef", "type": "DirectoryOrCreate"}},
        {"emptyDir": {}},
    ):
        assert errors(validator, with_cache(cache)) == []
        parse_spec(with_cache(cache)["spec"])
    for cache in ({}, {"emptyDir": {}, "hostPath": {"path": "/x"}}, "emptyDir"):
        assert any(p.startswith("spec.predictor.compileCache") for p in errors(validator, with_cache(cache)))


def test_cel_rules_cover_dependent_fields(crd: dict[str, Any]) -> None:
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [rule["rule"] for rule in spec["x-kubernetes-validations"]]
    assert any("quantization" in r and "minComputeCapability" in r for r in rules)
    assert spec["properties"]["nodePools"]["x-kubernetes-validations"]
    assert spec["properties"]["predictor"]["properties"]["extraArgs"]["x-kubernetes-validations"]


def test_built_inferenceservices_match_kserve_schema() -> None:
    from clef_operator.kserve_backend import Placement, build_inferenceservice
    from clef_operator.pools import NodePool

    validator = crd_validator(load_crd(KSERVE_ISVC_CRD), "v1beta1")
    for spec in (EXAMPLE["spec"], {"model": {"storageUri": "pvc://models/clef"}, "deploymentMode": "Knative"}):
        body = build_inferenceservice(
            Placement(
                decision="clef",
                namespace="ml",
                spec=parse_spec(spec),
                pool=NodePool("h100-pool", "cloud.google.com/gke-nodepool", ()),
            )
        )
        assert errors(validator, body) == []


def test_built_scaled_objects_match_keda_schema() -> None:
    from clef_operator.deployment_backend import build_autoscaler, build_deployment
    from clef_operator.kserve_backend import Placement
    from clef_operator.pools import NodePool

    validator = crd_validator(load_crd(KEDA_CRD), "v1alpha1")
    pool = NodePool("h100-pool", "cloud.google.com/gke-nodepool", ())
    keda = {"serverAddress": "http://prometheus:9090", "target": "1500m"}
    fields = {key: value for key, value in EXAMPLE["spec"].items() if key not in ("replicas", "poolOverrides")}
    spec = parse_spec({**fields, "autoscaling": {"maxReplicas": 4, "keda": keda}})
    deployment = build_deployment(Placement(decision="clef", namespace="ml", pool=pool, spec=spec))
    body = build_autoscaler(spec, pool, deployment)
    assert body is not None and body["kind"] == "ScaledObject"
    assert errors(validator, body) == []
    assert errors(validator, {**body, "spec": {**body["spec"], "minReplicaCount": "1"}})  # the check can fail
