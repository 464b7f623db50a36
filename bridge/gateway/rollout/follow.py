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

The leader judges what every gateway's sessions show: followers ship what their sessions fed the router's
statistics and monitor every `SHIP_S` (bridge.registry.samples), and the leader feeds the others' rows into its own
(`feed`), so a canary whose sessions are all on another gateway is judged (and rolled back) all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable

from bridge.registry import Registry
from bridge.registry.follow import EpochFollower, LeaderLock, Leadership
from bridge.registry.samples import Bucket, SampleShipper, SampleTap

log = logging.getLogger("tether.gateway")
SHIP_S = 0.5   # how often a follower ships its sessions' samples, and the leader reads the others'
IN_USE_S = 10.0  # a version another gateway's sessions stepped with this recently stays loaded (shared Triton)


def feed(router, policy: str, version: int, bucket: Bucket) -> None:
    """Another gateway's samples into the router's statistics and regression monitor (as if its sessions were
    here): every return; its steps (at most a monitor window) with their latencies cycled from the sample, the
    errors and guard interventions on the first steps (counts kept), its env steps and a person's interventions
    spread evenly over them (counts kept); its shadow comparisons likewise."""
    monitor = router.monitor(policy)
    for value in bucket.returns:
        router.stats.episode(policy, version, episode_return=value)
        monitor.observe_episode(version, value)
    latencies, guard = bucket.latencies or [0.0], bucket.guard
    steps = min(bucket.steps, monitor.thresholds.window_steps)
    env_total = bucket.env_steps or bucket.steps  # rows shipped before migration 5 have none: one env per step
    for i in range(steps):
        here = guard if i == steps - 1 else min(guard, 1)
        guard -= here
        latency, error = latencies[i % len(latencies)], i < bucket.errors
        env_steps, person = _share(env_total, i, steps), _share(bucket.interventions, i, steps)
        router.stats.step(policy, version, latency_s=latency, error=error, guard=here, interventions=person,
                          env_steps=env_steps)
        monitor.observe_step(version, latency, error, here, interventions=person / env_steps if env_steps else 0.0)
    divergences = bucket.divergences or [0.0]
    for i in range(bucket.shadow_steps):
        router.stats.shadow(policy, version,
                            divergence=None if i < bucket.shadow_failed else divergences[i % len(divergences)])


def _share(total: int, i: int, n: int) -> int:
    """Step i's part of `total` spread over n steps (the parts add up to total)."""
    return total * (i + 1) // n - total * i // n


class SharedRollout:
    """See the module docstring. `catch_up()`: re-read and serve the registry's rollouts (the controller's
    `follow`); `also` and `registry.listeners`: blocking callables run in a thread after each catch-up (the
    e-stops' cache reload is one: bridge.gateway.session.holds)."""

    def __init__(self, registry: Registry, *, catch_up: Callable[[], Awaitable[int | None]], router=None,
                 also: list[Callable[[], None]] | None = None, poll_s: float = 1.0):
        self.registry, self._catch_up, self.also, self.poll_s = registry, catch_up, list(also or []), poll_s
        self.router = router  # the RolloutRouter whose samples are shipped (follower) or fed (leader)
        self._samples_task: asyncio.Task | None = None
        self._elsewhere: dict[tuple[str, int], float] = {}  # (policy, version) -> when another gateway last used it
        self.leadership = Leadership.alone()
        self.epoch = -1
        self._follower: EpochFollower | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._again = False

    @property
    def leading(self) -> bool:
        return self.leadership.held

    def in_use_elsewhere(self, policy: str) -> set[int]:
        """Versions of `policy` other gateways' sessions stepped with in the last IN_USE_S (known to the leader):
        the leader's reconcile keeps them loaded."""
        now = asyncio.get_running_loop().time()
        return {v for (p, v), seen in self._elsewhere.items() if p == policy and now - seen < IN_USE_S}

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
        if self.router is not None:
            self.router.tap = SampleTap()
            self._samples_task = self._loop.create_task(self._samples(url), name="rollout-samples")

    async def stop(self) -> None:
        if self._samples_task is not None:
            self._samples_task.cancel()
            await asyncio.gather(self._samples_task, return_exceptions=True)
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

    async def _samples(self, url: str) -> None:
        """Every SHIP_S: a follower ships its sessions' samples; the leader feeds the others' into its router."""
        shipper = SampleShipper(url, gateway=f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}")
        leading, failing = False, False
        try:
            while True:
                await asyncio.sleep(SHIP_S)
                try:
                    if self.leading:
                        if not leading:
                            shipper.forget_position()
                        leading = True
                        self.router.tap.drain()  # its own sessions fed its monitor directly
                        now = asyncio.get_running_loop().time()
                        for policy, version, bucket in await asyncio.to_thread(shipper.others):
                            feed(self.router, policy, version, bucket)
                            self._elsewhere[(policy, version)] = now
                        self._elsewhere = {k: t for k, t in self._elsewhere.items() if now - t < IN_USE_S}
                    else:
                        leading = False
                        await asyncio.to_thread(shipper.ship, self.router.tap.drain())  # lost while unreachable
                    failing = False
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 (the database is away: logged once, tried again)
                    if not failing:
                        log.warning("rollout samples: %s: %s", type(exc).__name__, exc)
                    failing = True
        finally:
            await asyncio.to_thread(shipper.close)
