"""`tether train`: runs `trainer.worker` on N local ranks under torchrun and prints a JSON summary.

    tether train --gateway 127.0.0.1:50051 --algo ppo --policy pendulum --nproc 2 --max-restarts 3 \\
        --checkpoint-dir runs/x/ckpt --seed 0 --seconds 180 --target-return 900
    tether train --algo bc --arch mlp --experience-dir runs/x/log --steps 2000 --nproc 2 --out bc.safetensors
    tether train --gateway 127.0.0.1:50051 --algo sac --policy pendulum --seed-log runs/old/experience --seconds 120

Elastic, on several nodes (the same command on each; `python -m trainer.rendezvous` serves the
c10d store so that any node may die; a node that dies and comes back rejoins, and every
(re)start resumes from the newest checkpoint in the shared --checkpoint-dir):

    tether train --nnodes 1:2 --rdzv-endpoint 10.0.0.5:29400 --rdzv-id-file /secrets/rendezvous.id --rdzv-external \
        --nproc 1 --max-restarts 10 --checkpoint-dir /shared/run7/ckpt --algo ppo --gateway gw:50051 ...

(`python -m trainer.rendezvous --new-id-file PATH` writes a random run id; it reaches torchrun through its
environment, `PET_RDZV_ID`, not its command line.)

The launcher's own options are `--nproc`, `--max-restarts`, the rendezvous's (`--nnodes`,
`--rdzv-endpoint`, `--rdzv-id`/`--rdzv-id-file`, `--rdzv-external`, `--local-addr`) and the credentials;
everything else goes to every rank (see `python -m trainer.worker --help`) and is checked here
before anything starts. Without `--rdzv-endpoint` torchrun's rendezvous takes a free port
(`--standalone`). The ranks die with this process (SIGTERM to torchrun, which stops them, SIGKILL
to its process group after 10 s; the kernel's SIGTERM to torchrun if this process is killed).
Status lines come on stderr; the summary (rank 0's) is the last line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

from bridge.client import Credentials
from bridge.common.flags import credential_flags
from bridge.common.net import is_loopback
from bridge.common.processes import Terminated, sigterm_interrupts, spawn, stop_group
from trainer.worker import check as worker_check
from trainer.worker import parser as worker_parser

__all__ = ["command", "main", "parsers"]

_ROOT = Path(__file__).resolve().parent.parent


def _launcher() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether train", add_help=False)
    p.add_argument("--nproc", type=int, default=None, help="ranks (processes) on this machine (default 2; --algo sac: "
                   "1, its only choice)")
    p.add_argument("--max-restarts", type=int, default=3, help="torchrun restarts of a failed group")
    p.add_argument("--nnodes", default="1", metavar="MIN:MAX", help="nodes (N or MIN:MAX, elastic); more than "
                   "one needs --rdzv-endpoint")
    p.add_argument("--rdzv-endpoint", default="", metavar="HOST:PORT", help="c10d rendezvous of a multi-node run "
                   "(every node gives the same; empty: one node, --standalone)")
    p.add_argument("--rdzv-id", default=None, help="the run's id at the rendezvous (one per training run; "
                   "default 'tether'); prefer --rdzv-id-file")
    p.add_argument("--rdzv-id-file", type=Path, metavar="PATH", help="read the run's id from this file (`python -m "
                   "trainer.rendezvous --new-id-file PATH` writes a random one): kept off command lines")
    p.add_argument("--rdzv-external", action="store_true", help="the rendezvous store is served by "
                   "`python -m trainer.rendezvous` (no node hosts it, so any node may die)")
    p.add_argument("--local-addr", default="", metavar="HOST", help="this node's address for the other nodes "
                   "(default: 127.0.0.1 when the rendezvous is on loopback, else torchrun's choice)")
    p.add_argument("--summary", default="", metavar="PATH", help="also write the summary JSON (rank 0's) here")
    credential_flags(p, token_help="a trainer token NAME.SECRET")
    p.add_argument("-h", "--help", action="store_true", help="show the launcher's and the ranks' flags")
    return p


def parsers() -> dict[str, argparse.ArgumentParser]:
    """`tether train`'s flags: the launcher's (--nproc, --max-restarts, credentials) and every rank's."""
    return {"tether train (launcher)": _launcher(), "tether train": worker_parser()}


# c10d rendezvous settings: a node is dead after 3 missed 2 s heartbeats; once MIN nodes are in,
# wait 2 s more for others (later ones join the next round: the running group restarts to admit them)
RDZV_CONF = "keep_alive_interval=2,keep_alive_max_attempt=3,last_call_timeout=2,join_timeout=900"


def nnodes_range(text: str) -> tuple[int, int]:
    """`--nnodes`: "N" -> (N, N), "MIN:MAX" -> (MIN, MAX), 1 <= MIN <= MAX."""
    try:
        low, _, high = text.partition(":")
        bounds = int(low), int(high or low)
    except ValueError:
        raise SystemExit(f"tether train: --nnodes {text!r} must be N or MIN:MAX, e.g. 1:2") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise SystemExit(f"tether train: --nnodes {text!r} needs 1 <= MIN <= MAX")
    return bounds


def _endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SystemExit(f"tether train: --rdzv-endpoint {text!r} must be HOST:PORT")
    return host, int(port)


