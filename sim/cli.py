"""`tether sim`: the command line of the sim client (`sim.client` drives the sessions).

    tether sim --gateway 127.0.0.1:50051 --env Hopper-v5 --envs 8 --seconds 10
    python -m sim.cli --gateway 127.0.0.1:50051 --env newton:cartpole --envs 64 --sessions 2

Status lines go to stderr, the summary JSON to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from sim.client import VECTOR_PREFIXES, ClientTls, SessionError, SimStats, run_sessions
from sim.env import Environment
from sim.vector import VectorEnvironment

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """`tether sim`: connect simulated envs to a gateway; status lines on stderr, summary JSON on stdout.

    Returns 0; a failure (unreachable gateway, rejected session, bad --env) raises SystemExit
    with a non-zero code after printing why, so callers that ignore the return value still exit
    non-zero.
    """
    from sim.mujoco import make_env
    from sim.vector import make_vector_env

    parser = argparse.ArgumentParser(prog="tether sim", description="Connect simulated envs to a gateway.")
    parser.add_argument("--gateway", required=True, metavar="HOST:PORT")
    parser.add_argument("--env", default="Hopper-v5",
                        help="a gymnasium id (Hopper-v5, ...), PointMass, or a vector env (newton:cartpole, "
                             "isaaclab:<task>, mujoco:Hopper-v5)")
    parser.add_argument("--envs", type=int, default=1,
                        help="envs per vectorised session (with --sessions or a vector --env); otherwise "
                             "single-env sessions")
    parser.add_argument("--sessions", type=int, help="vectorised sessions of --envs envs each (default 1)")
    parser.add_argument("--seconds", type=float, help="stop after this long (default 10 s without --steps)")
    parser.add_argument("--steps", type=int, help="stop after this many env steps over all sessions")
    parser.add_argument("--policy", default="", help="Triton model name (default: the gateway's)")
    parser.add_argument("--seed", type=int, help="env i is seeded with seed + i")
    parser.add_argument("--max-episode-steps", type=int)
    parser.add_argument("--connect-timeout", type=float, default=10.0)
    parser.add_argument("--status-every", type=float, default=1.0, help="seconds between status lines")
    parser.add_argument("--session-id", metavar="PREFIX", help="session i is called PREFIX-i")
    parser.add_argument("--episodes", type=int, help="stop after this many complete episodes in total")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hello label of every session (repeatable), e.g. robot=sim_1 (tether estop --robot)")
    parser.add_argument("--tls-ca", type=Path, help="CA certificate of the gateway (turns TLS on)")
    parser.add_argument("--tls-cert", type=Path, help="client certificate, for a gateway that requires one (mTLS)")
    parser.add_argument("--tls-key", type=Path, help="the client certificate's private key")
    parser.add_argument("--token", default=os.environ.get("TETHER_TOKEN") or None,
                        help="robot token NAME.SECRET for a gateway that checks tokens (default: $TETHER_TOKEN)")
    parser.add_argument("--summary", type=Path, metavar="PATH",
                        help="also write the summary JSON here, with every episode's return")
    args = parser.parse_args(argv)
    if args.seconds is None and args.steps is None and args.episodes is None:
        args.seconds = 10.0
    if (args.tls_cert or args.tls_key) and not args.tls_ca:
        parser.error("--tls-cert/--tls-key need --tls-ca (the CA of the gateway's certificate)")
    labels = dict(item.partition("=")[::2] for item in args.label)
    if any(not k or not v for k, v in labels.items()) or len(labels) != len(args.label):
        parser.error(f"--label takes distinct KEY=VALUE, got {args.label}")

    vector = args.sessions is not None or args.env.partition(":")[0] in VECTOR_PREFIXES
    sessions = (args.sessions or 1) if vector else args.envs

    def build(i: int) -> Environment | VectorEnvironment:
        if vector:  # session i's env j is seeded with seed + i * envs + j
            seed = None if args.seed is None else args.seed + i * args.envs
            return make_vector_env(args.env, num_envs=args.envs, seed=seed, max_episode_steps=args.max_episode_steps)
        seed = None if args.seed is None else args.seed + i
        return make_env(args.env, seed=seed, max_episode_steps=args.max_episode_steps)

    def status(stats: SimStats) -> None:
        print(stats.status_line(), file=sys.stderr, flush=True)

    try:
        stats = asyncio.run(run_sessions(
            args.gateway, build, envs=sessions, seconds=args.seconds, steps=args.steps,
            policy=args.policy, on_progress=status, connect_timeout=args.connect_timeout,
            progress_every=args.status_every, labels={"env": args.env, **labels}, episodes=args.episodes,
            session_prefix=args.session_id, token=args.token,
            tls=ClientTls(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key) if args.tls_ca else None))
    except ValueError as e:  # a bad --env or budget: a usage error, like argparse's
        print(f"tether sim: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except (ConnectionError, SessionError, TimeoutError) as e:
        print(f"tether sim: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    status(stats)
    print(json.dumps(stats.summary()))
    if args.summary is not None:
        _write_summary(args.summary, {**stats.summary(), "returns": list(stats.returns),
                                      "cut_episodes": stats.cut_episodes})
    return 0


def _write_summary(path: Path, summary: dict) -> None:
    """Atomically: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(summary))
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
