"""Validate objects offline against a CRD's openAPIV3Schema (structural schema, as the API server does).

Handles ``x-kubernetes-int-or-string``, ``nullable``, ``x-kubernetes-preserve-unknown-fields`` and
``x-kubernetes-embedded-resource``, and rejects unknown fields where the schema does not preserve them
(the API server would prune them silently; a test should notice instead). CEL rules are not evaluated.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

_DROP = {
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-embedded-resource",
    "format",
    "description",
    "default",
}


def to_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Translate a structural OpenAPI v3 schema into a strict JSON schema."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROP or key in ("nullable", "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields"):
            continue
        if key == "properties":
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
            out[key] = to_json_schema(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [to_json_schema(sub) for sub in value]
        elif key == "not":
            out[key] = to_json_schema(value)
        else:
            out[key] = value
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    if schema.get("nullable") and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("x-kubernetes-embedded-resource")
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return out


def crd_validator(crd: Mapping[str, Any], version: str) -> jsonschema.Draft7Validator:
    """A validator for one served version of a CRD (metadata is checked by the API server, not here)."""
    spec = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema = to_json_schema(spec["schema"]["openAPIV3Schema"])
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def load_crd(path: Path) -> dict[str, Any]:
    """Load a CRD manifest (the fast C loader: KServe's CRD is ~2 MB)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(), Loader=loader)  # a safe loader (yaml.SafeLoader subclass)


def errors(validator: jsonschema.Draft7Validator, obj: Mapping[str, Any]) -> list[str]:
    """Every schema violation, as 'path: message'."""
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(dict(obj)), key=lambda e: list(map(str, e.absolute_path)))
    ]
