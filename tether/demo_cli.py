"""`tether demo` and `tether triton`: the whole topology in one process tree, and tritonserver alone.

    tether demo --env Hopper-v5 --envs 8 --seconds 10 --summary out/summary.json
    tether demo --train                                          # PPO from one vectorised session of 8 envs
    tether demo --train --env newton:cartpole --envs 64
    tether demo --train --algo sac --envs 4                      # off-policy SAC (one rank) instead of PPO
    tether demo --train --algo sac --envs 4 --rate 25            # the sims at a robot's fixed 25 Hz
    tether demo --camera --envs 2                                # 2 camera robots: 224x224 images -> 16-action chunks
    tether demo --camera --horizon 50 --envs 1 --rate 20
    tether triton --model-repository runs/models --init Hopper-v5
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge.common.errors import CommandError
from bridge.common.flags import deprecated_alias, output_flags

__all__ = ["main", "parser", "triton_main", "triton_parser"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether demo", description="Triton + gateway + MuJoCo sims, closed loop.")
    p.add_argument("--env", help="gymnasium id or newton:<task> (default Hopper-v5; InvertedPendulum-v5 with --train)")
    p.add_argument("--envs", type=int, default=8, help="envs per vectorised session; with --camera: camera sessions")
    p.add_argument("--sessions", type=int, default=1, help="vectorised sessions of --envs envs each")
    p.add_argument("--seconds", type=float, help="default 10 s; 240 s with --train")
    output_flags(p, summary=True, summary_help="write the summary as JSON here")
    p.add_argument("--run-dir", type=Path, help="model repository and logs (default: a temp dir)")
    p.add_argument("--train", action="store_true",
                   help="the learning loop: log experience, train PPO (torchrun), publish versions as it learns")
    p.add_argument("--trainer-nproc", type=int, default=2, help="trainer ranks (PPO; SAC runs on one)")
    p.add_argument("--algo", choices=("ppo", "sac"), default="ppo", help="with --train: the learner, on-policy PPO "
                   "or off-policy SAC (`tether train --algo`)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sims (and the trainer)")
    p.add_argument("--camera", action="store_true",
                   help="a camera robot: CameraReach (its goal shows only in the images) with top and front cameras "
                        "rendered offscreen, JPEG to the gateway, and a fresh image+state -> chunk policy (a CNN per "
                        "camera, an MLP head) served by Triton; chunks executed tick by tick")
    p.add_argument("--horizon", type=int, default=16, help="with --camera: actions per chunk, H (16, 50, ...)")
    p.add_argument("--image-size", type=int, default=224, metavar="PIXELS",
                   help="with --camera: square images of this many pixels a side")
    p.add_argument("--rate", type=float, metavar="HZ",
                   help="a fixed control rate: each session steps at most HZ times a second, as a robot's control "
                        "loop (`tether sim --rate`; default: as fast as the gateway answers)")
    p.add_argument("--view", action="store_true",
                   help="`tether view` beside the gateway: the robots live in Foxglove (a free loopback port, "
                        "printed; docs/interop.md)")
    return p


def main(argv: list[str] | None = None) -> int:
    import signal

    from bridge.common.processes import Terminated, sigterm_interrupts
    from inference_server import TritonStartError
    from tether.topology import DemoConfig, run_demo

    p = parser()
    a = p.parse_args(argv)
    env = a.env or ("CameraReach" if a.camera else "InvertedPendulum-v5" if a.train else "Hopper-v5")
    seconds = a.seconds or (240.0 if a.train else 10.0)
    if a.camera:
        import sim.cameras  # noqa: F401 - MuJoCo's offscreen GL backend (EGL), chosen before MuJoCo is imported
    if not a.camera and (a.horizon != 16 or a.image_size != 224):
        p.error("--horizon and --image-size go with --camera")
    if a.camera and a.sessions != 1:
        p.error("--camera runs single-env camera sessions (--envs of them), not --sessions")
    try:
        config = DemoConfig(env=env, envs=a.envs, sessions=None if a.camera else a.sessions,
                            seconds=seconds,
                            summary=a.summary, run_dir=a.run_dir, train=a.train, trainer_nproc=a.trainer_nproc,
                            seed=a.seed, algo=a.algo, rate_hz=a.rate, camera=a.camera, horizon=a.horizon,
                            image_size=a.image_size, view=a.view)
    except ValueError as exc:
        p.error(str(exc))
    try:
        with sigterm_interrupts():  # SIGTERM stops the demo as Ctrl-C does, every process it started with it
            run_demo(config)
    except TritonStartError as exc:
        raise CommandError(exc) from None
    except Terminated:
        raise SystemExit(128 + signal.SIGTERM) from None  # the shell's status for a SIGTERMed command
    return 0


def triton_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether triton", description="Run tritonserver on a model repository.")
    p.add_argument("--model-repository", type=Path, default=Path("runs/models"),
                   help="Triton's model repository (default runs/models)")
    deprecated_alias(p, "--repository", "--model-repository")
    p.add_argument("--init", metavar="ENV", help="write a fresh policy for this env if it has none")
    p.add_argument("--models", default="", help="comma-separated models to load (default: all)")
    p.add_argument("--grpc-port", type=int, help="Triton's gRPC port (default: a free one)")
    p.add_argument("--http-port", type=int, help="Triton's HTTP port (default: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="the address both endpoints bind (default loopback)")
    p.add_argument("--triton-secret-file", type=Path, metavar="PATH",
                   help="restrict every endpoint to requests carrying the secret in this file (header "
                        "tether-triton-key; gateways: the same --triton-secret-file)")
    return p


def triton_main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    from inference_server import ModelRepository, TritonServer, TritonStartError
    from inference_server.secret import read_secret
    from tether.initial_policy import write_initial_policy

    p = triton_parser()
    a = p.parse_args(argv)
    try:
        secret = read_secret(a.triton_secret_file) if a.triton_secret_file else None
    except ValueError as exc:
        p.error(str(exc))
    repo = ModelRepository(a.model_repository)
    models = [m for m in a.models.split(",") if m]
    if a.init:
        models.append(write_initial_policy(repo, a.init))
    if not models:
        models = sorted(d.name for d in repo.root.iterdir() if (d / "config.pbtxt").exists())
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with TritonServer(repo.root, models=models, grpc_port=a.grpc_port, http_port=a.http_port, host=a.host,
                          secret=secret) as server:
            print(f"triton {server.version} serving {models} on {server.grpc_url} (gRPC) and {server.http_url}"
                  f"{' (restricted: tether-triton-key)' if secret else ''}", flush=True)
            stop.wait()
    except TritonStartError as exc:
        raise CommandError(exc) from None
    return 0
