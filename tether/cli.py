"""`tether`: one command, one subcommand per process of the topology.

    tether demo --env Hopper-v5 --envs 8 --seconds 10 --summary out/summary.json
    tether demo --env newton:cartpole --envs 256 --sessions 2
    tether triton --repository runs/models --init Hopper-v5
    tether gateway --triton 127.0.0.1:8001 --policy hopper_v5 --console-port 8080   # console + /metrics
    tether status --gateway 127.0.0.1:50051            # sessions and versions; estop/release --robot NAME | --all
    tether sim --gateway 127.0.0.1:50051 --env Hopper-v5 --envs 8 --seconds 10
    tether sim --gateway 127.0.0.1:50051 --env newton:cartpole --envs 64 --sessions 2
    tether edge --gateway 127.0.0.1:50051 --topic-map launch/config/topic_map.yaml --transport dds
    tether train --gateway 127.0.0.1:50051 --algo ppo --policy invertedpendulum_v5 --nproc 2
    tether log inspect runs/demo/experience
    tether certs init runs/certs --client arm_1:robot --client alice:operator
    tether token add alice --role operator --file runs/tokens.json
    tether policy import walker.onnx --name walker --gateway 127.0.0.1:50051
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _demo(argv: list[str]) -> None:
    from inference_server import TritonStartError
    from tether.topology import DemoConfig, run_demo

    p = argparse.ArgumentParser(prog="tether demo", description="Triton + gateway + MuJoCo sims, closed loop.")
    p.add_argument("--env", help="gymnasium id or newton:<task> (default Hopper-v5; InvertedPendulum-v5 with --train)")
    p.add_argument("--envs", type=int, default=8,
                   help="envs per vectorised session (with --train: single-env sessions)")
    p.add_argument("--sessions", type=int, default=1, help="vectorised sessions (not with --train)")
    p.add_argument("--seconds", type=float, help="default 10 s; 240 s with --train")
    p.add_argument("--summary", type=Path, help="write the summary as JSON here")
    p.add_argument("--run-dir", type=Path, help="model repository and logs (default: a temp dir)")
    p.add_argument("--train", action="store_true",
                   help="the learning loop: log experience, train PPO (torchrun), publish versions as it learns")
    p.add_argument("--trainer-nproc", type=int, default=2, help="trainer ranks")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    env = a.env or ("InvertedPendulum-v5" if a.train else "Hopper-v5")
    seconds = a.seconds or (240.0 if a.train else 10.0)
    try:
        config = DemoConfig(env=env, envs=a.envs, sessions=a.sessions, seconds=seconds, summary=a.summary,
                            run_dir=a.run_dir, train=a.train, trainer_nproc=a.trainer_nproc, seed=a.seed)
    except ValueError as exc:
        p.error(str(exc))
    try:
        run_demo(config)
    except TritonStartError as exc:
        raise SystemExit(f"tether demo: {exc}") from None


def _triton(argv: list[str]) -> None:
    import signal
    import threading

    from inference_server import ModelRepository, TritonServer, TritonStartError
    from tether.topology import write_initial_policy

    p = argparse.ArgumentParser(prog="tether triton", description="Run tritonserver on a model repository.")
    p.add_argument("--repository", type=Path, default=Path("runs/models"))
    p.add_argument("--init", metavar="ENV", help="write a fresh policy for this env if it has none")
    p.add_argument("--models", default="", help="comma-separated models to load (default: all)")
    p.add_argument("--grpc-port", type=int)
    p.add_argument("--http-port", type=int)
    a = p.parse_args(argv)
    repo = ModelRepository(a.repository)
    models = [m for m in a.models.split(",") if m]
    if a.init:
        models.append(write_initial_policy(repo, a.init))
    if not models:
        models = sorted(d.name for d in repo.root.iterdir() if (d / "config.pbtxt").exists())
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with TritonServer(repo.root, models=models, grpc_port=a.grpc_port, http_port=a.http_port) as server:
            print(f"triton {server.version} serving {models} on {server.grpc_url} (gRPC) and {server.http_url}",
                  flush=True)
            stop.wait()
    except TritonStartError as exc:
        raise SystemExit(f"tether triton: {exc}") from None


def _gateway(argv: list[str]) -> None:
    from bridge.gateway.server import main

    main(argv)


def _sim(argv: list[str]) -> None:
    from sim.cli import main

    main(argv)


def _edge(argv: list[str]) -> None:
    from bridge.ros2.edge import main

    main(argv)


def _train(argv: list[str]) -> None:
    from trainer.main import main

    main(argv)


def _log(argv: list[str]) -> None:
    from bridge.experience.tool import main

    main(argv)


def _policy(argv: list[str]) -> None:
    from tether.policy_cli import main

    main(argv)


COMMANDS = {"demo": _demo, "triton": _triton, "gateway": _gateway, "sim": _sim, "edge": _edge, "train": _train,
            "log": _log}
COMMANDS.update({name: (lambda argv, name=name: getattr(__import__("bridge.console.cli").console.cli, name)(argv))
                 for name in ("status", "estop", "release")})  # bridge/console/cli.py: the fleet via tether.v1.Fleet
COMMANDS["policy"] = _policy  # tether policy import FILE --name NAME (TorchScript / ONNX)

COMMANDS["certs"] = lambda argv: __import__("bridge.security.cli").security.cli.certs_main(argv)  # lab CA, certs
COMMANDS["token"] = lambda argv: __import__("bridge.security.cli").security.cli.token_main(argv)  # hashed tokens
COMMANDS["rollout"] = lambda argv: __import__("tether.rollout_cli").rollout_cli.main(argv)  # list|promote|rollback|pin


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        raise SystemExit(f"usage: tether {{{','.join(COMMANDS)}}} [options]")
    try:
        COMMANDS[argv[0]](argv[1:])
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except ConnectionError as exc:  # a missing or failed peer process is a message, not a traceback
        raise SystemExit(f"tether {argv[0]}: {exc}") from None
