"""`tether eval`: a policy's verdict on simulators, through the real path, with an exit status CI understands.

    tether eval policy.pt --env InvertedPendulum-v5 --episodes 10 --min-return 900
    tether eval policy.pt --baseline live.pt --env Hopper-v5 --env newton:cartpole --episodes 20 --seed 0 \\
        --max-regression 10% --max-bound-violations 0 --max-p99-ms 50 --junit eval.xml --summary eval.json
    tether eval hopper_v5:3 --baseline hopper_v5:2 --model-repository runs/demo/models --env Hopper-v5
    tether eval hopper_v5:3 --baseline hopper_v5 --gateway gw.lab:50051 --tls-ca ca.crt --token $TOKEN

A POLICY is a TorchScript archive or an ONNX file (specs from the file), or NAME[:VERSION]: a version in
the model repository given with --model-repository (default: its newest), or a policy the gateway given
with --gateway already serves (VERSION: the version its sessions must act with; pin it with `tether
rollout pin` first). Without --gateway the stack is embedded: a Triton and a `tether gateway` on free
loopback ports serve the policies (as models `candidate` and `baseline`), torn down at the end.
With --gateway, a file is imported there (`tether policy import`'s path, an operator token) as a new
policy `eval_<sha256[:12]>`, so no robot acts with it.

Exit status: 0 every check passed, 1 a check failed, 2 a usage or setup error (a bad flag, a file that
does not load, an env the policy does not fit, a gateway that cannot be reached).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.metadata
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bridge.common.files import write_json
from bridge.common.flags import gateway_flags, output_flags

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether eval", description="Evaluate a policy on simulators with fixed seeds "
                                "through Triton and a gateway; thresholds decide the exit status (0 pass, 1 fail, "
                                "2 usage/setup error).")
    p.add_argument("policy", help="a TorchScript (.pt) or ONNX file, or NAME[:VERSION] served by --gateway")
    p.add_argument("--baseline", metavar="POLICY", help="a second policy (file or NAME[:VERSION]) run on the same "
                   "seeds: the paired difference candidate - baseline is reported and --max-regression judged")
    p.add_argument("--env", action="append", default=[], metavar="ID",
                   help="an env to evaluate in (repeat): a gymnasium *-v5 id, PointMass, newton:<task>, ... "
                        "(default InvertedPendulum-v5)")
    p.add_argument("--episodes", type=int, default=10, help="episodes per env and policy")
    p.add_argument("--seed", type=int, default=0, help="episode i runs on seed SEED + i")
    p.add_argument("--envs", type=int, default=8,
                   help="envs stepped together: one vectorised session, one Triton request of this many rows per "
                        "step (<= the model's max batch, 64)")
    p.add_argument("--max-episode-steps", type=int, help="truncate episodes at this many steps")
    p.add_argument("--min-return", type=float, help="fail when an env's mean return is below this")
    p.add_argument("--max-regression", metavar="R",
                   help="with --baseline: fail when the mean return is lower than the baseline's by more than R: "
                        "'10%%' (of |baseline mean|) or '25' (return units)")
    p.add_argument("--max-bound-violations", type=int, metavar="N",
                   help="fail when more than N actions leave the env's declared bounds")
    p.add_argument("--max-p99-ms", type=float, metavar="MS", help="fail when the step round trip p99 exceeds MS")
    p.add_argument("--junit", type=Path, metavar="PATH", help="write JUnit XML here (one test case per env and check)")
    output_flags(p, summary=True, json=True, summary_help="write the figures and verdicts as JSON here")
    group = gateway_flags(p, default="", token_help="token NAME.SECRET (robot to evaluate served policies; "
                          "operator to import a file)")
    next(a for a in group._group_actions if a.dest == "gateway").help = (
        "an existing gateway to evaluate through (default: an embedded Triton + gateway on free loopback ports)")
    p.add_argument("--model-repository", type=Path, metavar="DIR",
                   help="a Triton model repository (e.g. runs/demo/models) that NAME[:VERSION] policies are taken "
                        "from, served by the embedded stack")
    p.add_argument("--run-dir", type=Path, help="the embedded stack's directory (logs, model repository); "
                   "default: a temporary one, removed after")
    p.add_argument("--connect-timeout", type=float, default=30.0, help="seconds to wait for the gateway")
    return p


@dataclass(frozen=True)
class _Source:
    """A policy to evaluate: a file, or a policy the gateway serves (version None: whatever it serves)."""

    label: str
    path: Path | None = None
    name: str | None = None
    version: int | None = None


def _source(text: str) -> _Source:
    path = Path(text)
    if path.suffix in (".pt", ".pth", ".onnx", ".zip") or path.exists():
        if not path.is_file():
            raise ValueError(f"policy file {text} does not exist")
        return _Source(label=path.name, path=path)
    name, _, version = text.partition(":")
    if not name or (version and not version.isdigit()):
        raise ValueError(f"policy {text!r}: expected a .pt/.onnx file or NAME[:VERSION] (e.g. hopper_v5:3)")
    return _Source(label=text, name=name, version=int(version) if version else None)


def _versions(envs: Sequence[str]) -> dict[str, str]:
    """Versions of Tether and of every simulator the envs use (what a rerun must match to be bitwise)."""
    def of(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    out = {"tether": of("tether"), "torch": of("torch"), "numpy": of("numpy"), "python": sys.version.split()[0]}
    for env in envs:
        prefix = env.partition(":")[0] if ":" in env else ""
        if prefix == "newton":
            out["newton"], out["warp"] = of("newton"), of("warp-lang")
        elif prefix == "isaaclab":
            out["isaaclab"] = of("isaaclab")
        elif env != "PointMass":
            out["gymnasium"], out["mujoco"] = of("gymnasium"), of("mujoco")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`tether eval ...`: returns the exit status (0 pass, 1 a check failed, 2 usage/setup error)."""
    from tether.evaluation.verdict import Thresholds, parse_regression

    p = parser()
    args = p.parse_args(argv)
    envs = args.env or ["InvertedPendulum-v5"]
    try:
        if args.episodes < 1 or args.envs < 1:
            raise ValueError(f"--episodes and --envs must be >= 1, got {args.episodes} and {args.envs}")
        if args.max_regression is not None and not args.baseline:
            raise ValueError("--max-regression needs --baseline (the policy to compare with)")
        if (args.tls_cert or args.tls_key) and not args.tls_ca:
            raise ValueError("--tls-cert/--tls-key need --tls-ca (the CA of the gateway's certificate)")
        thresholds = Thresholds(min_return=args.min_return, max_bound_violations=args.max_bound_violations,
                                max_p99_ms=args.max_p99_ms,
                                max_regression=None if args.max_regression is None
                                else parse_regression(args.max_regression))
        sources = {"candidate": _source(args.policy)}
        if args.baseline:
            sources["baseline"] = _source(args.baseline)
        if not args.gateway and not args.model_repository and any(s.path is None for s in sources.values()):
            raise ValueError("a policy given as NAME[:VERSION] needs --model-repository (where its versions are) "
                             "or --gateway (the gateway that serves it); or give .pt/.onnx files")
        if args.gateway and args.model_repository:
            raise ValueError("--model-repository is for the embedded stack; with --gateway, NAME[:VERSION] names "
                             "what that gateway serves")
    except ValueError as exc:
        print(f"tether eval: error: {exc}", file=sys.stderr)
        return 2
    try:
        return _evaluate(args, envs, sources, thresholds)
    except _SetupError as exc:  # eval's own contract: 1 is a failed check, so a failure to run is 2
        print(f"tether eval: error: {exc}", file=sys.stderr)
        return 2


