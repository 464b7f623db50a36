"""`tether train --algo sac` as a real process (torchrun, one rank) against the stand-in gateway, whose
MuJoCo actors act with the newest published version: the replay is seeded from a previous run's MCAP log
before the first live transition, the live stream's interventions land in the demonstration half,
versions are published with SAC lineage, and a learner killed mid-run resumes from its checkpoint. With
`--experience nats://...` (a real nats-server) it reads the JetStream stream instead, acknowledged after its
checkpoints."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from protos import bridge_pb2, codec, experience_pb2
from tests.trainer.standin import StandIn, env_specs, stream_state, streaming
from tests.trainer.test_torchrun import tether_train
from tether.cluster.nats import nats_server_binary
from trainer.sources import write_transitions

pytestmark = pytest.mark.slow


def _wait_for(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _person(step: int, *, last: bool) -> experience_pb2.Transition:
    """A step where a person's command acted: `action` the policy's own, `applied_action` the person's."""
    obs = np.full(4, 0.01 * step, np.float32)
    t = experience_pb2.Transition(
        session="teleop-0", episode=0, step=step, step_type=bridge_pb2.FIRST if step == 0 else bridge_pb2.MID,
        policy="pendulum", policy_version=1, reward=1.0, terminated=last, intervention=True,
        observation=[codec.encode("observation", obs)], action=[codec.encode("action", np.full(1, 2.5, np.float32))],
        applied_action=[codec.encode("action", np.full(1, -0.5, np.float32))])
    if last:
        t.next_observation.extend([codec.encode("observation", obs)])
    return t


@pytest.mark.timeout(300)
def test_sac_seeds_from_a_previous_log_learns_interventions_publishes_and_resumes_after_a_kill(tmp_path):
    obs, act = env_specs("InvertedPendulum-v5")
    with StandIn(obs, act, policy="pendulum") as previous:   # a previous run: its log, written as MCAP
        previous.start_actors("InvertedPendulum-v5", 2)
        _wait_for(lambda: len(previous.log) >= 600, "the previous run's transitions")
        old = list(previous.log[:600])
    (tmp_path / "old").mkdir()
    write_transitions(tmp_path / "old" / "seg-000.mcap", old[:300])
    write_transitions(tmp_path / "old" / "seg-001.mcap", old[300:])

    with StandIn(obs, act, policy="pendulum") as gw:
        for step in range(20):
            gw.append(_person(step, last=step == 19))
        gw.start_actors("InvertedPendulum-v5", 2)
        summary, stderr = tether_train(
            "--nproc", "1", "--max-restarts", "1", "--gateway", gw.address, "--algo", "sac", "--policy", "pendulum",
            "--seed-log", str(tmp_path / "old"), "--steps", "240", "--batch", "64", "--critic-hidden", "32,32",
            "--learning-starts", "100", "--publish-every", "80", "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--checkpoint-every", "100", "--fail-at-step", "150", "--fail-rank", "0", "--status-every", "0.5")
        publishes = list(gw.publishes)
    seeded = int(re.search(r"seeded (\d+) transitions -> (\d+) rows", stderr).group(2))
    assert 500 < seeded <= 600 and summary["seeded"] == 600          # each session's last step waits for s'
    assert summary["buffer_at_start"] == seeded                      # used before the first live transition
    assert summary["offline_rows"] == seeded + 20 and summary["interventions"] == 20   # the person's steps
    assert summary["online_rows"] > 0 and summary["steps"] == 240
    # killed at step >= 150 (after the checkpoint of step 100), restarted by torchrun, resumed from step 100
    assert "failing on purpose" in stderr and "resuming from" in stderr and "step-00000100" in stderr, stderr[-3000:]
    assert summary["restarts"] == 1
    assert publishes and all(h.lineage.algo == "sac" and h.lineage.trainer.startswith("sac@") for h in publishes)
    parents = [h.lineage.parent_version for h in publishes]
    assert parents == list(range(1, len(publishes) + 1)), parents   # each version's parent: the one before it,
                                                                     # across the restart too
    assert summary["final_version"] == max(summary["published_versions"]) >= 2


@pytest.mark.timeout(300)
@pytest.mark.skipif(nats_server_binary() is None, reason="nats-server not installed (apt-get install nats-server)")
def test_sac_reads_the_nats_stream_and_acks_after_its_checkpoints(tmp_path):
    with streaming(tmp_path) as (gw, url):
        summary, _ = tether_train(
            "--nproc", "1", "--max-restarts", "0", "--gateway", gw.address, "--experience", url, "--algo", "sac",
            "--policy", "pendulum", "--steps", "240", "--batch", "64", "--critic-hidden", "32,32",
            "--learning-starts", "100", "--publish-every", "80", "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--checkpoint-every", "100")
        publishes = list(gw.publishes)
        consumer, stream = stream_state(url, "tether-train-pendulum-r0")
    assert summary["steps"] == 240 and summary["online_rows"] > 0, summary
    assert not gw.subscriptions, "the trainer read the stream, not the gateway's Experience.Subscribe"
    assert publishes and all(h.lineage.algo == "sac" for h in publishes)
    assert summary["final_version"] == max(summary["published_versions"]) >= 2
    # the checkpoint at the end committed every transition the run polled (all of them this policy's, shard 0)
    assert summary["rows"] <= consumer.ack_floor.stream_seq <= stream.state.last_seq, (consumer.ack_floor, summary)
