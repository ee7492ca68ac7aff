"""One set of rules: every case goes through the CRD (defaults, structural schema, list types, CEL rules, as the
API server applies them) and through the operator's own model, and both must agree, naming the same field."""

from __future__ import annotations

from typing import Any

import pytest

from tests.crd_schema import clef_crd, crd_validator, errors
from tests.operator.cel import apply_defaults, rule_errors
from tests.operator.validation_cases import BASE, INVALID, VALID, operator_errors


def crd_errors(spec: dict[str, Any]) -> list[str]:
    """What the API server would refuse in a ClefDecision with this spec."""
    crd = clef_crd()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    body = apply_defaults(
        schema,
        {"apiVersion": "clef-serving.io/v1alpha1", "kind": "ClefDecision", "metadata": {"name": "c"}, "spec": spec},
    )
    return errors(crd_validator(crd, "v1alpha1"), body) + rule_errors(schema["properties"]["spec"], body["spec"])


@pytest.mark.parametrize("fields", VALID, ids=[str(i) for i in range(len(VALID))])
def test_both_accept(fields: dict[str, Any]) -> None:
    spec = {**BASE, **fields}
    assert crd_errors(spec) == []
    assert operator_errors(spec) == ""


@pytest.mark.parametrize(("fields", "field"), INVALID, ids=[f"{i}-{c[1]}" for i, c in enumerate(INVALID)])
def test_both_refuse_naming_the_field(fields: dict[str, Any], field: str) -> None:
    spec = {**BASE, **fields}
    from_crd = crd_errors(spec)
    from_operator = operator_errors(spec)
    assert from_crd, "the CRD accepts it"
    assert from_operator, "the operator accepts it"
    assert any(field in error for error in from_crd), from_crd
    assert field in from_operator, from_operator
