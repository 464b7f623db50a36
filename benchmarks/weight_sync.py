"""Weight sync: publish -> served for the demo MLPs (the Gaussian policies `tether demo --train` trains), one
serving runtime against another, measured the way the trainer publishes (PoliciesClient.publish: safetensors,
a probe batch and the trainer's reference outputs, through the gateway's whole publish pipeline: integrity,
version folder written, Triton load_model, READY, the probe served at exactly the new version, live).

    python benchmarks/weight_sync.py [--publishes 8 --envs InvertedPendulum-v5 Hopper-v5 --write-versions 20
                                      --train-seconds 60 --train-modes torchscript onnx persistent
                                      --json benchmarks/results/weight_sync.json]

Runtimes: `torchscript` (each version a Triton python-backend stub that imports torch), `onnx` (the same
architecture in ONNX, served by onnxruntime: each version still a stub, which does not import torch) and
`persistent` (the ONNX versions opened by one persistent python-backend model, `<policy>.versions`, at their first
request: no process per version; `tether gateway --persistent-versions`). Part 0 (`--write-versions`) times what the
gateway does to a new onnxruntime version's file (its parent's graph re-weighted) against exporting it again. Part 1
publishes `--publishes` versions of each (env, runtime) (quiet: no sessions; the stub runtimes into one Triton and
gateway, `persistent` into a gateway of its own per env), timing each publish at the client (first byte to reply)
and recording the consistency check's max abs error. Part 2 (`--train-seconds` > 0) runs `tether demo --train` on
InvertedPendulum-v5 (8 single-env sessions, PPO with 2 ranks) for that long with each of `--train-modes` and reads
the trainer's log: each publish's seconds as the gateway reported them, and the policy lag of every PPO batch
(versions behind the newest, mean per batch).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench import machine, parser, report, specs

from bridge.client import PoliciesClient
from bridge.common.percentiles import p50_p99
from inference_server import ModelRepository
from protos import policies_pb2
from tether.initial_policy import policy_name
from tether.stack import Stack
from tether.topology import DemoConfig, run_demo
from trainer.policy import GaussianPolicy, probe_outputs

RUNTIMES = ("torchscript", "onnx")
MODES = (*RUNTIMES, "persistent")  # persistent: onnx versions opened by one persistent model (--persistent-versions)
PUBLISHED = re.compile(r"published \S+ v(\d+) .*?, ([0-9.]+) s, max error ([0-9.e+-]+)\)")
LAG = re.compile(r"ppo it \d+ .* lag ([0-9.]+)v \(max (\d+)\)")
SERVED_BY = re.compile(r"policy \S+ v(\d+) served by \w+: (.*)$", re.MULTILINE)
PHASE = re.compile(r"([a-z ]+) ([0-9.]+) s")
ENDS = re.compile(r"policy \S+ v(\d+) published by .*\(numbered ([0-9.]+) s, integrity to served checks ([0-9.]+) s, "
                  r"into the plan ([0-9.]+) s\)")


def publish_loop(client: PoliciesClient, model: str, obs_spec, act_spec, count: int) -> list[dict]:
    """`count` new versions of `model` (the served weights, perturbed), each as the trainer publishes one."""
    served = client.fetch(model)
    policy = GaussianPolicy(obs_spec[0], act_spec[0])
    policy.load_state_dict(served.state_dict)
    rng = np.random.default_rng(0)
    rows, parent = [], served.version
    for i in range(count):
        with torch.no_grad():
            for p in policy.net.parameters():
                p.add_(0.01 * torch.from_numpy(rng.standard_normal(tuple(p.shape)).astype(np.float32)))
        probe = (rng.standard_normal((16, *obs_spec[0].shape)) * 2).astype(np.float32)
        start = time.monotonic()
        reply = client.publish(model, policy.state_dict(), probe_inputs={obs_spec[0].name: probe},
                               probe_outputs=probe_outputs(policy, probe),
                               lineage=policies_pb2.Lineage(parent_version=parent, trainer_step=i, trainer="bench"))
        rows.append({"version": reply.version, "publish_to_served_s": time.monotonic() - start,
                     "server_s": reply.load_seconds, "max_abs_error": reply.max_abs_error})
        parent = reply.version
    return rows


def write_cost(envs: list[str], versions: int) -> dict:
    """The ONNX file of a new version, exported (`onnx_export.export`) against re-weighted from its parent's
    (`onnx_export.reweight`, what the gateway does), interleaved in this process: median CPU and wall ms."""
    from inference_server import onnx_export
    from inference_server.formats.onnx import ONNX

    results = {}
    for env_id in envs:
        obs, act = specs(env_id)
        policy = GaussianPolicy(obs[0], act[0], seed=0, log_std_init=0.0)
        base = onnx_export.export(torch.jit.script(policy), obs, GaussianPolicy.output_specs(act[0]))
        io_specs = ONNX.read_specs(base)
        times: dict[str, tuple[list[float], list[float]]] = {"export": ([], []), "reweight": ([], [])}
        for i in range(2 * versions + 4):
            with torch.no_grad():
                for p in policy.parameters():
                    p.add_(0.01 * torch.randn_like(p))
            scripted, how = torch.jit.script(policy), ("export", "reweight")[i % 2]
            cpu, wall = time.process_time(), time.perf_counter()
            if how == "export":
                onnx_export.export(scripted, *io_specs)
            else:
                onnx_export.reweight(base, scripted, *io_specs)
            if i >= 4:  # the first of each warm up
                times[how][0].append(time.process_time() - cpu)
                times[how][1].append(time.perf_counter() - wall)
        results[env_id] = {how: {"cpu_ms": 1000 * float(np.median(c)), "wall_ms": 1000 * float(np.median(w))}
                           for how, (c, w) in times.items()}
        print(f"  {env_id:<20} ONNX file of a version: export {results[env_id]['export']['cpu_ms']:.0f} CPU-ms, "
              f"re-weighted {results[env_id]['reweight']['cpu_ms']:.0f} CPU-ms", flush=True)
    return results


def quiet(envs: list[str], publishes: int, directory: Path) -> dict:
    repo = ModelRepository(directory / "models")
    models = {}
    for env_id in envs:
        obs, act = specs(env_id)
        for runtime in RUNTIMES:
            name = f"{policy_name(env_id)}_{runtime}"
            repo.write_version(name, 1, GaussianPolicy(obs[0], act[0], seed=0, log_std_init=0.0), obs,
                               GaussianPolicy.output_specs(act[0]), serve=runtime)
            models[name] = (env_id, runtime, obs, act)
    results = {}

    def measure(client: PoliciesClient, log_path: Path, name: str, env_id: str, runtime: str, obs, act) -> None:
        rows = publish_loop(client, name, obs, act, publishes)
        r = results[f"{name}_persistent" if runtime == "persistent" else name] = {
            "env": env_id, "runtime": runtime, "publishes": rows, **summary([r["publish_to_served_s"] for r in rows]),
            "max_abs_error": max(r["max_abs_error"] for r in rows),
            "phases": phases(log_path.read_text(), name=name, versions={r["version"] for r in rows})}
        print(f"  {env_id:<20} {runtime:<12} publish -> served median {r['median_s']:.3f} s, p99 {r['p99_s']:.3f} s, "
              f"max abs error {r['max_abs_error']:.2e}", flush=True)

    with Stack(directory, models=list(models), deadline_ms=2000) as stack, PoliciesClient(stack.gateway) as client:
        for name, (env_id, runtime, obs, act) in models.items():
            measure(client, directory / "gateway.log", name, env_id, runtime, obs, act)
    for env_id in envs:  # a gateway whose default policy's versions are opened by one persistent model
        obs, act = specs(env_id)
        name, run_dir = f"{policy_name(env_id)}_onnx", directory / f"persistent_{policy_name(env_id)}"
        (run_dir / "models").mkdir(parents=True)
        repo = ModelRepository(run_dir / "models")
        repo.write_version(name, 1, GaussianPolicy(obs[0], act[0], seed=0, log_std_init=0.0), obs,
                           GaussianPolicy.output_specs(act[0]), serve="onnx")
        with Stack(run_dir, models=[name], deadline_ms=2000, persistent_versions=True) as stack, \
                PoliciesClient(stack.gateway) as client:
            measure(client, run_dir / "gateway.log", name, env_id, "persistent", obs, act)
    return results


def training(runtime: str, seconds: float, directory: Path) -> dict:
    """`runtime`: one of MODES (torchscript and onnx: a Triton stub per version; persistent: onnx versions opened by
    one persistent model)."""
    run_dir = directory / f"train_{runtime}"
    config = DemoConfig(env="InvertedPendulum-v5", envs=8, train=True, seconds=seconds, run_dir=run_dir,
                        serve="onnx" if runtime == "persistent" else runtime,
                        persistent_versions=runtime == "persistent")
    demo = run_demo(config)
    log = (run_dir / "trainer.log").read_text()
    published = [(int(v), float(s), float(e)) for v, s, e in PUBLISHED.findall(log)]
    lags = [(float(mean), int(most)) for mean, most in LAG.findall(log)]
    return {"runtime": runtime, "seconds": seconds, "versions": len(published),
            **summary([s for _, s, _ in published]),
            "max_abs_error": max((e for *_, e in published), default=None),
            "batches": len(lags), "lag_versions_mean": float(np.mean([m for m, _ in lags])) if lags else None,
            "lag_versions_max": max((m for _, m in lags), default=None),
            "recent_return": demo.get("recent_return"), "seconds_to_500": demo.get("seconds_to_500"),
            "session_errors": demo.get("errors"), "rtt_ms": demo.get("rtt_ms"),
            "publish_s": [s for _, s, _ in published],
            "phases": phases((run_dir / "gateway.log").read_text(), name=None, versions={v for v, _, _ in published})}


def phases(log: str, *, name: str | None, versions: set[int]) -> dict:
    """Median and max seconds of each phase of a publish, from the gateway's log lines (bridge.gateway.
    rollout_publish): numbered, [integrity], write, load, metadata, served checks, into the plan."""
    found: dict[str, list[float]] = {}
    for line in log.splitlines():
        if name is not None and f"policy {name} v" not in line:
            continue
        served, ends = SERVED_BY.search(line), ENDS.search(line)
        if served and int(served.group(1)) in versions:
            for what, seconds in PHASE.findall(served.group(2)):
                found.setdefault(what.strip(), []).append(float(seconds))
        if ends and int(ends.group(1)) in versions:
            numbered, between, plan = map(float, ends.groups()[1:])
            found.setdefault("numbered", []).append(numbered)
            found.setdefault("into the plan", []).append(plan)
    return {what: {"median_s": float(np.median(v)), "max_s": float(max(v)), "n": len(v)} for what, v in found.items()}


def summary(values: list[float]) -> dict:
    if not values:
        return {"median_s": None, "p99_s": None, "max_s": None}
    p50, p99 = p50_p99(np.asarray(values))
    return {"median_s": float(p50), "p99_s": float(p99), "max_s": float(max(values))}


def main(argv: list[str] | None = None) -> dict:
    p = parser(__file__, __doc__)
    p.add_argument("--publishes", type=int, default=8, help="versions published per (env, runtime), quiet")
    p.add_argument("--envs", nargs="+", default=["InvertedPendulum-v5", "Hopper-v5"])
    p.add_argument("--train-seconds", type=float, default=0.0,
                   help="also train InvertedPendulum-v5 this long per runtime (0: skip)")
    p.add_argument("--write-versions", type=int, default=20,
                   help="versions whose ONNX file is exported and re-weighted, interleaved (0: skip)")
    p.add_argument("--train-modes", nargs="+", choices=MODES, default=list(MODES),
                   help="how versions are served while training (torchscript, onnx: a stub per version; "
                        "persistent: one persistent model)")
    a = p.parse_args(argv)
    if a.publishes < 1:
        p.error(f"--publishes must be >= 1, got {a.publishes}")
    result: dict = {"machine": machine(cpus=os.cpu_count(), load_avg_1m=os.getloadavg()[0]),
                    "config": {"publishes": a.publishes, "envs": a.envs, "train_seconds": a.train_seconds,
                               "write_versions": a.write_versions, "train_modes": a.train_modes}}
    if a.write_versions > 0:
        print("write: a version's ONNX file, exported or re-weighted", flush=True)
        result["write"] = write_cost(a.envs, a.write_versions)
    with tempfile.TemporaryDirectory(prefix="tether-weight-sync-") as tmp:
        print("quiet: publish -> served per (env, runtime)", flush=True)
        result["quiet"] = quiet(a.envs, a.publishes, Path(tmp) / "quiet")
        if a.train_seconds > 0:
            result["training"] = {}
            for runtime in a.train_modes:
                result["machine"][f"load_avg_1m_before_{runtime}"] = os.getloadavg()[0]
                print(f"training InvertedPendulum-v5 for {a.train_seconds:g} s, versions served by {runtime}",
                      flush=True)
                result["training"][runtime] = training(runtime, a.train_seconds, Path(tmp))
    result["machine"]["load_avg_1m_after"] = os.getloadavg()[0]
    return report(a.json, result, print_table)


def print_table(r: dict) -> None:
    def s(x):
        return "-" if x is None else f"{x:.3f}"

    for env_id, w in r.get("write", {}).items():
        print(f"\nONNX file of a {env_id} version: export {w['export']['cpu_ms']:.0f} CPU-ms "
              f"({w['export']['wall_ms']:.0f} ms), re-weighted {w['reweight']['cpu_ms']:.0f} CPU-ms "
              f"({w['reweight']['wall_ms']:.0f} ms)")
    print(f"\n{'what':<44} {'median s':>9} {'p99 s':>7} {'max s':>7} {'max abs err':>11}")
    for q in r["quiet"].values():
        print(f"{'quiet ' + q['env'] + ' ' + q['runtime']:<44} {s(q['median_s']):>9} {s(q['p99_s']):>7} "
              f"{s(q['max_s']):>7} {q['max_abs_error']:>11.2e}")
        print_phases(q.get("phases", {}))
    for runtime, t in r.get("training", {}).items():
        err = "-" if t["max_abs_error"] is None else f"{t['max_abs_error']:.2e}"
        print(f"{'training pendulum ' + runtime + ' (' + str(t['versions']) + ' versions)':<44} "
              f"{s(t['median_s']):>9} {s(t['p99_s']):>7} {s(t['max_s']):>7} {err:>11}")
        print_phases(t.get("phases", {}))
        print(f"    lag per batch: mean {s(t['lag_versions_mean'])} versions, max {t['lag_versions_max']} "
              f"({t['batches']} batches); return {t['recent_return']}, to 500 after {t['seconds_to_500']} s")


def print_phases(found: dict) -> None:
    if found:
        print("    phases, median (max) s: " + ", ".join(f"{what} {p['median_s']:.3f} ({p['max_s']:.2f})"
                                                       for what, p in found.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
