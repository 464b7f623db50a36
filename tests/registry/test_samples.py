"""A follower gateway's samples reach the leader's figures through PostgreSQL (`monitor_samples`), a person's
interventions among them: a SampleTap on one gateway, shipped, read back by another gateway's shipper and fed
into its router's statistics and regression monitor, which then hold the follower's intervention rate."""

from __future__ import annotations

import psycopg
import pytest

from bridge.gateway.rollout.follow import feed
from bridge.gateway.rollout.router import RolloutRouter
from bridge.registry import Registry
from bridge.registry.monitor import Thresholds
from bridge.registry.samples import SampleShipper, SampleTap
from tether.cluster.postgres import PostgresServer, postgres_bin_dir

pytestmark = pytest.mark.skipif(postgres_bin_dir() is None, reason="PostgreSQL's initdb is not installed "
                                "(/usr/lib/postgresql/*/bin/initdb; Debian package postgresql)")


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with PostgresServer(tmp_path_factory.mktemp("postgres")) as pg:
        Registry(pg.url).close()  # migrates: monitor_samples with its interventions and env_steps columns
        yield pg.url


def test_a_followers_interventions_reach_the_leaders_figures(url):
    tap = SampleTap()
    for i in range(10):   # a single-env session: a person acted on 3 of its 10 steps
        tap.step("hopper", 2, 0.001, False, 0, interventions=int(i < 3), env_steps=1)
    for i in range(5):    # a 4-env session: on 2 of the 20 env steps
        tap.step("hopper", 2, 0.002, False, 0, interventions=2 if i == 0 else 0, env_steps=4)
    follower, leader = SampleShipper(url, gateway="gw-b"), SampleShipper(url, gateway="gw-a")
    try:
        assert leader.others() == []   # the leader's position: from the newest row onwards
        follower.ship(tap.drain())
        [(policy, version, bucket)] = leader.others()
    finally:
        follower.close()
        leader.close()
    assert (policy, version, bucket.steps, bucket.env_steps, bucket.interventions) == ("hopper", 2, 15, 30, 5)

    router = RolloutRouter(catalog=None, batcher=None, thresholds=Thresholds())
    feed(router, policy, version, bucket)
    stats = router.stats.get("hopper", 2)
    assert (stats["steps"], stats["intervention_steps"]) == (15, 5)
    assert stats["intervention_rate"] == pytest.approx(5 / 30)
    assert router.monitor("hopper").summary(2)["intervention_rate"] == pytest.approx(5 / 30)


def test_rows_shipped_before_the_migration_count_one_env_per_step(url):
    with psycopg.connect(url, autocommit=True) as conn:   # as an older follower writes them: no new columns
        conn.execute("INSERT INTO monitor_samples (gateway, policy, version, t_ns, returns, steps, errors, guard, "
                     "latencies, shadow_steps, shadow_failed, divergences) VALUES ('gw-old', 'ant', 1, "
                     "(extract(epoch from now()) * 1e9)::bigint, '[]', 7, 0, 0, '[0.001]', 0, 0, '[]')")
    leader = SampleShipper(url, gateway="gw-a")
    try:
        rows = [r for r in leader.others() if r[0] == "ant"]
    finally:
        leader.close()
    [(_, _, bucket)] = rows
    router = RolloutRouter(catalog=None, batcher=None, thresholds=Thresholds())
    feed(router, "ant", 1, bucket)
    stats = router.stats.get("ant", 1)
    assert (stats["steps"], stats["intervention_steps"], stats["intervention_rate"]) == (7, 0, 0.0)
