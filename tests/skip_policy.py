"""No silent skips: a test may skip only because the machine has no CUDA device or GPU; any other skip fails.

tests/conftest.py installs these hooks for the whole suite. A dependency the test environment must have is imported
plainly (a broken install fails); deselect with ``-m`` to leave tests out on purpose.
"""

from __future__ import annotations

import re
from collections.abc import Generator

import pytest

#: The allow-list: a skip's reason must say the test needs a CUDA device or a GPU (e.g. "needs a CUDA device: ...").
ALLOWED_SKIP_REASON = re.compile(r"\bneeds? an? (CUDA device|GPU)\b")


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _refuse(report: pytest.TestReport | pytest.CollectReport) -> None:
    reason = _reason(report)
    if not ALLOWED_SKIP_REASON.search(reason):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped for a reason not on the allow-list (a missing CUDA device or GPU): {reason}\n"
            "import required dependencies plainly; deselect with -m to leave tests out on purpose"
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and not hasattr(report, "wasxfail"):
        _refuse(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if report.skipped:
        _refuse(report)
    return report
