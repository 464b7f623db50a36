"""Elastic `tether train` nodes on lab hosts (tests/support/hosts.py), and what a test watches of them.

    rdzv = Rendezvous(lab.host("rdzv", networks=("trainers",)), tmp)     # python -m trainer.rendezvous
    node = HostNode("node0", host, [*rdzv.args(), "--algo", "bc", ...], tmp)  # tether train inside `host`
    watch = CheckpointWatch(tmp / "ckpt")                                # every `latest` seen, with its time
    node.lines_since(mark, "resuming from")                              # rank 0's log lines after `mark`
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bridge.common.processes import stop_group
from tests.support.hosts import Host
from tests.trainer.test_elastic import _meta as meta

ROOT = Path(__file__).resolve().parents[2]
PORT = 29400
NETWORK = "trainers"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


class Rendezvous:
    """`python -m trainer.rendezvous` on `host`, bound to exactly its trainers address; a random run id file."""

    def __init__(self, host: Host, tmp: Path):
        self.id_file = tmp / "rendezvous.id"
        made = host.run([sys.executable, "-m", "trainer.rendezvous", "--new-id-file", str(self.id_file)], cwd=ROOT,
                        env=_env(), capture_output=True, text=True, timeout=60)
        assert made.returncode == 0 and self.id_file.stat().st_mode & 0o077 == 0, made.stderr
        self.address = host.address(NETWORK)
        self.proc = host.popen([sys.executable, "-m", "trainer.rendezvous", "--host", self.address, "--port",
                                str(PORT)], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
        line = self.proc.stdout.readline()
        assert line.strip() == f"rendezvous listening on {self.address}:{PORT}", (line, self.proc.poll())

    def args(self) -> list[str]:
        return ["--rdzv-endpoint", f"{self.address}:{PORT}", "--rdzv-id-file", str(self.id_file), "--rdzv-external"]

    def stop(self) -> None:
        stop_group(self.proc, grace_s=10)


class HostNode:
    """One `tether train` launcher (torchrun agent + its rank) inside `host`, in its own process group."""

    def __init__(self, name: str, host: Host, args: list[str], tmp: Path, *, env: dict[str, str] | None = None):
        self.name, self.host = name, host
        self.log = tmp / f"{name}.log"
        self.summary = tmp / f"{name}.json"
        self.out = open(self.log, "a")  # noqa: SIM115 - closed in stop()
        address = host.address(NETWORK)
        # gloo picks its interface from the host name unless told: the node's trainers link (tests/support/hosts)
        env = {**_env(), "GLOO_SOCKET_IFNAME": f"{NETWORK}0", **(env or {})}
        self.proc = host.popen([sys.executable, "-m", "trainer.main", *args, "--local-addr", address,
                                "--summary", str(self.summary)], cwd=ROOT, env=env, stdout=self.out,
                               stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text()

    def lines_since(self, mark: int, *needles: str) -> list[str]:
        """This node's log lines after character `mark` holding every one of `needles`."""
        return [ln for ln in self.text()[mark:].splitlines() if all(n in ln for n in needles)]

    def stop(self) -> None:
        stop_group(self.proc, grace_s=10)
        self.out.close()


class CheckpointWatch:
    """Polls `latest` every 0.05 s from a thread: `history` holds (seconds since start, step, world size)
    of every checkpoint seen, so a test can tell whether two groups ever wrote at the same time."""

    def __init__(self, ckpt: Path):
        self.ckpt, self.history = ckpt, []
        self._started, self._done = time.monotonic(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.05):
            m = meta(self.ckpt)
            if m and (not self.history or self.history[-1][1:] != (m["step"], m["world_size"])):
                self.history.append((round(time.monotonic() - self._started, 2), m["step"], m["world_size"]))

    def stop(self) -> list[tuple[float, int, int]]:
        self._done.set()
        self._thread.join(5)
        return self.history
