"""`tether train --algo ppo --experience nats://...`: PPO reads its transitions from the JetStream stream
(real nats-server, real MuJoCo actors stepping the served weights, the trainer's Policies stand-in) and
acknowledges them only after each checkpoint: the run reaches its steps, and its durable consumer's ack
floor ends past what it trained on and within what the stream holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.standin import stream_state, streaming
from tether.cluster.nats import nats_server_binary

pytestmark = [pytest.mark.slow, pytest.mark.skipif(nats_server_binary() is None,
                                                   reason="nats-server not installed (apt-get install nats-server)")]

ROOT = Path(__file__).resolve().parents[2]


def test_ppo_reads_the_stream_and_acks_after_its_checkpoints(tmp_path):
    with streaming(tmp_path) as (gw, url):
        proc = subprocess.run(
            [sys.executable, "-m", "trainer.main", "--nproc", "1", "--max-restarts", "0", "--gateway", gw.address,
             "--experience", url, "--algo", "ppo", "--policy", "pendulum", "--steps", "8", "--batch", "128",
             "--epochs", "1", "--minibatches", "4", "--target-kl", "0", "--checkpoint-dir", str(tmp_path / "ckpt")],
            cwd=ROOT, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-4000:]
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        consumer, stream = stream_state(url, "tether-train-pendulum-r0")
    assert summary["steps"] == 8 and summary["iterations"] == 2, summary
    assert not gw.subscriptions, "the trainer read the stream, not the gateway's Experience.Subscribe"
    # committed after each of the 2 checkpoints: at least the 2 x 128 transitions the updates used
    assert 256 <= consumer.ack_floor.stream_seq <= stream.state.last_seq, (consumer.ack_floor, stream.state)
