"""The offline CRD-schema validator: Kubernetes' structural-schema extensions and unknown-field rejection."""

from __future__ import annotations

from typing import Any

import pytest

from tests import crd_schema

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "names": {"kind": "Widget", "plural": "widgets"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1},
                                    "port": {"x-kubernetes-int-or-string": True},
                                    "note": {"type": "string", "nullable": True},
                                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                    "limits": {"type": "object", "additionalProperties": {"type": "string"}},
                                    "template": {
                                        "type": "object",
                                        "x-kubernetes-embedded-resource": True,
                                        "properties": {
                                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                                        },
                                    },
                                    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}


def widget(**spec: Any) -> dict[str, Any]:
    """A Widget with the given spec."""
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "namespace": "ns", "labels": {"a": "b"}},
        "spec": {"size": 1, **spec},
    }


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"port": 8080},
        {"port": "http"},
        {"note": None},
        {"note": "text"},
        {"free": {"anything": {"nested": [1, 2]}}},
        {"limits": {"cpu": "1"}},
        {"template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"x": 1}}},
        {"tags": ["a", "b"]},
    ],
)
def test_accepts(spec: dict[str, Any]) -> None:
    crd_schema.validate(widget(**spec), CRD)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"size": 0}, r"\$\.spec\.size: 0 is less than the minimum of 1"),
        ({"port": 1.5}, r"\$\.spec\.port: 1\.5 is not valid"),
        ({"note": 3}, r"\$\.spec\.note: 3 is not valid"),
        ({"colour": "red"}, r"\$\.spec: Additional properties are not allowed \('colour' was unexpected\)"),
        ({"limits": {"cpu": 1}}, r"\$\.spec\.limits\.cpu: 1 is not of type 'string'"),
        ({"template": {"kind": "Pod", "spec": {}, "extra": 1}}, r"'extra' was unexpected"),
        ({"tags": ["c"]}, r"\$\.spec\.tags\[0\]: 'c' is not one of"),
    ],
)
def test_rejects_naming_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        crd_schema.validate(widget(**spec), CRD)


def test_rejects_missing_required_and_unknown_top_level_fields() -> None:
    obj = widget()
    del obj["spec"]["size"]
    obj["extra"] = True
    with pytest.raises(AssertionError) as caught:
        crd_schema.validate(obj, CRD)
    assert "'size' is a required property" in str(caught.value)
    assert "'extra' was unexpected" in str(caught.value)


def test_rejects_other_kinds_and_unserved_versions() -> None:
    with pytest.raises(AssertionError, match="is not a example.com Widget"):
        crd_schema.validate({**widget(), "kind": "Gadget"}, CRD)
    with pytest.raises(KeyError, match="serves no version 'v2'"):
        crd_schema.validate({**widget(), "apiVersion": "example.com/v2"}, CRD)
