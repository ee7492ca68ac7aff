"""What every reliability script shares (``reliability.common``)."""

from __future__ import annotations

import pytest

from reliability.common import loopback_url


def test_reliability_scripts_refuse_other_hosts() -> None:
    assert loopback_url("http://127.0.0.1:1/") == "http://127.0.0.1:1"
    with pytest.raises(SystemExit, match="not a loopback address"):
        loopback_url("http://192.0.2.1:8080")
