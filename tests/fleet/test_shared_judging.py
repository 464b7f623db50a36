"""The leader judges the whole fleet's sessions: two gateways on one PostgreSQL registry (in this process, the
session's Triton), every session on the follower B. A flipped version published through B goes shadow -> canary on the
leader A's decisions, fed by the samples B ships, and A rolls the regressed canary back; B's sessions follow."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from bridge.gateway.rollout.config import RolloutPlan
from bridge.registry import Thresholds
from protos import policies_pb2_grpc
from tests.gateway.rollout_helpers import Fleet, publish, variant
from tests.support.gateways import running_gateway
from tests.support.waiting import until
from tether.cluster.postgres import PostgresServer, postgres_bin_dir

pytestmark = pytest.mark.skipif(postgres_bin_dir() is None, reason="PostgreSQL's initdb is not installed "
                                "(/usr/lib/postgresql/*/bin/initdb; Debian package postgresql)")

THRESHOLDS = Thresholds(min_episodes=3, min_steps=12, max_latency_p99_ratio=1e6)  # latency: a shared box jitters
STAGED = RolloutPlan(mode="staged", shadow_steps=12, canary_labels={"robot": "a"}, canary_episodes=4,
                     thresholds=THRESHOLDS, tick_s=0.05)
LABELS = [{"robot": "a"}, {"robot": "a"}, {"robot": "b"}, {"robot": "b"}]


def test_the_leader_rolls_back_a_canary_whose_sessions_are_on_another_gateway(triton, tmp_path):
    with PostgresServer(tmp_path / "pg") as pg:
        v1 = triton.add_policy("judged")

        async def scenario():
            config = dict(triton_timeout_s=60, policy="judged", model_repository=triton.repo.root, registry=pg.url,
                          rollout=STAGED, switch="episode")
            async with running_gateway(triton.url, **config) as a, \
                    running_gateway(triton.url, **config) as b, \
                    grpc.aio.insecure_channel(b.address) as channel:
                await until(lambda: a.rollout.leading, "gateway A leading")
                assert not b.rollout.leading
                async with Fleet(b, "judged", LABELS) as fleet:
                    await fleet.round()
                    reply = await publish(policies_pb2_grpc.PoliciesStub(channel), "judged", variant(v1, flip=True))
                    assert reply.version == 2
                    # the leader judges on samples B ships every 0.5 s: wait on the state (bounded in time, not in
                    # rounds: on a fast machine 80 rounds ran before the samples reached A)
                    deadline = asyncio.get_running_loop().time() + 120
                    while b.registry.get("judged", 2).state != "rolled_back":
                        assert asyncio.get_running_loop().time() < deadline, \
                            f"v2 is {b.registry.get('judged', 2).state} after 120 s"
                        await fleet.round()
                        assert not fleet.errors, fleet.errors[:3]
                    assert a.rollout.version_stats("judged")[2]["episodes"] >= 3  # B's episodes, judged on A
                    moves = [(e.to_state, e.who) for e in b.registry.events("judged") if e.version == 2
                             and e.kind == "state"]
                    assert moves[-3:] == [("shadow", "auto"), ("canary", "auto"), ("rolled_back", "auto")], moves
                    await until(lambda: b.rollout.rollouts()["judged"].canary is None, "B following the rollback")
                    await fleet.round()
                    assert not fleet.errors and all(vs[-1] == 1 for vs in fleet.versions)

        asyncio.run(scenario())