def command(worker_args: list[str], *, nproc: int, max_restarts: int, nnodes: str = "1", rdzv_endpoint: str = "",
            rdzv_id: str | None = "tether", rdzv_external: bool = False, local_addr: str = "") -> list[str]:
    """The torchrun command line for `worker_args`: `--standalone` without `rdzv_endpoint`, else c10d
    (`rdzv_id` None: no `--rdzv-id`, torchrun reads `PET_RDZV_ID` from its environment).

    >>> cmd = command(["--algo", "bc"], nproc=1, max_restarts=5, nnodes="1:2", rdzv_endpoint="127.0.0.1:29400",
    ...               rdzv_external=True)
    >>> cmd[3:7]
    ['--nnodes=1:2', '--rdzv-backend=c10d', '--rdzv-endpoint=127.0.0.1:29400', '--rdzv-id=tether']
    >>> cmd[7].startswith("--rdzv-conf=is_host=false,"), cmd[8]
    (True, '--local-addr=127.0.0.1')
    """
    if not rdzv_endpoint:
        launch = ["--standalone"]
    else:
        host, _ = _endpoint(rdzv_endpoint)
        conf = ("is_host=false," if rdzv_external else "") + RDZV_CONF
        launch = [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                  *([f"--rdzv-id={rdzv_id}"] if rdzv_id is not None else []), f"--rdzv-conf={conf}"]
        local_addr = local_addr or ("127.0.0.1" if is_loopback(host) else "")
        if local_addr:
            launch.append(f"--local-addr={local_addr}")
    return [sys.executable, "-m", "torch.distributed.run", *launch, f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", "--monitor-interval=0.5", "-m", "trainer.worker", *worker_args]


def main(argv: list[str] | None = None) -> int:
    launcher, rest = _launcher().parse_known_args(argv)
    if launcher.help:
        print(__doc__.strip(), file=sys.stderr)
        worker_parser().print_help(sys.stderr)
        return 0
    if launcher.nproc is not None and launcher.nproc < 1:
        raise SystemExit(f"tether train: --nproc must be >= 1, got {launcher.nproc}")
    if launcher.max_restarts < 0:
        raise SystemExit(f"tether train: --max-restarts must be >= 0, got {launcher.max_restarts}")
    _, high = nnodes_range(launcher.nnodes)
    if high > 1 and not launcher.rdzv_endpoint:
        raise SystemExit(f"tether train: --nnodes {launcher.nnodes} needs --rdzv-endpoint HOST:PORT (c10d)")
    if launcher.rdzv_endpoint:
        _endpoint(launcher.rdzv_endpoint)
    run_id = _run_id(launcher)
    checked = worker_check(worker_parser().parse_args(rest))  # bad options fail here, before torchrun starts
    if checked.algo == "sac" and ((launcher.nproc or 1) > 1 or nnodes_range(launcher.nnodes)[1] > 1):
        raise SystemExit(f"tether train: --algo sac runs on one rank (one learner owns the replay); got --nproc "
                         f"{launcher.nproc} --nnodes {launcher.nnodes}: give --nproc 1")
    nproc = launcher.nproc or (1 if checked.algo == "sac" else 2)
    for name in ("tls_ca", "tls_cert", "tls_key"):
        if getattr(launcher, name) and not Path(getattr(launcher, name)).is_file():
            raise SystemExit(f"tether train: --{name.replace('_', '-')} {str(getattr(launcher, name))!r} is not a file")
    with tempfile.TemporaryDirectory(prefix="tether-train-") as tmp:
        summary_path = launcher.summary or str(Path(tmp) / "summary.json")
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        if not launcher.rdzv_endpoint or is_loopback(_endpoint(launcher.rdzv_endpoint)[0]):
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's pairs on loopback
        if launcher.rdzv_endpoint:  # a new store per rendezvous round (see trainer.dist.init)
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        env.update(Credentials.from_args(launcher).env())  # every rank's gateway channel, off the command line
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
        env.pop("PET_RDZV_ID", None)
        if launcher.rdzv_id_file:  # off the command line: torchrun reads PET_RDZV_ID
            env["PET_RDZV_ID"] = run_id
        cmd = command([*rest, "--summary", summary_path], nproc=nproc, max_restarts=launcher.max_restarts,
                      nnodes=launcher.nnodes, rdzv_endpoint=launcher.rdzv_endpoint,
                      rdzv_id=None if launcher.rdzv_id_file else run_id,
                      rdzv_external=launcher.rdzv_external, local_addr=launcher.local_addr)
        proc = spawn(cmd, env=env)
        try:
            with sigterm_interrupts():  # SIGTERM (systemd, Kubernetes, `timeout`) stops the run as Ctrl-C does
                rc = proc.wait()
        except BaseException as exc:
            stop_group(proc, grace_s=10.0)  # SIGTERM: the torchrun agent stops its ranks; SIGKILL after 10 s
            if isinstance(exc, Terminated):
                raise SystemExit(128 + signal.SIGTERM) from None  # the shell's status for a SIGTERMed command
            raise
        summary = {}
        if Path(summary_path).is_file():
            summary = json.loads(Path(summary_path).read_text())
        summary["exit_code"] = rc
        print(json.dumps(summary, sort_keys=True), flush=True)
        return rc


def _run_id(launcher: argparse.Namespace) -> str:
    """The run id: --rdzv-id, or read from --rdzv-id-file (never both), default "tether"."""
    if launcher.rdzv_id_file is None:
        return launcher.rdzv_id or "tether"
    if launcher.rdzv_id is not None:
        raise SystemExit(f"tether train: give --rdzv-id {launcher.rdzv_id!r} or --rdzv-id-file "
                         f"{str(launcher.rdzv_id_file)!r}, not both")
    from trainer.rendezvous import read_run_id

    try:
        return read_run_id(launcher.rdzv_id_file)
    except ValueError as exc:
        raise SystemExit(f"tether train: --rdzv-id-file: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
