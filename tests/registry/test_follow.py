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
from tests.support.waiting import wait_until
from tether.cluster.postgres import PostgresServer, postgres_bin_dir

pytestmark = pytest.mark.skipif(postgres_bin_dir() is None, reason="PostgreSQL's initdb is not installed "
                                "(/usr/lib/postgresql/*/bin/initdb; Debian package postgresql)")


POLL = {"timeout": 10.0, "period": 0.005}


def test_the_follower_reports_every_epoch_and_reads_again_after_a_restart(tmp_path):
    with PostgresServer(tmp_path / "pg") as pg, Registry(pg.url) as registry:
        seen: list[int] = []
        changed = threading.Condition()

        def on_change(epoch: int) -> None:
            with changed:
                seen.append(epoch)

        # The poll backstop (60 s) is far beyond every wait (10 s): only NOTIFY can pass them
        follower = EpochFollower(pg.url, on_change=on_change, poll_s=60.0).start()
        try:
            wait_until(lambda: seen == [0], "the first read on connect", **POLL)
            serving(registry)
            wait_until(lambda: seen[-1] == registry.epoch(), "the notify of the first change", **POLL)
            reach(registry, State.LIVE)
            wait_until(lambda: seen[-1] == registry.epoch(), "the notify of the last change", **POLL)
            assert seen == sorted(seen)
            pg.stop()
            wait_until(lambda: not follower.connected, "the follower noticing the server is gone", **POLL)
            pg.start()
            count = len(seen)
            wait_until(lambda: follower.connected and len(seen) > count, "a read after the reconnect", **POLL)
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
            wait_until(lambda: b.held, "b taking the lock", **POLL)
            pg.kill()  # a crashed server takes every lock with it
            wait_until(lambda: not b.held, "b noticing it lost the lock", timeout=15, period=0.005)
            pg.start()
            wait_until(lambda: b.held, "b taking the lock again once the server is back", timeout=15, period=0.005)
        finally:
            a.stop()
            b.stop()
