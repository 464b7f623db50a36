"""A gateway on a shared (PostgreSQL) registry: it follows the rollout epoch the other gateways commit, and at most
one gateway at a time leads (judges canaries, rolls back automatically, reconciles what Triton serves).

    following = SharedRollout(registry, catch_up=controller.follow, also=[...])   # and registry.listeners
    await following.start()      # the leader lock tried once (up to 2 s), then LISTEN in a thread of its own
    following.leading            # True on the one gateway holding the advisory lock (always on SQLite)
    following.epoch              # the epoch this gateway serves (-1 before the first read)
    await following.stop()

Every NOTIFY, every reconnect and a poll every `poll_s` (the backstop) schedule `catch_up()` on the event loop
(coalesced: one runs at a time, and one more if the epoch moved meanwhile). While the database is unreachable the
gateway keeps the rollouts it last read: sessions are answered as before, changes are refused (RegistryUnavailable,
UNAVAILABLE). A SQLite registry has one gateway: it leads, and there is nothing to follow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from bridge.registry import Registry
from bridge.registry.follow import EpochFollower, LeaderLock, Leadership

log = logging.getLogger("tether.gateway")


class SharedRollout:
    """See the module docstring. `catch_up()`: re-read and serve the registry's rollouts (the controller's
    `follow`); `also` and `registry.listeners`: blocking callables run in a thread after each catch-up (the
    e-stops' cache reload is one: bridge.gateway.holds)."""

    def __init__(self, registry: Registry, *, catch_up: Callable[[], Awaitable[int | None]],
                 also: list[Callable[[], None]] | None = None, poll_s: float = 1.0):
        self.registry, self._catch_up, self.also, self.poll_s = registry, catch_up, list(also or []), poll_s
        self.leadership = Leadership.alone()
        self.epoch = -1
        self._follower: EpochFollower | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._again = False

    @property
    def leading(self) -> bool:
        return self.leadership.held

    @property
    def shared(self) -> bool:
        return self.registry.shared

    async def start(self) -> None:
        if not self.registry.shared:
            return
        url = str(self.registry.path)
        lock = LeaderLock(url)
        await asyncio.to_thread(lock.start, wait_s=2.0)
        self.leadership = Leadership(lock)
        self._loop = asyncio.get_running_loop()
        self._follower = EpochFollower(url, on_change=self._notified, poll_s=self.poll_s).start()

    async def stop(self) -> None:
        if self._follower is not None:
            await asyncio.to_thread(self._follower.stop)
        await asyncio.to_thread(self.leadership.stop)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _notified(self, epoch: int) -> None:  # the follower's thread
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._schedule)

    def _schedule(self) -> None:
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rollout-follow")

    async def _run(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            try:
                epoch = await self._catch_up()
                if epoch is not None:
                    self.epoch = epoch
                for hook in [*self.also, *self.registry.listeners]:
                    await asyncio.to_thread(hook)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (logged; the next notify or poll tries again)
                log.error("rollout follow: %s: %s", type(exc).__name__, exc)
