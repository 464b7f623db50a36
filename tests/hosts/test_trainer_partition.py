"""An elastic two-node trainer across hosts, one node's host partitioned (its packets dropped, no reset), then healed.

Three lab hosts on the "trainers" network: the rendezvous store (`python -m trainer.rendezvous` bound to exactly
its trainers address, a random run id from `--new-id-file`) and two nodes, each running `tether train --nnodes 1:2
--rdzv-id-file ... --local-addr <its address>` inside its host (BC from a small MCAP log, checkpoints in one
shared folder). The node running rank 0 (it hosts the group's store and writes the checkpoints: the harder
half to lose) is partitioned. Shown by state: the other node re-rendezvouses alone and resumes from the newest
checkpoint, its checkpoints' steps go on; after the heal the partitioned node rejoins (world 2 in the
checkpoints and the summary, one model on both nodes); at no time did two groups write checkpoints (the
steps of `latest` never go back); a stop file ends the run on both nodes with exit 0.

How a silent peer is found (trainer/main.py, trainer/dist.py): the survivor's rank is blocked in a gloo
collective with the partitioned rank, and gloo's timeout (`TETHER_COLLECTIVE_TIMEOUT_S`, trainer.dist) fails
it; its agent then re-rendezvouses, where the partitioned node's keep-alive (every 2 s, dead after 3 misses:
`keep_alive_interval=2,keep_alive_max_attempt=3`) has stopped, and the survivor closes the round alone
(`--nnodes 1:2`, `last_call_timeout=2`). The partition is healed within 60 s: a longer one kills the cut-off
node's torchrun agent (its store calls time out, see AGENT_STORE_TIMEOUT_S) and that node then needs a restart.
"""

from __future__ import annotations

import json
import re
import sys
import time

import pytest

from tests.hosts.trainer_nodes import CheckpointWatch, HostNode, Rendezvous
from tests.support.hosts import Lab, namespaces_possible
from tests.trainer.test_elastic import _meta as meta
from tests.trainer.test_elastic import _wait as wait
from tests.trainer.test_torchrun import scripted_log

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(namespaces_possible()), reason=namespaces_possible() or "-")]
# From partition to the survivor's "resuming from ... world 1" line: the collective timeout, the
# rendezvous's verdict on the silent node, a new rank's start (40 s alone on this loaded 2-core box).
RESUME_BOUND_S = 120.0
REJOIN_BOUND_S = 150.0
# how long a rank waits in a gloo collective for a silent peer (trainer.dist; its default is 120 s)
COLLECTIVE_TIMEOUT_S = "20"
# The cut-off node's torchrun agent asks the rendezvous store for waiting nodes every monitor interval; a store
# call unanswered for the c10d backend's read_timeout (60 s, torch's default) raises out of the agent, which
# exits 1 (measured: "RendezvousConnectionError ... wait timeout after 60000ms" from num_nodes_waiting).
AGENT_STORE_TIMEOUT_S = 60.0


