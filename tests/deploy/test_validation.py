"""Every object the chart renders, the manifests hold and the examples show, validated offline.

Built-in kinds go through the Kubernetes JSON schemas (kubernetes-validate, strict: unknown fields
fail) for the oldest Kubernetes the chart supports and the newest the schemas know; custom resources
go through their CRD's openAPIV3Schema (tests/crd_schema.py).
"""

from __future__ import annotations

import functools
import pathlib
import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

from tests import crd_schema
from tests.deploy.chart import ALL_ON_VALUES, CHART, REPO, load_kserve_crds, load_yaml_objects, render_chart

OLDEST_KUBERNETES = re.search(r">=\s*(\d+\.\d+)", (CHART / "Chart.yaml").read_text()).group(1)  # type: ignore[union-attr]
KUBERNETES_VERSIONS = [
    OLDEST_KUBERNETES,
    kubernetes_validate.utils.major_minor(kubernetes_validate.utils.latest_version()),
]
MANIFESTS = REPO / "manifests"
EXAMPLES = sorted((MANIFESTS / "examples").glob("*.yaml"))
CHART_CRDS = [crd for path in sorted((CHART / "crds").glob("*.yaml")) for crd in load_yaml_objects(path)]
RENDERINGS = {
    "defaults": {},
    "all-on": {"values": [ALL_ON_VALUES]},
    "cluster-runtime": {"sets": ["servingRuntime.enabled=true", "peering.enabled=false"]},
}


@pytest.fixture(scope="module")
def custom_crds() -> dict[tuple[str, str], dict[str, Any]]:
    """Every CRD an object here may need, by (group, kind): the chart's own and KServe's."""
    return {crd_schema.crd_identity(crd): crd for crd in [*CHART_CRDS, *load_kserve_crds().values()]}


def validate_object(obj: dict[str, Any], crds: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Validate one object: against its CRD when it is a custom resource, else the built-in schemas."""
    group = obj["apiVersion"].rpartition("/")[0]
    crd = crds.get((group, obj["kind"]))
    if crd is not None:
        crd_schema.validate(obj, crd)
        return
    for version in KUBERNETES_VERSIONS:
        try:
            validator = builtin_validator(version, obj["apiVersion"], obj["kind"])
        except FileNotFoundError:
            pytest.fail(f"no schema, built-in or CRD, for {obj['apiVersion']} {obj['kind']} in Kubernetes {version}")
        errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(obj)]
        assert not errors, f"{obj['kind']} {obj['metadata'].get('name')} (Kubernetes {version}):\n  " + "\n  ".join(
            errors
        )


@functools.cache
def builtin_validator(version: str, api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    """A strict validator of one built-in kind, from kubernetes-validate's schemas (as it builds them).

    kubernetes_validate.validate() reloads the definitions on every call; this builds each validator once.
    """
    schema_dir = f"kubernetes-json-schema/v{version}.0-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = kubernetes_validate.utils.schema_contents(f"{schema_dir}/{kind.lower()}-{group_version}.json", version)
    definitions = kubernetes_validate.utils.schema_contents(f"{schema_dir}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_all(objects: list[dict[str, Any]], crds: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Validate every object."""
    assert objects
    for obj in objects:
        validate_object(obj, crds)


@pytest.mark.parametrize("rendering", sorted(RENDERINGS))
def test_rendered_objects_validate(rendering: str, custom_crds: dict[tuple[str, str], dict[str, Any]]) -> None:
    validate_all(render_chart(**RENDERINGS[rendering]), custom_crds)


def test_manifests_validate(custom_crds: dict[tuple[str, str], dict[str, Any]]) -> None:
    objects = [obj for path in sorted(MANIFESTS.glob("*.yaml")) for obj in load_yaml_objects(path)]
    assert {"Namespace", "CustomResourceDefinition", "Deployment"} <= {obj["kind"] for obj in objects}
    validate_all(objects, custom_crds)


def test_crds_are_structural_and_served(clef_crd: dict[str, Any]) -> None:
    for crd in CHART_CRDS:
        versions = crd["spec"]["versions"]
        assert sum(1 for v in versions if v["storage"]) == 1, crd["metadata"]["name"]
        for version in versions:
            assert version["schema"]["openAPIV3Schema"]["type"] == "object"
    assert crd_schema.crd_identity(clef_crd) == ("clef-serving.io", "ClefDecision")
    names = clef_crd["spec"]["names"]
    assert (names["plural"], names["shortNames"], clef_crd["spec"]["scope"]) == (
        "clefdecisions",
        ["clef"],
        "Namespaced",
    )
    (version,) = clef_crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_validate_against_the_crd(path: pathlib.Path, clef_crd: dict[str, Any]) -> None:
    from clef_operator.spec import parse_spec

    (example,) = load_yaml_objects(path)
    crd_schema.validate(example, clef_crd)
    parse_spec(example["spec"])  # the operator accepts it too


def test_install_guide_example_is_the_example_file(clef_crd: dict[str, Any]) -> None:
    guide = (REPO / "docs" / "install.md").read_text()
    section = guide.split("\n## Serve the model\n", 1)
    assert len(section) == 2, "docs/install.md has no '## Serve the model' section"
    blocks = re.findall(r"```yaml\n(.*?)```", section[1].split("\n## ", 1)[0], flags=re.DOTALL)
    decisions = [doc for block in blocks for doc in yaml.safe_load_all(block) if doc and doc["kind"] == "ClefDecision"]
    assert decisions, "docs/install.md's 'Serve the model' section shows no ClefDecision"
    (example,) = load_yaml_objects(MANIFESTS / "examples" / "clefdecision.yaml")
    assert decisions[0] == example
    crd_schema.validate(decisions[0], clef_crd)


def test_bad_objects_are_caught(clef_crd: dict[str, Any], custom_crds: dict[tuple[str, str], dict[str, Any]]) -> None:
    (example,) = load_yaml_objects(MANIFESTS / "examples" / "clefdecision.yaml")
    bad = {**example, "spec": {**example["spec"], "replica": 2, "quantization": "int4"}}
    with pytest.raises(AssertionError, match=r"'replica' was unexpected[\s\S]*'int4' is not one of"):
        crd_schema.validate(bad, clef_crd)
    deployment = next(o for o in render_chart() if o["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(AssertionError, match="'imagePullPolcy' was unexpected"):
        validate_object(deployment, custom_crds)
