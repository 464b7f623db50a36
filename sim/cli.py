"""`tether sim`: the command line of the sim client (`sim.client` drives the sessions).

    tether sim --gateway 127.0.0.1:50051 --env Hopper-v5 --envs 8 --seconds 10
    tether sim --gateway 127.0.0.1:50051 --env Hopper-v5 --envs 4 --rate 50   # a robot's fixed 50 Hz control rate
    tether sim --gateway 127.0.0.1:50051 --env newton:cartpole --envs 64 --sessions 2
    tether sim --gateway 127.0.0.1:50051 --env Hopper-v5 --chunk 16 --chunk-prefix --chunk-delay 4   # RTC, d = 4
    tether sim --gateway 127.0.0.1:50051 --env CameraReach --camera top --camera front   # + 224x224 RGB images

Status lines go to stderr, the summary JSON to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from bridge.client.chunks import chunk_config, chunk_flags
from bridge.common.errors import CommandError
from bridge.common.files import write_json
from bridge.common.flags import deprecated_alias, gateway_flags, output_flags, policy_flag
from bridge.common.kv import parse_pairs
from sim.client import ClientTls, SessionError, SimStats, check_rate, run_sessions
from sim.env import Environment
from sim.registry import is_vector, make
from sim.vector import VectorEnvironment

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether sim", description="Connect simulated envs to a gateway.")
    gateway_flags(p, required=True, token_help="robot token NAME.SECRET", several=True)
    p.add_argument("--env", default="Hopper-v5",
                   help="a gymnasium id (Hopper-v5, ...), PointMass, or a vector env (newton:cartpole, "
                        "isaaclab:<task>, mujoco:Hopper-v5)")
    p.add_argument("--envs", type=int, default=1,
                   help="envs per vectorised session (with --sessions or a vector --env); otherwise "
                        "single-env sessions")
    p.add_argument("--sessions", type=int, help="vectorised sessions of --envs envs each (default 1)")
    p.add_argument("--seconds", type=float, help="stop after this long (default 10 s without --steps)")
    p.add_argument("--steps", type=int, help="stop after this many env steps over all sessions")
    p.add_argument("--episodes", type=int, help="stop after this many complete episodes in total")
    chunk_flags(p, simulated=True)
    p.add_argument("--rate", type=float, metavar="HZ",
                   help="a fixed control rate: each session steps at most HZ times a second, on a deadline "
                        "schedule (a late step is not made up in a burst); a vectorised session: HZ exchanges "
                        "of --envs env steps. Default: as fast as the gateway answers")
    policy_flag(p)
    p.add_argument("--seed", type=int, help="env i is seeded with seed + i")
    p.add_argument("--max-episode-steps", type=int, help="truncate episodes at this many steps")
    p.add_argument("--camera", action="append", default=[], metavar="NAME",
                   help="add this MuJoCo camera's RGB image (uint8 HxWx3, rendered offscreen on the CPU) to the "
                        "observations, as a tensor named NAME (repeatable; single MuJoCo envs, e.g. CameraReach: "
                        "top, front)")
    p.add_argument("--image-size", type=int, default=224, metavar="PIXELS",
                   help="with --camera: square images of this many pixels a side (default 224)")
    p.add_argument("--image-encoding", choices=("jpeg", "png", "raw"), default="jpeg",
                   help="with --camera: how the images travel to the gateway (default jpeg, quality 90)")
    p.add_argument("--connect-timeout", type=float, default=10.0, help="seconds to wait for the gateway")
    p.add_argument("--reconnect-s", type=float, default=0.0, metavar="SECONDS",
                   help="keep a session whose gateway went away trying the addresses of --gateway (A,B: the "
                        "next one first) for this long, resuming with Replay (default 0: the session ends)")
    p.add_argument("--balanced", action="store_true",
                   help="with several --gateway addresses: pick the gateway by gRPC round_robin among those whose "
                        "health says SERVING (first Hello and each failover), instead of the list's order")
    p.add_argument("--status-every", type=float, default=1.0, metavar="SECONDS", help="seconds between status lines")
    p.add_argument("--session-id", metavar="PREFIX", help="session i is called PREFIX-i")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="a Hello label of every session (repeatable), e.g. robot=sim_1 (tether estop --robot)")
    deprecated_alias(p, "--labels", "--label")
    output_flags(p, summary=True, summary_help="also write the summary JSON here, with every episode's return")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`tether sim`: connect simulated envs to a gateway; status lines on stderr, summary JSON on stdout.

    Returns 0. A bad flag (or --env) exits 2 with the usage (`parser.error`); an unreachable gateway or a
    rejected session raises `CommandError` (`tether sim` prints why and exits 1).
    """

    parser_ = parser()
    args = parser_.parse_args(argv)
    if args.seconds is None and args.steps is None and args.episodes is None:
        args.seconds = 10.0
    if (args.tls_cert or args.tls_key) and not args.tls_ca:
        parser_.error("--tls-cert/--tls-key need --tls-ca (the CA of the gateway's certificate)")
    try:
        labels = parse_pairs(args.label, what="--label")
        check_rate(args.rate)
        chunks = chunk_config(args)
        if args.chunk_delay is not None and chunks is None:
            raise ValueError("--chunk-delay: needs --chunk H (a chunked policy)")
    except ValueError as exc:
        parser_.error(str(exc))

    vector = args.sessions is not None or is_vector(args.env)
    sessions = (args.sessions or 1) if vector else args.envs
    if args.camera and vector:
        parser_.error(f"--camera renders single MuJoCo envs; {args.env!r} with --sessions is a vector env")
    if args.camera:
        import sim.cameras  # noqa: F401 - chooses MuJoCo's offscreen GL backend before MuJoCo is imported

    def build(i: int) -> Environment | VectorEnvironment:
        if vector:  # session i's env j is seeded with seed + i * envs + j
            seed = None if args.seed is None else args.seed + i * args.envs
            return make(args.env, num_envs=args.envs, seed=seed, max_episode_steps=args.max_episode_steps)
        seed = None if args.seed is None else args.seed + i
        env = make(args.env, seed=seed, max_episode_steps=args.max_episode_steps)
        if args.camera:
            from sim.cameras import with_cameras

            env = with_cameras(env, args.camera, size=args.image_size, encoding=args.image_encoding)
        return env

    if args.camera:  # a camera the env lacks is a bad flag: said before connecting, not after
        try:
            build(0).close()
        except ValueError as exc:
            parser_.error(str(exc))

    def status(stats: SimStats) -> None:
        print(stats.status_line(), file=sys.stderr, flush=True)

    gateways = [g.strip() for g in args.gateway.split(",") if g.strip()]  # --gateway A,B: fail over A -> B
    if not gateways:
        parser_.error(f"--gateway: expected HOST:PORT[,HOST:PORT...], got {args.gateway!r}")
    try:
        stats = asyncio.run(run_sessions(
            gateways if len(gateways) > 1 else gateways[0], build, reconnect_s=args.reconnect_s,
            envs=sessions, seconds=args.seconds, steps=args.steps,
            policy=args.policy, on_progress=status, connect_timeout=args.connect_timeout,
            progress_every=args.status_every, labels={"env": args.env, **labels}, episodes=args.episodes,
            session_prefix=args.session_id, token=args.token, balanced=args.balanced and len(gateways) > 1,
            rate_hz=args.rate, chunks=chunks, delay_ticks=args.chunk_delay,
            tls=ClientTls(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key) if args.tls_ca else None))
    except ValueError as e:  # a bad --env or budget
        parser_.error(str(e))
    except (ConnectionError, SessionError, TimeoutError) as e:
        raise CommandError(e) from None
    status(stats)
    print(json.dumps(stats.summary()))
    if args.summary is not None:
        write_json(args.summary, {**stats.summary(), "returns": list(stats.returns),  # atomic (bridge.common.files)
                                  "cut_episodes": stats.cut_episodes}, indent=None)
    return 0
