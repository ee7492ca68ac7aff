"""What the API server does with a CRD's schema beyond JSON-schema checks: defaulting, list-type uniqueness and
the ``x-kubernetes-validations`` CEL rules (evaluated with cel-python, Google's CEL in pure Python)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import celpy

_ENV = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """A copy of ``value`` with the schema's defaults filled in, as the API server defaults before validating."""
    value = copy.deepcopy(value)
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        value = [apply_defaults(schema["items"], item) for item in value]
    return value


def _evaluate(rule: str, value: Any) -> bool:
    program = _PROGRAMS.get(rule)
    if program is None:
        program = _PROGRAMS[rule] = _ENV.program(_ENV.compile(rule))
    result = program.evaluate({"self": celpy.json_to_cel(value)})
    if isinstance(result, Exception):
        raise result
    return bool(result)


def rule_errors(schema: Mapping[str, Any], value: Any, path: str = "spec") -> list[str]:
    """Every failed CEL rule and list-type violation in ``value``, as 'path: message'."""
    found: list[str] = []
    for validation in schema.get("x-kubernetes-validations") or []:
        try:
            ok = _evaluate(validation["rule"], value)
        except Exception as exc:  # noqa: BLE001  (a runtime error fails the rule, as in the API server)
            found.append(f"{path}: {validation['rule']}: {exc}")
            continue
        if not ok:
            found.append(f"{path}{validation.get('fieldPath', '')}: {validation.get('message', validation['rule'])}")
    if isinstance(value, list):
        kind = schema.get("x-kubernetes-list-type")
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen = [tuple(item.get(key) for key in keys) if kind == "map" else repr(item) for item in value]
        if kind in ("map", "set") and len(set(seen)) != len(seen):
            found.append(f"{path}: Duplicate value")
        for index, item in enumerate(value):
            if isinstance(schema.get("items"), Mapping):
                found += rule_errors(schema["items"], item, f"{path}[{index}]")
    elif isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value:
                found += rule_errors(sub, value[name], f"{path}.{name}")
    return found
