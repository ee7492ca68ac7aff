"""Offline validation of custom resources against their CRD's structural OpenAPI v3 schema.

The API server validates a custom resource against `openAPIV3Schema`, a dialect of OpenAPI v3 with
Kubernetes extensions. `to_json_schema` turns it into plain JSON Schema (draft 2020-12) that
`jsonschema` checks:

- `x-kubernetes-int-or-string` accepts an integer or a string;
- `nullable: true` also accepts null;
- unknown fields are rejected (the API server would prune them silently, which hides typos), except
  under `x-kubernetes-preserve-unknown-fields`;
- `x-kubernetes-embedded-resource` objects may carry apiVersion, kind and metadata.

Not evaluated offline: CEL rules (`x-kubernetes-validations`), list-type uniqueness, and formats: the real
API server's tests (tests/cluster) cover them. The CRDs the tests read (the chart's ClefDecision CRD,
KServe's, KEDA's) load here.
"""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import yaml

REPO = pathlib.Path(__file__).resolve().parents[1]
CLEF_CRD = REPO / "charts" / "clef-serving" / "crds" / "clefdecisions.yaml"
# KServe v0.20.0's CRDs and KEDA v2.17.2's ScaledObject CRD, kept in the repository (their README.md files).
KSERVE_CRDS = REPO / "tests" / "data" / "kserve-crds"
KSERVE_ISVC_CRD = KSERVE_CRDS / "serving.kserve.io_inferenceservices.yaml"
KEDA_CRD = REPO / "tests" / "data" / "keda-crds" / "keda.sh_scaledobjects.yaml"

# Keys whose value is one schema, and keys whose value is a list or a map of schemas.
_ONE_SCHEMA = ("items", "not")
_SCHEMA_LIST = ("allOf", "anyOf", "oneOf")
_SCHEMA_MAP = ("properties",)
_EMBEDDED_FIELDS = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}}


def to_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """Convert one Kubernetes structural schema node (and everything under it) to JSON Schema."""
    out = {key: value for key, value in node.items() if not key.startswith("x-kubernetes-")}
    out.pop("nullable", None)
    out.pop("default", None)
    out.pop("example", None)
    for key in _ONE_SCHEMA:
        if key in out:
            out[key] = to_json_schema(out[key])
    for key in _SCHEMA_LIST:
        if key in out:
            out[key] = [to_json_schema(item) for item in out[key]]
    for key in _SCHEMA_MAP:
        if key in out:
            out[key] = {name: to_json_schema(sub) for name, sub in out[key].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = to_json_schema(out["additionalProperties"])

    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out = {"anyOf": [{"type": "integer"}, {"type": "string"}], **out}
    if node.get("x-kubernetes-embedded-resource"):
        out["properties"] = {**_EMBEDDED_FIELDS, **out.get("properties", {})}
    preserve = node.get("x-kubernetes-preserve-unknown-fields", False)
    if out.get("type") == "object" and not preserve and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if node.get("nullable"):
        out = {"anyOf": [{"type": "null"}, out]}
    return out


def crd_version_schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    """The JSON Schema of one served version of a CustomResourceDefinition (KeyError if absent)."""
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            schema = to_json_schema(entry["schema"]["openAPIV3Schema"])
            # The API server checks ObjectMeta itself; a CRD may only narrow some of its fields.
            properties = schema.setdefault("properties", {})
            properties.setdefault("apiVersion", {"type": "string"})
            properties.setdefault("kind", {"type": "string"})
            metadata = properties.setdefault("metadata", {"type": "object"})
            metadata.pop("additionalProperties", None)
            return schema
    raise KeyError(f"{crd['metadata']['name']} serves no version {version!r}")


def crd_identity(crd: dict[str, Any]) -> tuple[str, str]:
    """(group, kind) of a CustomResourceDefinition."""
    return crd["spec"]["group"], crd["spec"]["names"]["kind"]


def iter_errors(obj: dict[str, Any], crd: dict[str, Any]) -> Iterator[str]:
    """Every schema violation of a custom resource, as 'path: message' lines."""
    group, kind = crd_identity(crd)
    obj_group, _, version = obj["apiVersion"].rpartition("/")
    if (obj_group, obj["kind"]) != (group, kind):
        yield f"$: {obj['apiVersion']}/{obj['kind']} is not a {group} {kind}"
        return
    validator = jsonschema.Draft202012Validator(crd_version_schema(crd, version))
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        yield f"{error.json_path}: {error.message}"


def validate(obj: dict[str, Any], crd: dict[str, Any]) -> None:
    """Raise AssertionError listing every violation of obj against the CRD's schema."""
    errors = list(iter_errors(obj, crd))
    if errors:
        name = obj.get("metadata", {}).get("name", "?")
        raise AssertionError(f"{obj['kind']} {name} violates its CRD schema:\n  " + "\n  ".join(errors))


def crd_validator(crd: dict[str, Any], version: str) -> jsonschema.Draft202012Validator:
    """A validator for one served version of a CRD (metadata is checked by the API server, not here)."""
    return jsonschema.Draft202012Validator(crd_version_schema(crd, version))


def errors(validator: jsonschema.Draft202012Validator, obj: Mapping[str, Any]) -> list[str]:
    """Every schema violation, as 'dotted.path: message' ('<root>' for the object itself)."""
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(dict(obj)), key=lambda e: list(map(str, e.absolute_path)))
    ]


def load_crd(path: pathlib.Path) -> dict[str, Any]:
    """A one-document CRD file (with libyaml where available: KServe's CRD is ~2 MB)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd: dict[str, Any] = yaml.load(path.read_text(), Loader=loader)  # a safe loader (yaml.SafeLoader subclass)
    return crd


@functools.cache
def _clef_crd_text() -> str:
    return CLEF_CRD.read_text()


def clef_crd() -> dict[str, Any]:
    """The chart's ClefDecision CRD (a fresh copy: callers may change it)."""
    crd: dict[str, Any] = yaml.safe_load(_clef_crd_text())
    return crd
