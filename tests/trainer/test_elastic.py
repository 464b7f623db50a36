"""An elastic two-node trainer: two real torchrun agents on loopback stand for two nodes.

`tether train --nnodes 1:2` with c10d rendezvous on a store served by `python -m trainer.rendezvous`,
BC from a small MCAP log (the real worker, rendezvous and checkpoint code; no gateway needed),
checkpoints in one shared directory. The node that runs rank 0 (it hosts the group's store and
writes the checkpoints) is killed with SIGKILL to its whole process group: the other node
re-rendezvouses alone and resumes from the newest checkpoint (the time is measured: within 60 s);
the killed node comes back and rejoins (world 2 again); a stop file ends the run on both nodes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.common.processes import spawn, stop_group
from tests.support.waiting import wait_until
from tests.trainer.test_torchrun import scripted_log

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
# The target is 60 s from kill -9 to the resumed group (measured 10.6-17.4 s here, see the printout). On this
# 2-core box shared with other jobs (load average ~20) starting a rank alone has taken 40 s: the bound is generous.
RESUME_BOUND_S = 120.0
# Rejoining has no target: the returning node's agent starts (imports torch), the survivor's agent sees it waiting
# and restarts its rank, both ranks start and train to the next checkpoint. Four starts of torch, and CI once took
# over 120 s as every test worker was starting too.
REJOIN_BOUND_S = 300.0


def _wait(predicate, timeout: float, what: str, logs: tuple[Path, ...] = ()):
    """`wait_until`, its failure ending with the end of each of `logs`."""
    def told() -> str:
        return "\n".join([what, *(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())])
    return wait_until(predicate, told, timeout=timeout, period=0.1)


def _meta(ckpt: Path) -> dict | None:
    """The newest complete checkpoint's meta.json (None before the first)."""
    try:
        return json.loads((ckpt / (ckpt / "latest").read_text().strip() / "meta.json").read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


class Node:
    """One `tether train` launcher (torchrun agent + its rank) in its own process group."""

    def __init__(self, name: str, args: list[str], tmp: Path):
        self.log = tmp / f"{name}.log"
        self.summary = tmp / f"{name}.json"
        self.out = open(self.log, "a")  # noqa: SIM115 - closed in stop()
        self.proc = spawn([sys.executable, "-m", "trainer.main", *args, "--summary", str(self.summary)],
                          cwd=ROOT, stdout=self.out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text()

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        stop_group(self.proc, grace_s=10)
        self.out.close()


def test_a_killed_node_the_other_resumes_from_the_checkpoint_and_it_rejoins(tmp_path, record_property):
    scripted_log(tmp_path / "log", n=600)
    rdzv = spawn([sys.executable, "-m", "trainer.rendezvous", "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE,
                 text=True)
    nodes: list[Node] = []
    try:
        endpoint = rdzv.stdout.readline().split()[-1]
        ckpt, stop = tmp_path / "ckpt", tmp_path / "stop"
        args = ["--nnodes", "1:2", "--rdzv-endpoint", endpoint, "--rdzv-id", "elastic-test", "--rdzv-external",
                "--nproc", "1", "--max-restarts", "5", "--algo", "bc", "--arch", "mlp",
                "--experience-dir", str(tmp_path / "log"), "--steps", "100000", "--stop-file", str(stop),
                "--batch", "32", "--checkpoint-every", "10", "--checkpoint-dir", str(ckpt), "--status-every", "5",
                "--step-sleep", "0.03", "--seed", "0"]
        started = time.monotonic()
        nodes = [Node("a", args, tmp_path), Node("b", args, tmp_path)]
        logs = tuple(n.log for n in nodes)
        _wait(lambda: (m := _meta(ckpt)) and m["world_size"] == 2, 180, "a checkpoint of the two-node group", logs)
        formed_s = time.monotonic() - started

        victim = next(n for n in nodes if "[trainer] bc:" in n.text())  # rank 0 prints the status lines
        survivor = next(n for n in nodes if n is not victim)
        before = _meta(ckpt)["step"]
        survivor_text = len(survivor.text())
        killed_at = time.monotonic()
        victim.kill9()

        line = _wait(lambda: next((ln for ln in survivor.text()[survivor_text:].splitlines()
                                   if "resuming from" in ln and "world 1" in ln), None), RESUME_BOUND_S,
                     "the survivor resumes alone from the checkpoint", logs)
        resumed_s = time.monotonic() - killed_at
        resumed = _wait(lambda: (m := _meta(ckpt)) and m["world_size"] == 1 and m, RESUME_BOUND_S,
                        "the survivor's first checkpoint", logs)
        progressed_s = time.monotonic() - killed_at
        resumed_step = int(line.split("(step ")[1].split(",")[0])
        assert before <= resumed_step < resumed["step"]  # resumed from the newest checkpoint, then went on

        back = Node("c", args, tmp_path)  # the killed node comes back
        nodes.append(back)
        back_at = time.monotonic()
        rejoined = _wait(lambda: (m := _meta(ckpt)) and m["world_size"] == 2 and m["step"] > resumed["step"] and m,
                         REJOIN_BOUND_S, "the node that came back rejoins the group", (*logs, back.log))
        rejoined_s = time.monotonic() - back_at

        stop.touch()
        stopping = time.monotonic()
        for node in (survivor, back):
            assert node.proc.wait(120) == 0, node.text()[-3000:]
        stopped_s = time.monotonic() - stopping
        summaries = [json.loads(n.summary.read_text()) for n in (survivor, back) if n.summary.exists()]
        (summary,) = summaries  # rank 0's, on one of the two nodes
        assert summary["world_size"] == 2 and summary["steps"] >= rejoined["step"]
        assert summary["param_sha256"][0] == summary["param_sha256"][1]  # one model on both nodes again
        print(f"elastic: two-node group checkpointed {formed_s:.1f} s after start; resumed {resumed_s:.1f} s after "
              f"kill -9 (first checkpoint alone {progressed_s:.1f} s), "
              f"rejoined {rejoined_s:.1f} s after restart; both exited {stopped_s:.1f} s after the stop file")
        record_property("resume_s", round(resumed_s, 1))
        record_property("rejoin_s", round(rejoined_s, 1))
        assert resumed_s <= RESUME_BOUND_S
    finally:
        for node in nodes:
            node.stop()
        stop_group(rdzv, grace_s=10)