class _SetupError(RuntimeError):
    """The eval could not run (exit status 2): a file, the stack, the gateway or an env."""


def _evaluate(args, envs: list[str], sources: dict[str, _Source], thresholds) -> int:
    from inference_server.artifact import ArtifactError
    from tether.policy_cli import read_policy_file

    files = {}
    try:
        for role, source in sources.items():
            if source.path is not None:
                files[role] = read_policy_file(source.path)
    except ArtifactError as exc:
        raise _SetupError(str(exc)) from None
    sha = {role: hashlib.sha256(f.data).hexdigest() for role, f in files.items()}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tether-eval-") as tmp:
        if args.gateway:
            served, triton = _gateway_policies(args, sources, files, sha), "external (the gateway's)"
            credentials = _credentials(args)
            results, found = _run_all(args, args.gateway, credentials, envs, served, thresholds)
        else:
            from tether.stack import Stack, StackError

            run_dir = args.run_dir or Path(tmp)
            stack = Stack(run_dir, models=list(sources), gateway_args=["--deadline-ms", "10000"])
            for role, f in files.items():
                stack.repository.write_artifact(role, 1, f.format, f.data, f.inputs, f.outputs)
            for role, source in sources.items():
                if source.path is None:
                    sha[role] = _copy_version(args.model_repository, source, stack.repository.root / role)
            try:
                stack.start()
            except (StackError, RuntimeError, OSError) as exc:
                raise _SetupError(f"the embedded stack did not start: {exc}") from None
            try:
                triton = stack.triton.version
                served = {role: (role, None) for role in sources}
                results, found = _run_all(args, stack.gateway, None, envs, served, thresholds)
            finally:
                stack.close()
    seconds = time.monotonic() - started
    _output(args, envs, sources, sha, triton, results, found, seconds)
    return 0 if all(c.passed for c in found) else 1


