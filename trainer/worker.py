"""One trainer process under torchrun: `python -m torch.distributed.run ... -m trainer.worker ARGS`.

Every rank runs the same loop (trainer.loop) with the algorithm --algo names (trainer.algorithms: PPO from
the experience stream, BC from the log, SAC from a replay of the stream and of seed logs, on one rank);
gradients are averaged by DDP, rank 0 publishes new versions and all ranks learn the version number.
`trainer.main` builds the torchrun command; run one rank by hand (no process group) with:

    python -m trainer.worker --algo bc --experience-dir runs/x/log --steps 100 --out policy.safetensors
    python -m trainer.worker --algo bc --demos datasets/pick --arch mlp --steps 100   # a LeRobotDataset v3.0 folder

Status lines go to stderr (rank 0); `--summary PATH` gets a JSON summary at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from bridge.common.files import write_json
from bridge.common.flags import deprecated_alias
from bridge.experience.jetstream import add_nats_arguments, nats_auth_from, parse_servers
from trainer import dist
from trainer.algorithms import ALGORITHMS
from trainer.loop import run, status
from trainer.weights import ARCHS

__all__ = ["main", "parser"]


def _hidden(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hidden {text!r} must be comma-separated integers") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--hidden {text!r} must be positive integers, e.g. 64,64")
    return sizes


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
        return value
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether train", description="Distributed PPO / BC trainer, SAC (one rank).")
    p.add_argument("--gateway", default="", help="HOST:PORT of the gateway (Experience + Policies)")
    p.add_argument("--algo", choices=("ppo", "bc", "sac"), required=True,
                   help="ppo: on-policy from live sessions; bc: behaviour cloning from a log; sac: off-policy from "
                        "a replay of the stream, seed logs and demonstrations (one rank)")
    p.add_argument("--policy", default="", help="the served policy to train (empty: the gateway's default)")
    p.add_argument("--arch", choices=ARCHS, default="gaussian", help="the policy network")
    p.add_argument("--hidden", type=_hidden, default=(64, 64), help="hidden sizes (offline BC only; "
                   "with a gateway they must match the served architecture)")
    p.add_argument("--horizon", type=_positive(int), default=16,
                   help="BC with --arch camera and no gateway: actions per chunk (the served policy's otherwise)")
    p.add_argument("--experience-dir", default="", help="BC: an experience log, a directory of *.mcap segments (or a "
                   "LeRobotDataset v3.0 folder)")
    p.add_argument("--experience", default="", metavar="nats://HOST:PORT[,...]",
                   help="PPO, SAC: transitions from the NATS JetStream experience stream (a durable consumer per "
                        "rank, acknowledged after each checkpoint) instead of the gateway's Experience.Subscribe")
    add_nats_arguments(p)  # --nats-user/--nats-password-file/--nats-ca: the stream's credentials (with --experience)
    deprecated_alias(p, "--log-dir", "--experience-dir")
    p.add_argument("--data-policy", default=None, help="BC: only transitions acted by this policy")
    p.add_argument("--checkpoint-dir", default="", help="resume from and save checkpoints here (restarts)")
    p.add_argument("--checkpoint-every", type=_positive(int), default=0,
                   help="PPO: iterations, BC: steps between checkpoints (0: PPO 1, BC 50)")
    p.add_argument("--seed", type=int, default=0, help="rank r is seeded with seed + r")
    p.add_argument("--steps", type=_positive(int), default=0, help="stop after this many optimiser steps")
    p.add_argument("--seconds", type=_positive(float), default=0.0, help="stop after this many seconds")
    p.add_argument("--target-return", type=float, default=None, help="PPO: stop at this mean episode return")
    p.add_argument("--stop-file", default="", metavar="PATH", help="stop (every rank together) once this file "
                   "exists: a clean end for an open-ended or elastic multi-node run")
    p.add_argument("--batch", type=_positive(int), default=0,
                   help="PPO: transitions per update over all ranks (0: 1024); BC: per-rank batch (0: 256)")
    p.add_argument("--epochs", type=_positive(int), default=10, help="PPO: epochs per update")
    p.add_argument("--minibatches", type=_positive(int), default=8, help="PPO: minibatches per epoch")
    p.add_argument("--lr", type=float, default=None, help="Adam learning rate (default 1e-3; SAC: 3e-3, actor, "
                   "critics and temperature)")
    p.add_argument("--gamma", type=float, default=0.99, help="PPO: discount")
    p.add_argument("--lam", type=float, default=0.95, help="PPO: GAE lambda")
    p.add_argument("--clip", type=float, default=0.2, help="PPO: ratio clip")
    p.add_argument("--entropy-coef", type=float, default=0.005, help="PPO: entropy bonus")
    p.add_argument("--target-kl", type=float, default=0.05,
                   help="PPO: end an update's epochs once the mean approx KL passes this (0 = never)")
    p.add_argument("--stale", choices=("drop", "importance"), default="importance",
                   help="data acted by older versions: weight it by truncated importance ratios (default; about "
                   "twice as sample-efficient when versions go live seconds after an update) or drop it past "
                   "--max-version-lag")
    p.add_argument("--max-version-lag", type=_positive(int), default=2,
                   help="with --stale drop: the most versions behind a step may be acted")
    p.add_argument("--rho-max", type=float, default=1.0, help="truncation of importance weights")
    p.add_argument("--from-offset", type=_positive(int), default=0, help="PPO: first log offset to read")
    p.add_argument("--publish-every", type=_positive(int), default=None, help="PPO: iterations between publishes "
                   "(default 1; 0: never); SAC: updates between publishes (default 250); BC publishes at the end "
                   "when --gateway is given")
    p.add_argument("--max-ahead", type=_positive(int), default=1, help="PPO: updates the learner may be ahead of "
                   "the version the sessions act with; it waits (reading on) for its publish beyond that (0: never "
                   "waits; needs --publish-every 1)")
    p.add_argument("--obs-norm", action=argparse.BooleanOptionalAction, default=True,
                   help="PPO: running observation mean/std inside the served policy")
    p.add_argument("--value-norm", action=argparse.BooleanOptionalAction, default=True,
                   help="PPO: the critic learns normalised returns")
    p.add_argument("--seed-log", action="append", default=[], metavar="DIR",
                   help="SAC: a previous run's experience log (MCAP segments) seeding the offline half of the "
                        "replay (repeatable)")
    p.add_argument("--demos", action="append", default=[], metavar="DIR",
                   help="SAC: demonstrations for the offline half, learned on their applied actions (repeatable); "
                        "BC: the demonstrations to clone (once, instead of --experience-dir). A log (MCAP segments) "
                        "or a LeRobotDataset v3.0 folder")
    p.add_argument("--utd", type=_positive(float), default=1.0,
                   help="SAC: updates per new transition (replay ratio; the learner's speed caps it)")
    p.add_argument("--buffer-size", type=_positive(int), default=200_000, help="SAC: rows per replay half")
    p.add_argument("--learning-starts", type=_positive(int), default=500,
                   help="SAC: rows in the replay before the first update")
    p.add_argument("--tau", type=float, default=0.02, help="SAC: target critics' Polyak rate per update")
    p.add_argument("--init-alpha", type=float, default=0.1, help="SAC: initial entropy temperature (then tuned "
                   "towards an entropy of -action size)")
    p.add_argument("--critic-hidden", type=_hidden, default=(64, 64), help="SAC: hidden sizes of each Q critic")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--out", default="", help="rank 0 writes the final policy weights (safetensors) here")
    p.add_argument("--summary", default="", help="rank 0 writes a JSON summary here")
    p.add_argument("--metrics", default="", help="PPO: rank 0 appends one JSON line per iteration here "
                   "(wall time, steps, samples, return, version, lag, losses)")
    p.add_argument("--status-every", type=float, default=1.0, help="seconds between status lines (BC)")
    p.add_argument("--fail-at-step", type=int, default=0, help=argparse.SUPPRESS)  # tests: os._exit once
    p.add_argument("--fail-rank", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--step-sleep", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: BC paced per step
    return p


def check(args: argparse.Namespace) -> argparse.Namespace:
    """Defaults that depend on --algo, and what no rank should start with (SystemExit naming the flag): the
    launcher (trainer.main) runs it before torchrun starts, every rank again."""
    if args.publish_every is None:
        args.publish_every = 250 if args.algo == "sac" else 1
    if args.lr is None:
        args.lr = 3e-3 if args.algo == "sac" else 1e-3
    if args.experience:
        try:
            parse_servers(args.experience)
            nats_auth_from(args)
        except ValueError as exc:
            raise SystemExit(f"tether train: {exc}") from None
    if args.algo == "sac":
        if not args.gateway:
            raise SystemExit("tether train: --algo sac needs --gateway HOST:PORT (it learns from the stream and "
                             "publishes there)")
        if args.arch != "gaussian":
            raise SystemExit(f"tether train: --algo sac needs --arch gaussian (a stochastic actor), got {args.arch}")
        for flag, dirs in (("--seed-log", args.seed_log), ("--demos", args.demos)):
            for d in dirs:
                if not Path(d).is_dir():
                    raise SystemExit(f"tether train: {flag} {d!r} is not a directory")
        if args.buffer_size < 1:
            raise SystemExit(f"tether train: --buffer-size must be >= 1, got {args.buffer_size}")
        if not 0 < args.tau <= 1:
            raise SystemExit(f"tether train: --tau must be in (0, 1], got {args.tau}")
        if not args.init_alpha > 0:
            raise SystemExit(f"tether train: --init-alpha must be > 0, got {args.init_alpha}")
    elif args.seed_log or (args.demos and args.algo != "bc"):
        raise SystemExit(f"tether train: --seed-log is SAC's and --demos SAC's or BC's (--algo sac, bc), not "
                         f"{args.algo}'s")
    if args.algo == "ppo":
        if not args.gateway:
            raise SystemExit("tether train: --algo ppo needs --gateway HOST:PORT")
        if args.arch != "gaussian":
            raise SystemExit(f"tether train: --algo ppo needs --arch gaussian (a stochastic policy), got {args.arch}")
        if args.max_ahead and args.publish_every != 1:
            raise SystemExit(f"tether train: --max-ahead {args.max_ahead} needs --publish-every 1 (the learner waits "
                             f"for its own updates to be served), got --publish-every {args.publish_every}")
    if args.algo == "bc":
        if bool(args.experience_dir) + len(args.demos) != 1:
            raise SystemExit("tether train: --algo bc learns from one of --experience-dir DIR (a log; formerly "
                             "--log-dir) or --demos DIR (a log or a LeRobotDataset v3.0 folder), got --experience-dir "
                             f"{args.experience_dir!r} and --demos {args.demos}")
        data = args.experience_dir or args.demos[0]
        if not Path(data).is_dir():
            raise SystemExit(f"tether train: --algo bc needs {'--experience-dir' if args.experience_dir else '--demos'}"
                             f" DIR (an existing directory; formerly --log-dir), got {data!r}")
    if not (args.steps or args.seconds or args.target_return is not None or args.stop_file):
        raise SystemExit("tether train: give --steps, --seconds, --target-return or --stop-file")
    return args


def main(argv: list[str] | None = None) -> int:
    args = check(parser().parse_args(argv))
    rank, world = dist.init()
    torch.manual_seed(args.seed)
    started = time.monotonic()
    try:
        summary = run(args, ALGORITHMS[args.algo])
        summary.update(algo=args.algo, world_size=world, seconds=round(time.monotonic() - started, 3),
                       restarts=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
        if rank == 0 and args.summary:
            write_json(args.summary, summary, indent=2, sort_keys=True)  # temp, fsync, rename, fsync folder
        status("done: " + json.dumps({k: summary[k] for k in ("steps", "seconds") if k in summary}))
        dist.barrier()  # leave together: gloo aborts a rank ("terminate called ...") whose peer tore down first
    finally:
        dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
