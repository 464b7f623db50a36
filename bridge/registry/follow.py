"""Following a shared registry: the epoch other gateways commit, and the one leader among them.

    follower = EpochFollower(registry.path, on_change=lambda epoch: ..., poll_s=1.0)   # a thread of its own
    follower.start()       # LISTEN tether_registry; on_change(epoch) on every NOTIFY, after every reconnect
    ...                    # (the epoch read again: nothing missed while it was away) and on the poll backstop
    follower.stop()

    leader = LeaderLock(registry.path)                      # pg_try_advisory_lock on a connection of its own
    leader.start()
    if leader.held: ...    # this gateway judges canaries, rolls back and reconciles; the others only serve
    leader.stop()          # (and a holder that dies drops its connection: the lock passes to another gateway)

Both run in daemon threads with their own psycopg connections, reconnecting every `retry_s` while the server is
unreachable; neither touches the registry's own connection. With a SQLite registry there is one gateway:
`Leadership.alone()` is always held and nothing needs following.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable

from bridge.registry.backends import NOTIFY_CHANNEL, connect, shown
from bridge.registry.errors import RegistryUnavailable

log = logging.getLogger("tether.registry")

LEADER_LOCK_KEY = 7_461_636_802   # pg_try_advisory_lock: the gateway that judges, rolls back and reconciles
WAKE_S = 0.2                      # the follower's longest wait for a NOTIFY before it checks whether to stop


class _ConnectionThread:
    """A daemon thread running the subclass's `_run`, with a psycopg connection of its own (`_conn`);
    `stop()` ends it."""

    def __init__(self, name: str):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._conn = None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


class EpochFollower(_ConnectionThread):
    """Calls `on_change(epoch)` from its thread whenever the committed epoch differs from the last one it
    reported (and once after every (re)connect, whatever the epoch). `epoch`: the last one seen; `connected`."""

    def __init__(self, url: str, *, on_change: Callable[[int], None], poll_s: float = 1.0, retry_s: float = 0.2):
        self.url, self.on_change, self.poll_s, self.retry_s = url, on_change, poll_s, retry_s
        self.epoch = -1
        self.connected = False
        super().__init__("registry-follower")

    def start(self) -> EpochFollower:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._conn = connect(self.url, application_name=f"tether-follower pid={os.getpid()}")
                self._conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                self.connected = True
                self._report(force=True)  # re-read on (re)connect: whatever was committed while away
                polled = time.monotonic()
                while not self._stop.is_set():  # short waits: stop() is answered within WAKE_S
                    notified = any(True for _ in self._conn.notifies(timeout=WAKE_S, stop_after=1))
                    if notified or time.monotonic() - polled >= self.poll_s:  # a NOTIFY, or the poll backstop
                        self._report(force=False)
                        polled = time.monotonic()
            except RegistryUnavailable as exc:
                self._lost(exc)
            except Exception as exc:  # noqa: BLE001 (the connection broke: psycopg's errors; reported, retried)
                self._lost(exc)
            if not self._stop.is_set():
                self._stop.wait(self.retry_s)
        self._close()

    def _report(self, *, force: bool) -> None:
        epoch = self._conn.execute("SELECT epoch FROM registry_epoch WHERE id = 1").fetchone()[0]
        if force or epoch != self.epoch:
            self.epoch = epoch
            try:
                self.on_change(epoch)
            except Exception:  # the callback's failure is its own; the follower goes on
                log.exception("registry follower: on_change(%d) failed", epoch)

    def _lost(self, exc: Exception) -> None:
        if self.connected and not self._stop.is_set():
            log.warning("registry follower: %s: %s; serving epoch %d until it is back", shown(self.url),
                        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, self.epoch)
        self.connected = False
        self._close()


class LeaderLock(_ConnectionThread):
    """A session-level advisory lock on a dedicated connection: `held` while this process holds it. Tried every
    `retry_s` while not held; while held, the connection is checked every `check_s` (a lost connection is a lost
    lock: another gateway may hold it by then). `on_change(held)` from the thread when it flips. Its connection's
    application_name is `name` (default "tether-leader pid=<this process>"): pg_stat_activity shows who leads."""

    def __init__(self, url: str, *, key: int = LEADER_LOCK_KEY, retry_s: float = 0.5, check_s: float = 0.5,
                 on_change: Callable[[bool], None] | None = None, name: str | None = None):
        self.url, self.key, self.retry_s, self.check_s, self.on_change = url, key, retry_s, check_s, on_change
        self.name = name or f"tether-leader pid={os.getpid()}"
        self.held = False
        self._first = threading.Event()
        super().__init__("registry-leader")

    def start(self, *, wait_s: float = 0.0) -> LeaderLock:
        """Start trying; `wait_s` > 0 waits that long for the first try to finish (held or not)."""
        self._thread.start()
        if wait_s > 0:
            self._first.wait(wait_s)
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._conn is None:
                    self._conn = connect(self.url, application_name=self.name)
                if not self.held:
                    if self._conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()[0]:
                        self._set(True)
                else:
                    self._conn.execute("SELECT 1")
            except Exception as exc:  # noqa: BLE001 (unreachable or broken: the lock is gone with the connection)
                if self.held:
                    log.warning("registry leader lock lost: %s", exc)
                self._close()
                self._set(False)
            self._first.set()
            self._stop.wait(self.check_s if self.held else self.retry_s)
        self._close()  # closing the connection releases the lock
        self._set(False)

    def _set(self, held: bool) -> None:
        if held != self.held:
            self.held = held
            log.info("registry leader lock %s (%s)", "held: this gateway judges and reconciles" if held
                     else "not held", shown(self.url))
            if self.on_change is not None:
                try:
                    self.on_change(held)
                except Exception:
                    log.exception("registry leader: on_change(%s) failed", held)


class Leadership:
    """Whether this gateway leads: a LeaderLock on a shared registry, always for a registry of its own."""

    def __init__(self, lock: LeaderLock | None = None):
        self.lock = lock

    @classmethod
    def alone(cls) -> Leadership:
        return cls(None)

    @property
    def held(self) -> bool:
        return True if self.lock is None else self.lock.held

    def stop(self) -> None:
        if self.lock is not None:
            self.lock.stop()