def _copy_version(repository: Path, source: _Source, target: Path) -> str:
    """NAME:VERSION of `repository` (default: its newest version) as version 1 of the model at `target` (the
    version folder is self-contained: its TorchScript/ONNX file and Triton wrapper); returns the sha256 of the
    served file. _SetupError naming what is missing."""
    import shutil

    model = Path(repository) / source.name
    versions = sorted(int(p.name) for p in model.glob("[0-9]*") if p.is_dir() and p.name.isdigit())
    version = source.version if source.version is not None else (versions[-1] if versions else None)
    if version is None or version not in versions or not (model / "config.pbtxt").is_file():
        raise _SetupError(f"{source.label}: no version {version} of model {source.name!r} in {repository} "
                          f"(versions there: {versions})")
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(model / str(version), target / "1")
    config = (model / "config.pbtxt").read_text().replace(f'name: "{source.name}"', f'name: "{target.name}"', 1)
    (target / "config.pbtxt").write_text(config)
    artifact = target / "1" / "artifact.json"
    served = json.loads(artifact.read_text())["file"] if artifact.exists() else \
        next(n for n in ("policy.onnx", "policy.pt") if (target / "1" / n).exists())
    return hashlib.sha256((target / "1" / served).read_bytes()).hexdigest()


def _credentials(args):
    from bridge.client import Credentials

    return Credentials.from_args(args)


def _gateway_policies(args, sources: dict[str, _Source], files: dict, sha: dict) -> dict[str, tuple[str, int | None]]:
    """role -> (policy name, version) on the existing gateway; files are imported as eval_<sha256[:12]>."""
    from tether.policy_cli import ImportRefused, import_policy_file

    served = {}
    for role, source in sources.items():
        if source.path is None:
            served[role] = (source.name, source.version)
            continue
        name = f"eval_{sha[role][:12]}"
        try:
            _, reply = import_policy_file(args.gateway, source.path, name=name, credentials=_credentials(args),
                                          timeout_s=300.0)
        except (ImportRefused, ValueError) as exc:
            raise _SetupError(f"importing {source.path}: {exc}") from None
        served[role] = (name, reply.version)
    return served


def _run_all(args, address: str, credentials, envs: list[str], served: dict[str, tuple[str, int | None]],
             thresholds):
    from bridge.client import SessionError
    from tether.evaluation.episodes import run_episodes
    from tether.evaluation.verdict import judge

    async def one(env: str, role: str):
        name, version = served[role]
        run = await run_episodes(address, env, policy=name, episodes=args.episodes, seed=args.seed, envs=args.envs,
                                 max_episode_steps=args.max_episode_steps, credentials=credentials,
                                 connect_timeout=args.connect_timeout)
        acted = {v for v, n in run.versions.items() if n}
        if version is not None and acted - {version}:
            raise _SetupError(f"{env}: the gateway acted with {name} versions {sorted(acted)}, not only v{version}: "
                              f"pin it first (tether rollout pin --policy {name} ...)")
        run.policy = f"{name}" + (f":v{version}" if version is not None else "")
        return run

    async def everything():
        results, found = [], []
        for env in envs:
            candidate = await one(env, "candidate")
            baseline = await one(env, "baseline") if "baseline" in served else None
            result, checks = judge(env, candidate, baseline, thresholds)
            results.append(result)
            found.extend(checks)
        return results, found

    try:
        return asyncio.run(everything())
    except (ValueError, ConnectionError, SessionError, TimeoutError) as exc:
        raise _SetupError(f"{type(exc).__name__}: {exc}") from None


def _output(args, envs, sources, sha, triton, results, found, seconds) -> None:
    from tether.evaluation.report import junit, table

    document = {
        "passed": all(c.passed for c in found), "failed": [f"{c.env}.{c.name}" for c in found if not c.passed],
        "envs": results, "seconds": round(seconds, 3),
        "config": {"episodes": args.episodes, "seed": args.seed, "seeds": [args.seed + i for i in range(args.episodes)],
                   "envs_per_session": min(args.envs, args.episodes), "max_episode_steps": args.max_episode_steps,
                   "gateway": args.gateway or "embedded",
                   "thresholds": {"min_return": args.min_return, "max_regression": args.max_regression,
                                  "max_bound_violations": args.max_bound_violations, "max_p99_ms": args.max_p99_ms}},
        "policies": {role: {"source": s.label, "sha256": sha.get(role)} for role, s in sources.items()},
        "versions": {**_versions(envs), "triton": triton},
    }
    if args.summary is not None:  # the files first: a closed stdout (| head) must not lose them
        write_json(args.summary, document)
    if args.junit is not None:
        args.junit.parent.mkdir(parents=True, exist_ok=True)
        args.junit.write_text(junit(found, seconds=seconds))
    print(table(results, found), flush=True)
    if args.json:
        print(json.dumps(document))
