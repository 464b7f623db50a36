"""Following a shared registry (bridge.registry.follow) against a real PostgreSQL: the follower reports every
committed epoch (NOTIFY), reads again after the server restarts (reconnect), and exactly one LeaderLock holds the
lock until its holder goes, then another takes it."""

from __future__ import annotations

import threading
import time

import pytest

from bridge.registry import Registry, State
from bridge.registry.follow import EpochFollower, LeaderLock
from tests.registry.helpers import reach, serving
from tether.cluster.postgres import PostgresServer, postgres_bin_dir

pytestmark = pytest.mark.skipif(postgres_bin_dir() is None, reason="PostgreSQL's initdb is not installed "
                                "(/usr/lib/postgresql/*/bin/initdb; Debian package postgresql)")


def wait_for(predicate, what: str, timeout_s: float = 10.0) -> float:
    """Seconds until `predicate()` held; AssertionError naming `what` after `timeout_s`."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.005)
    return time.monotonic() - start


def test_the_follower_reports_every_epoch_and_reads_again_after_a_restart(tmp_path):
    with PostgresServer(tmp_path / "pg") as pg, Registry(pg.url) as registry:
        seen: list[int] = []
        changed = threading.Condition()

        def on_change(epoch: int) -> None:
            with changed:
                seen.append(epoch)

        follower = EpochFollower(pg.url, on_change=on_change, poll_s=5.0).start()  # a slow poll: NOTIFY must do
        try:
            wait_for(lambda: seen == [0], "the first read on connect")
            serving(registry)
            wait_for(lambda: seen[-1] == registry.epoch(), "the notify of the first change")
            reach(registry, State.LIVE)
            latency = wait_for(lambda: seen[-1] == registry.epoch(), "the notify of the last change")
            assert latency < 2.0 and seen == sorted(seen)
            pg.stop()
            wait_for(lambda: not follower.connected, "the follower noticing the server is gone")
            pg.start()
            count = len(seen)
            wait_for(lambda: follower.connected and len(seen) > count, "a read after the reconnect")
            assert seen[-1] == registry.epoch()
        finally:
            follower.stop()


def test_one_leader_and_the_lock_passes_on_when_it_goes(tmp_path):
    with PostgresServer(tmp_path / "pg") as pg:
        Registry(pg.url).close()
        a = LeaderLock(pg.url, retry_s=0.05, name="a").start(wait_s=5)
        b = LeaderLock(pg.url, retry_s=0.05, name="b").start(wait_s=5)
        try:
            assert [a.held, b.held] == [True, False]
            time.sleep(0.3)  # b keeps trying: still not held
            assert [a.held, b.held] == [True, False]
            a.stop()  # its connection closes: the session-level lock is released
            wait_for(lambda: b.held, "b taking the lock")
            pg.kill()  # a crashed server takes every lock with it
            wait_for(lambda: not b.held, "b noticing it lost the lock", timeout_s=15)
            pg.start()
            wait_for(lambda: b.held, "b taking the lock again once the server is back", timeout_s=15)
        finally:
            a.stop()
            b.stop()