def test_a_partitioned_trainer_host_the_other_goes_on_alone_and_it_rejoins_after_the_heal(tmp_path,
                                                                                        record_property):
    scripted_log(tmp_path / "log", n=600)
    ckpt, stop = tmp_path / "ckpt", tmp_path / "stop"
    with Lab() as lab:
        rdzv = Rendezvous(lab.host("rdzv", networks=("trainers",)), tmp_path)
        hosts = [lab.host(f"node{i}", networks=("trainers",)) for i in range(2)]
        args = [*rdzv.args(), "--nnodes", "1:2", "--nproc", "1", "--max-restarts", "10", "--algo", "bc",
                "--arch", "mlp", "--experience-dir", str(tmp_path / "log"), "--steps", "100000", "--stop-file",
                str(stop), "--batch", "32", "--checkpoint-every", "10", "--checkpoint-dir", str(ckpt),
                "--status-every", "5", "--step-sleep", "0.03", "--seed", "0"]
        nodes: list[HostNode] = []
        watch = None
        try:
            started = time.monotonic()
            nodes = [HostNode(h.name, h, args, tmp_path, env={"TETHER_COLLECTIVE_TIMEOUT_S": COLLECTIVE_TIMEOUT_S})
                     for h in hosts]
            logs = tuple(n.log for n in nodes) + (tmp_path / "rendezvous.log",)
            watch = CheckpointWatch(ckpt)
            wait(lambda: (m := meta(ckpt)) and m["world_size"] == 2, 180, "a checkpoint of the two-node group", logs)
            formed_s = time.monotonic() - started

            victim = next(n for n in nodes if "[trainer] bc:" in n.text())  # rank 0 prints the status lines
            survivor = next(n for n in nodes if n is not victim)
            before = meta(ckpt)["step"]
            marks = {n.name: len(n.text()) for n in nodes}
            partitioned_at = time.monotonic()
            lab.partition(victim.host)

            line = wait(lambda: next(iter(survivor.lines_since(marks[survivor.name], "resuming from", "world 1")),
                                     None), RESUME_BOUND_S, "the survivor resumes alone from the checkpoint", logs)
            resumed_s = time.monotonic() - partitioned_at
            alone = wait(lambda: (m := meta(ckpt)) and m["world_size"] == 1 and m, RESUME_BOUND_S,
                         "the survivor's first checkpoint alone", logs)
            progressed_s = time.monotonic() - partitioned_at
            resumed_step = int(re.search(r"\(step (\d+),", line)[1])
            assert before <= resumed_step < alone["step"], (before, line, alone)
            cut_off_failed = bool(victim.lines_since(marks[victim.name], "Timed out waiting"))
            # the cut-off half never formed a group of its own: it could not reach the rendezvous
            cut_off = victim.lines_since(marks[victim.name], "resuming from")
            assert not cut_off, cut_off
            assert victim.proc.poll() is None, victim.text()[-3000:]  # its agent waits for the network

            healed_at = time.monotonic()
            lab.heal(victim.host)
            # a longer partition kills the cut-off node's agent (see AGENT_STORE_TIMEOUT_S): it would not rejoin
            assert healed_at - partitioned_at < AGENT_STORE_TIMEOUT_S, f"healed {healed_at - partitioned_at:.1f} s"
            rejoined = wait(lambda: (m := meta(ckpt)) and m["world_size"] == 2 and m["step"] > alone["step"] and m,
                            REJOIN_BOUND_S, "the healed node rejoins the group", logs)
            rejoined_s = time.monotonic() - healed_at
            back = victim.lines_since(marks[victim.name], "resuming from", "world 2")
            back += survivor.lines_since(marks[survivor.name], "resuming from", "world 2")
            assert back, "neither node logged the two-node group's resume"

            stop.touch()
            stopping = time.monotonic()
            for node in nodes:
                assert node.proc.wait(120) == 0, node.text()[-3000:]
            stopped_s = time.monotonic() - stopping
        finally:
            history = watch.stop() if watch else []
            for node in nodes:
                node.stop()
            rdzv.stop()
    summaries = [json.loads(n.summary.read_text()) for n in nodes if n.summary.exists()]
    (summary,) = summaries  # rank 0's, on one of the two nodes
    assert summary["world_size"] == 2 and summary["steps"] >= rejoined["step"], summary
    assert summary["param_sha256"][0] == summary["param_sha256"][1]  # one model on both nodes again
    steps = [step for _, step, _ in history]
    assert steps == sorted(steps), f"latest went back: two groups wrote checkpoints: {history}"
    print(f"trainer partition: two-node group checkpointed {formed_s:.1f} s after start; partitioned "
          f"{victim.name} (rank 0): survivor resumed alone {resumed_s:.1f} s after (first checkpoint alone "
          f"{progressed_s:.1f} s, step {resumed_step} -> {alone['step']}), the cut-off "
          f"rank's collective {'had' if cut_off_failed else 'had not yet'} timed out; healed "
          f"{healed_at - partitioned_at:.1f} s after: rejoined "
          f"{rejoined_s:.1f} s after (step {rejoined['step']}); both exited {stopped_s:.1f} s after the stop file; "
          f"checkpoints (s, step, world): {history[:3]} ... {history[-3:]}", file=sys.stderr)
    record_property("resume_s", round(resumed_s, 1))
    record_property("rejoin_s", round(rejoined_s, 1))
