"""Wait on state, never on the clock: poll a predicate until it holds or a deadline passes.

    wait_until(lambda: proc.poll() is not None, what="the gateway exited", timeout=10)
    await until(lambda: len(session.trips) >= 20, what="20 steps", timeout=60)

Both return the predicate's first truthy value and fail with `what` when it never came.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["until", "wait_until"]

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], *, what: str, timeout: float = 10.0, period: float = 0.02) -> T:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(period)
    return value


async def until(predicate: Callable[[], T], *, what: str, timeout: float = 30.0, period: float = 0.005) -> T:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        await asyncio.sleep(period)
    return value
