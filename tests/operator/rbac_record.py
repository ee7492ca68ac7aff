"""A pytest plugin: at the end of the session, write the RBAC requests each operator scenario made to a JSON file.

tests/operator/test_operator_integration.py loads it (``-p``) when it runs the scenarios in a separate pytest
process, so that its RBAC check never depends on other modules having run first in its own session.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

#: Where the record goes.
RECORD_ENV = "CLEF_RBAC_RECORD"
_observed: list[dict[str, set[tuple[str, str, str]]]] = []


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, Any, Any]:
    value = yield
    if fixturedef.argname == "observed_rbac":
        _observed.append(value)
    return value


def pytest_sessionfinish(session: pytest.Session) -> None:
    record = {name: sorted(triples) for observed in _observed for name, triples in observed.items()}
    Path(os.environ[RECORD_ENV]).write_text(json.dumps(record))
