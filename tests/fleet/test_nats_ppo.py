"""`tether train --algo ppo --experience nats://...`: PPO reads its transitions from the JetStream stream
(real nats-server, real MuJoCo actors stepping the served weights, the trainer's Policies stand-in) and
acknowledges them only after each checkpoint: the run reaches its steps, and its durable consumer's ack
floor ends past what it trained on and within what the stream holds."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path

import pytest

from bridge.experience.jetstream import STREAM, connect
from bridge.experience.jetstream_log import JetStreamLog
from protos import experience_pb2
from sim.mujoco import make_env
from tests.trainer.standin import StandIn
from tether.cluster.nats import NatsCluster, nats_server_binary

pytestmark = [pytest.mark.slow, pytest.mark.skipif(nats_server_binary() is None,
                                                   reason="nats-server not installed (apt-get install nats-server)")]

ROOT = Path(__file__).resolve().parents[2]


def _forward(gw: StandIn, url: str, stop: threading.Event) -> None:
    """The stand-in's log into the stream, as a gateway with --experience would (steps numbered per session)."""

    async def run() -> None:
        steps: dict[str, int] = defaultdict(int)
        async with JetStreamLog(url, name="test-forwarder") as log:
            done = 0
            while not stop.is_set():
                with gw.cond:
                    new = gw.log[done:]
                done += len(new)
                for t in new:
                    copy = experience_pb2.Transition()
                    copy.CopyFrom(t)
                    copy.step = steps[t.session]
                    steps[t.session] += 1
                    log.append(copy)
                await asyncio.sleep(0.02)

    asyncio.run(run())


async def _consumer(url: str, durable: str):
    nc = await connect([url], name="test")
    try:
        js = nc.jetstream()
        return await js.consumer_info(STREAM, durable), await js.stream_info(STREAM)
    finally:
        await nc.close()


def test_ppo_reads_the_stream_and_acks_after_its_checkpoints(tmp_path):
    env = make_env("InvertedPendulum-v5")
    obs, act = env.observation_spec()[0], env.action_spec()[0]
    env.close()
    with NatsCluster(tmp_path / "nats", servers=1) as cluster, StandIn(obs, act, policy="pendulum") as gw:
        stop = threading.Event()
        forwarder = threading.Thread(target=_forward, args=(gw, cluster.url, stop), daemon=True)
        forwarder.start()
        gw.start_actors("InvertedPendulum-v5", 2)
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "trainer.main", "--nproc", "1", "--max-restarts", "0", "--gateway", gw.address,
                 "--experience", cluster.url, "--algo", "ppo", "--policy", "pendulum", "--steps", "8",
                 "--batch", "128", "--epochs", "1", "--minibatches", "4", "--target-kl", "0",
                 "--checkpoint-dir", str(tmp_path / "ckpt")], cwd=ROOT, capture_output=True, text=True, timeout=240)
        finally:
            stop.set()
            forwarder.join(timeout=30)
        assert proc.returncode == 0, proc.stderr[-4000:]
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        consumer, stream = asyncio.run(_consumer(cluster.url, "tether-train-pendulum-r0"))
    assert summary["steps"] == 8 and summary["iterations"] == 2, summary
    assert not gw.subscriptions, "the trainer read the stream, not the gateway's Experience.Subscribe"
    # committed after each of the 2 checkpoints: at least the 2 x 128 transitions the updates used
    assert 256 <= consumer.ack_floor.stream_seq <= stream.state.last_seq, (consumer.ack_floor, stream.state)
