"""Waiting in tests for a state to be reached: one rule for the real cluster's blocking tests and the emulator's
asyncio ones (poll ``check`` until it returns something truthy; fail naming what was awaited and the last value)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")
WAIT = 90.0  # seconds any expected state of the real cluster may take


def eventually(check: Callable[[], T | None], what: str = "the condition", timeout: float = WAIT) -> T:
    """Poll ``check`` every 0.25 s until it returns something truthy; fail naming ``what`` at ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


async def eventually_async(
    check: Callable[[], Any | Awaitable[Any]],
    what: str = "the condition",
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
) -> Any:
    """``eventually`` inside an event loop (the emulator and the operator run in it): ``check`` may be a coroutine."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
        await asyncio.sleep(interval)
