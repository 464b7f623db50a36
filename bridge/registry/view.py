"""What status pages read of a shared registry, served from memory: the event loop never waits on PostgreSQL.

    view = view_of(registry)        # one per registry; a SQLite registry (one machine, a local file) is its own view
    view.policies(); view.versions("hopper"); view.rollout("hopper")       # from the last snapshot
    view.latest_events(limit=100); view.events("", since_id=cursor)        # the newest MAX_EVENTS audit events
    await view.check("promote")     # RegistryUnavailable at once, or within CHECK_TIMEOUT_S, when it does not answer

On a PostgreSQL registry the view is a snapshot: every policy's rollout and versions and the newest audit events, read
in a thread (`refresh`) when the view is made and after every epoch the gateway's follower catches up with (it is one
of `registry.listeners`: bridge.gateway.rollout.follow runs them in a thread after each NOTIFY, reconnect and poll);
while the database is unreachable it keeps serving what it read last (`age_s` says how old). Fleet.Status and the
console's /api/state read it (bridge.console), never the database.

`check` is for changes on a request path (promote, rollback, pin, canary, an e-stop's release): one probe at a time in
a thread, `SELECT epoch` on the registry's connection; no answer within CHECK_TIMEOUT_S (or the probe before it still
waiting) raises RegistryUnavailable ("registry unreachable: ..."), so a change is refused with a clear error instead of
hanging, and nothing of it was sent to the database.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections import deque

from bridge.registry.errors import RegistryError, RegistryUnavailable, UnknownVersion
from bridge.registry.model import Event, Rollout, VersionRecord

__all__ = ["CHECK_TIMEOUT_S", "MAX_EVENTS", "RegistryView", "view_of"]

log = logging.getLogger("tether.registry")
MAX_EVENTS = 1000        # the newest audit events kept
CHECK_TIMEOUT_S = 1.5    # a change's reachability probe waits this long
_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_VIEWS_LOCK = threading.Lock()


def view_of(registry):
    """The view of `registry` (made once, registered as its listener); a registry that is not shared, or None,
    is returned as it is: its reads are a local file's."""
    if registry is None or not getattr(registry, "shared", False):
        return registry
    with _VIEWS_LOCK:
        view = _VIEWS.get(registry)
        if view is None:
            view = _VIEWS[registry] = RegistryView(registry)
    return view


class RegistryView:
    """See the module docstring. Reads are plain dict lookups (the event loop may call them); `refresh` blocks."""

    shared = True

    def __init__(self, registry):
        self.registry = registry
        self.refreshed_at = 0.0  # time.monotonic() of the last complete refresh (0: none yet)
        self._versions: dict[str, list[VersionRecord]] = {}
        self._rollouts: dict[str, Rollout] = {}
        self._events: deque[Event] = deque(maxlen=MAX_EVENTS)
        self._cursor = 0
        self._refreshing = threading.Lock()
        self._probe: asyncio.Future | None = None
        registry.listeners.append(self.refresh)
        self.refresh()

    @property
    def age_s(self) -> float | None:
        return None if not self.refreshed_at else time.monotonic() - self.refreshed_at

    def refresh(self) -> None:
        """Read the snapshot (blocking: a thread). Unreachable: what was read before stays, logged."""
        with self._refreshing:
            try:
                _, rollouts = self.registry.snapshot(None)
                versions = {name: self.registry.versions(name) for name in rollouts}
                if self._cursor == 0:
                    fresh = self.registry.latest_events(limit=MAX_EVENTS)
                else:
                    fresh = []
                    while batch := self.registry.events(since_id=self._cursor, limit=MAX_EVENTS):
                        fresh += batch
                        self._cursor = batch[-1].id
                        if len(batch) < MAX_EVENTS:
                            break
            except RegistryError as exc:
                log.warning("registry view: %s; serving the snapshot read %s", exc,
                            f"{self.age_s:.1f} s ago" if self.refreshed_at else "never (empty)")
                return
            self._rollouts, self._versions = rollouts, versions  # replaced whole: readers see one or the other
            self._events.extend(fresh)
            if fresh:
                self._cursor = fresh[-1].id
            self.refreshed_at = time.monotonic()

    # -- reads (memory) --------------------------------------------------------------------------------------

    def policies(self) -> list[str]:
        return sorted(self._rollouts)

    def versions(self, policy: str) -> list[VersionRecord]:
        return list(self._versions.get(policy, ()))

    def rollout(self, policy: str) -> Rollout:
        rollout = self._rollouts.get(policy)
        if rollout is None:
            raise UnknownVersion(f"policy {policy!r} has no versions in the registry (as last read)")
        return rollout

    def events(self, policy: str | None = None, *, since_id: int = 0, limit: int = 200,
               version: int | None = None) -> list[Event]:
        """As Registry.events, over the newest MAX_EVENTS events read."""
        out = [e for e in list(self._events) if e.id > since_id and (policy is None or e.policy == policy)
               and (version is None or e.version == version)]
        return out[:limit]

    def latest_events(self, policy: str | None = None, *, limit: int = 200,
                      before_id: int | None = None) -> list[Event]:
        """As Registry.latest_events, over the newest MAX_EVENTS events read."""
        out = [e for e in list(self._events) if (before_id is None or e.id < before_id)
               and (policy is None or e.policy == policy)]
        return out[-limit:]

    # -- a change's reachability -----------------------------------------------------------------------------

    async def check(self, what: str, timeout_s: float = CHECK_TIMEOUT_S) -> None:
        """RegistryUnavailable naming `what` unless the registry answers a probe within `timeout_s`."""
        probe = self._probe
        if probe is not None and not probe.done():
            raise RegistryUnavailable(f"registry unreachable: {self.registry.where}: {what} refused: the database "
                                      f"has not answered a probe for over {timeout_s:g} s")
        if probe is None or probe.done():
            probe = self._probe = asyncio.get_running_loop().run_in_executor(None, self.registry.epoch)
            probe.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved, whatever it was
        try:
            await asyncio.wait_for(asyncio.shield(probe), timeout_s)
        except TimeoutError:
            raise RegistryUnavailable(f"registry unreachable: {self.registry.where}: {what} refused: no answer "
                                      f"within {timeout_s:g} s") from None
