"""A trainer's durable pull consumer on the JetStream experience stream (trainer.nats_source) with a real
nats-server: messages are acknowledged only after the checkpoint that used them; a trainer process killed
(SIGKILL) after polling but before its next checkpoint gets exactly the unacknowledged ones again when it
restarts, at once (its consumer moved back to the ack floor), and never the committed ones."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bridge.experience.jetstream_log import JetStreamLog
from protos import experience_pb2
from protos.codec import encode
from tether.cluster.nats import NatsCluster, nats_server_binary

pytestmark = pytest.mark.skipif(nats_server_binary() is None,
                                reason="nats-server not installed (apt-get install nats-server)")

ROOT = Path(__file__).resolve().parents[2]
TOTAL = 300
FIRST = 100   # used by the first checkpoint, committed
SECOND = 100  # polled after it, the process killed before the next checkpoint

TRAINER = """
import json, sys, time
from pathlib import Path
from trainer.nats_source import JetStreamSource

url, out, first, second = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
source = JetStreamSource(url, durable="trainer-r0", max_batch=37)

def take(n):
    got, deadline = [], time.monotonic() + 60
    while len(got) < n:
        got += source.poll(timeout=5.0, max_items=n - len(got))
        assert time.monotonic() < deadline, f"only {len(got)} of {n} transitions in 60 s"
    return [t.offset for t in got]

used = take(first)
(out / "checkpoint.json").write_text(json.dumps(used))   # the checkpoint holding the update is written ...
source.commit()                                          # ... then the stream may forget its data
print("committed", flush=True)
if second:
    (out / "polled.json").write_text(json.dumps(take(second)))
    print("polled", flush=True)                           # killed here: no checkpoint, no commit
    time.sleep(600)
source.close()
"""


def _trainer(url: str, out: Path, first: int, second: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", TRAINER, url, str(out), str(first), str(second)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)


def _transition(i: int) -> experience_pb2.Transition:
    return experience_pb2.Transition(session=f"robot-{i % 3}", step=i // 3, policy="tiny",
                                     observation=[encode("observation", np.full(11, i, np.float32))],
                                     action=[encode("action", np.zeros(3, np.float32))])


async def _publish(url: str) -> None:
    async with JetStreamLog(url) as log:
        await asyncio.gather(*(log.append(_transition(i)) for i in range(TOTAL)))


def _expect_line(proc: subprocess.Popen, line: str) -> None:
    got = proc.stdout.readline().strip()  # the trainer's polls are bounded (5 s each), the test's timeout too
    assert got == line, f"trainer printed {got!r} (exit {proc.poll()}), expected {line!r}"


def test_unacknowledged_transitions_come_again_after_a_killed_trainer(tmp_path):
    with NatsCluster(tmp_path / "nats", servers=1) as cluster:
        asyncio.run(_publish(cluster.url))
        first = tmp_path / "first"
        first.mkdir()
        proc = _trainer(cluster.url, first, FIRST, SECOND)
        try:
            _expect_line(proc, "committed")
            _expect_line(proc, "polled")
        finally:
            proc.kill()  # SIGKILL between a poll and its checkpoint
            proc.wait()
        committed = json.loads((first / "checkpoint.json").read_text())
        polled = json.loads((first / "polled.json").read_text())
        assert committed == list(range(FIRST)) and polled == list(range(FIRST, FIRST + SECOND))

        second = tmp_path / "second"
        second.mkdir()
        proc = _trainer(cluster.url, second, TOTAL - FIRST, 0)
        try:
            _expect_line(proc, "committed")
            assert proc.wait(timeout=60) == 0
        finally:
            proc.kill()
            proc.wait()
        again = json.loads((second / "checkpoint.json").read_text())
        assert again == list(range(FIRST, TOTAL)), "the restarted trainer gets every unacknowledged one, in order"
