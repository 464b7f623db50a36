"""Wait on state, never on the clock: poll a predicate until it holds or a deadline passes.

    wait_until(lambda: proc.poll() is not None, "the gateway exited", timeout=10)
    await until(lambda: len(session.trips) >= 20, "20 steps", timeout=60)
    await until(lambda: stub.FleetStatus(request), "a fleet status")      # a coroutine's result, awaited each time

Both return the predicate's first truthy value and fail with AssertionError naming `what` when it never came;
`what` may be a function, called then (e.g. for the end of a process's log).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["until", "wait_until"]

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], what: str | Callable[[], str], *, timeout: float = 10.0,
               period: float = 0.02) -> T:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            _timed_out(what, timeout)
        time.sleep(period)
    return value


async def until(predicate: Callable[[], T | Awaitable[T]], what: str | Callable[[], str], *, timeout: float = 30.0,
                period: float = 0.005) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            _timed_out(what, timeout)
        await asyncio.sleep(period)


def _timed_out(what: str | Callable[[], str], timeout: float) -> None:
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")
