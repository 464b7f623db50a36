"""Scale-out on this machine: one vs two gateways and one vs two Triton replicas side by side in one run,
and a capacity model fitted from the measurements, with its predictions for a fleet.

    python benchmarks/scale_out.py [--seconds 6 --sessions 32 --vector-sessions 4 --rows 64 --clients 2
                                    --nats --json benchmarks/results/scale_out.json]

The same load in every configuration: `--clients` load-generator processes (bridge.client sessions, so the
figures include the client's own work), `--sessions` single-env sessions stepping batch-1 and, as a second
block, `--vector-sessions` vectorised sessions of `--rows` rows each; session i starts on gateway
i % gateways (it holds every gateway's address). Configurations: 1 gateway + 1 Triton, 2 gateways + 1 Triton,
1 gateway + 2 Tritons (`--triton A,B`), 2 gateways + 2 Tritons. Every gateway logs experience
(`--experience-dir`); the gateways of one configuration share one registry file. Loopback only, every loop
bounded by `--seconds`.

Measured per block: steps/s (messages) and rows/s, the client's round trip p50/p99, and the CPU seconds of
each role's processes over the block (/proc/<pid>/stat utime+stime of the gateway processes, of each
tritonserver's process group with its python-backend stubs, and of the load generators). The capacity model:

- gateway CPU = a * messages + b * rows (least squares over every block): CPU per message and per row;
- Triton time per batch = t0 + t1 * B, fitted from batches of B rows driven straight at a replica
  with tritonclient (B = 1 .. 256);
- stream bytes per transition: the serialized Transition (the MCAP records' payloads) and, with `--nats`,
  the JetStream stream's bytes / messages from its stream info (one gateway with `--experience nats://`).

Its prediction for 2,000 robots at 50 Hz (batch-1 sessions) and 10,000 simulated envs at `--sim-hz`
(vectorised sessions of 256 rows): gateways, Triton replicas, cores, stream bandwidth. Then it is checked
against the 1-vs-2 measurements here: each configuration's predicted steps/s is the lowest of the ceilings
(each gateway one event loop: at most one core; each replica's python backend one process per version: at
most one core; the whole machine: its cores over the CPU of every role per step), beside the measured value.
On 2 shared cores two gateways cannot scale like two hosts: the machine ceiling binds, and the table shows it.

Prints a table and progress lines, writes JSON (default benchmarks/results/scale_out.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/scale_out.py` from the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks.bench import parser, report, say  # noqa: E402
from bridge.client import Session  # noqa: E402
from bridge.common.percentiles import p50_p99  # noqa: E402
from protos import bridge_pb2  # noqa: E402
from protos.codec import Spec, encode  # noqa: E402

OBS = (Spec("observation", np.float32, (11,)),)  # Hopper-v5 sized, as benchmarks/loop_latency.py
ACT = (Spec("action", np.float32, (3,), low=(-1.0,), high=(1.0,)),)
MODEL = "scale_mlp"
TICK = os.sysconf("SC_CLK_TCK")
HEADROOM = 0.7  # plan each process at 70% of a core


# -- the load generator (a subprocess: `--worker`) --------------------------------------------------

async def _worker(addresses: list[str], *, sessions: int, rows: int, seconds: float, prefix: str,
                  first: int) -> dict:
    """`sessions` sessions (vectorised of `rows` rows when rows > 0), each starting on its own gateway of
    `addresses`; says "ready", waits for a line on stdin, steps for `seconds`, returns counts and samples."""
    vector = rows > 0
    opened: list[Session] = []
    spec = dict(observation_spec=[s.to_proto() for s in OBS], action_spec=[s.to_proto() for s in ACT])
    for k in range(sessions):
        i = first + k
        order = addresses[i % len(addresses):] + addresses[:i % len(addresses)]
        hello = bridge_pb2.Hello(session_id=f"{prefix}-{i}", batched=vector, num_envs=rows if vector else 0, **spec)
        opened.append(await Session(order, hello, reconnect_s=5.0).__aenter__())
    data = np.random.default_rng(first).standard_normal((max(rows, 1), 11)).astype(np.float32)
    tensors = [encode("observation", data if vector else data[0])]
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    stop_at = time.monotonic() + seconds

    errors: dict[str, int] = {}

    async def run(session: Session) -> list[int]:
        samples, step = [], 0
        while time.monotonic() < stop_at:
            obs = bridge_pb2.Observation(step=step, t_sent_ns=time.time_ns(), step_type=bridge_pb2.MID,
                                         tensors=tensors)
            if vector:
                obs.env_step_types.extend([bridge_pb2.MID] * rows)
            t0 = time.perf_counter_ns()
            reply = await session.step(obs)
            samples.append(time.perf_counter_ns() - t0)
            kind = reply.WhichOneof("kind")
            if kind == "error":  # a StepError (deadline, ...): counted; the session goes on
                name = bridge_pb2.StepError.Code.Name(reply.error.code)
                errors[name] = errors.get(name, 0) + 1
            elif kind != "action":
                raise RuntimeError(f"{session.id} step {step}: {reply}")
            step += 1
        return samples

    t0 = time.monotonic()
    results = await asyncio.gather(*(run(s) for s in opened))
    elapsed = time.monotonic() - t0
    for s in opened:
        await s.__aexit__(None, None, None)
    samples = [x for r in results for x in r]
    return {"steps": len(samples), "rows": len(samples) * max(rows, 1), "elapsed_s": elapsed, "samples_ns": samples,
            "errors": errors}


def worker_main(a: argparse.Namespace) -> int:
    out = asyncio.run(_worker(a.worker.split(","), sessions=a.sessions, rows=a.rows, seconds=a.seconds,
                              prefix=a.prefix, first=a.first))
    print(json.dumps(out), flush=True)
    return 0


# -- processes and their CPU ------------------------------------------------------------------------

def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (not their children), in seconds; a gone process counts 0."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / TICK


def triton_pids(triton) -> list[int]:
    from bridge.common.processes import group_members

    return group_members(triton.pid)  # tritonserver and its python-backend stubs


def run_block(addresses: list[str], roles: dict[str, list[int]], *, clients: int, sessions: int, rows: int,
              seconds: float, prefix: str) -> dict:
    """One block of load: `clients` worker processes started, all ready, then go; CPU per role over it."""
    per = [sessions // clients + (k < sessions % clients) for k in range(clients)]
    procs, first = [], 0
    for k, n in enumerate(per):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", ",".join(addresses), "--sessions", str(n),
               "--rows", str(rows), "--seconds", str(seconds), "--prefix", f"{prefix}-c{k}", "--first", str(first)]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT))
        first += n
    try:
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"load generator {p.args[-1]} did not start: {line!r} (exit {p.wait()})")
        roles = {**roles, "clients": [p.pid for p in procs]}
        before = {role: cpu_seconds(pids) for role, pids in roles.items()}
        t0 = time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [json.loads(p.stdout.readline()) for p in procs]
        wall = time.monotonic() - t0
        cpu = {role: round(cpu_seconds(pids) - before[role], 3) for role, pids in roles.items()}
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                p.stdin.close()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    elapsed = max(o["elapsed_s"] for o in outs)
    steps, rows_done = sum(o["steps"] for o in outs), sum(o["rows"] for o in outs)
    p50, p99 = p50_p99([x for o in outs for x in o["samples_ns"]])
    errors = dict(sum((Counter(o["errors"]) for o in outs), Counter()))
    return {"sessions": sessions, "rows_per_message": max(rows, 1), "steps": steps, "rows": rows_done,
            "steps_per_s": round(steps / elapsed, 1), "rows_per_s": round(rows_done / elapsed, 1),
            "rtt_ms": {"p50": round(p50 / 1e6, 3), "p99": round(p99 / 1e6, 3)}, "wall_s": round(wall, 2),
            "cpu_s": cpu, "cores_used": round(sum(cpu.values()) / wall, 2), "errors": errors}


# -- Triton time per batch ----------------------------------------------------------------------------

def triton_batch_times(url: str, sizes: tuple[int, ...], calls: int) -> list[dict]:
    """Median time of one infer call of B rows, straight at a replica (tritonclient gRPC), per B. The sizes
    take turns call by call (round robin after a warm-up), so a burst of load from elsewhere on the machine
    falls on every size alike."""
    import tritonclient.grpc as triton_grpc

    client = triton_grpc.InferenceServerClient(url)
    wanted = [triton_grpc.InferRequestedOutput("action")]
    inputs = {}
    for b in sizes:
        inputs[b] = triton_grpc.InferInput("observation", [b, 11], "FP32")
        inputs[b].set_data_from_numpy(np.random.default_rng(b).standard_normal((b, 11)).astype(np.float32))
    times: dict[int, list[int]] = {b: [] for b in sizes}
    try:
        for k in range(calls + 10):
            for b in sizes:
                t0 = time.perf_counter_ns()
                client.infer(MODEL, [inputs[b]], model_version="1", outputs=wanted)
                if k >= 10:  # warm-up first
                    times[b].append(time.perf_counter_ns() - t0)
    finally:
        client.close()
    out = [{"batch": b, "median_ms": round(float(np.median(times[b])) / 1e6, 4),
            "p99_ms": round(float(np.percentile(times[b], 99)) / 1e6, 4)} for b in sizes]
    say(f"triton per call (median of {calls}): " + ", ".join(f"B={p['batch']} {p['median_ms']} ms" for p in out))
    return out


# -- stream bytes per transition ----------------------------------------------------------------------

def transition_bytes(log_dirs: list[Path], limit: int = 2000) -> dict:
    """The serialized Transition's size (MCAP records' payloads), and the log's bytes on disk per record."""
    from mcap.reader import make_reader

    sizes, records, disk = [], 0, 0
    for d in log_dirs:
        for segment in sorted(d.glob("*.mcap")):
            disk += segment.stat().st_size
            with open(segment, "rb") as f, contextlib.suppress(Exception):  # a segment still open: its summary
                for _, _, message in make_reader(f).iter_messages():
                    records += 1
                    if len(sizes) < limit:
                        sizes.append(len(message.data))
    return {"transition_bytes": round(float(np.mean(sizes)), 1) if sizes else None, "sampled": len(sizes),
            "records": records, "disk_bytes_per_record": round(disk / records, 1) if records else None}


async def stream_info(servers: str) -> dict:
    from bridge.experience.jetstream import STREAM, connect

    nc = await connect(servers.split(","), name="scale-out-benchmark")
    try:
        info = await nc.jetstream().stream_info(STREAM)
        return {"messages": info.state.messages, "bytes": info.state.bytes,
                "bytes_per_message": round(info.state.bytes / max(info.state.messages, 1), 1),
                "replicas": info.config.num_replicas}
    finally:
        await nc.close()


# -- the capacity model ------------------------------------------------------------------------------

def fit_gateway(blocks: list[dict]) -> dict:
    """gateway CPU seconds = a * messages + b * rows, least squares over every block."""
    m = np.array([[b["steps"], b["rows"]] for b in blocks], dtype=float)
    y = np.array([b["cpu_s"]["gateways"] for b in blocks], dtype=float)
    (a, b), *_ = np.linalg.lstsq(m, y, rcond=None)
    return {"cpu_us_per_message": round(a * 1e6, 2), "cpu_us_per_row": round(b * 1e6, 3)}


def fit_triton(points: list[dict]) -> dict:
    x = np.array([p["batch"] for p in points], dtype=float)
    y = np.array([p["median_ms"] for p in points], dtype=float)
    t1, t0 = np.polyfit(x, y, 1)
    if t1 < 0:  # noise larger than the per-row cost: a flat line through the median
        t1, t0 = 0.0, float(np.median(y))
    return {"t0_ms": round(float(t0), 4), "t1_us_per_row": round(float(t1) * 1e3, 3)}


def plan(*, rows_per_s: float, rows_per_message: int, gateway: dict, triton: dict, max_batch: int,
         transition: float | None, stream_replicas: int = 3) -> dict:
    """Gateways, replicas and cores for `rows_per_s` rows arriving in messages of `rows_per_message` rows."""
    messages = rows_per_s / rows_per_message
    gw_cores = messages * gateway["cpu_us_per_message"] / 1e6 + rows_per_s * gateway["cpu_us_per_row"] / 1e6
    gateways = math.ceil(gw_cores / HEADROOM)
    t0, t1 = triton["t0_ms"] / 1e3, triton["t1_us_per_row"] / 1e6
    batch = max_batch  # loaded gateways fill their batches (the micro-batcher's --max-batch)
    replica_rows = batch / (t0 + t1 * batch)  # rows/s one replica's one backend process can serve
    replicas = math.ceil(rows_per_s / (replica_rows * HEADROOM))
    out = {"rows_per_s": rows_per_s, "messages_per_s": round(messages), "gateway_cores": round(gw_cores, 1),
           "gateways": gateways, "triton_batch": batch, "rows_per_s_per_replica": round(replica_rows),
           "replicas": replicas, "triton_cores": round(rows_per_s / replica_rows, 1)}
    if transition:
        out["stream_mb_per_s"] = round(rows_per_s * transition / 1e6, 1)
        out["stream_mb_per_s_replicated"] = round(rows_per_s * transition * stream_replicas / 1e6, 1)
    return out


def check(configs: list[dict], cores: int) -> list[dict]:
    """Each configuration's predicted steps/s (the lowest ceiling) beside the measured, per block kind,
    with per-step CPU of every role taken from the 1-gateway, 1-Triton configuration."""
    base = {b["kind"]: b for b in configs[0]["blocks"]}
    rows = []
    for config in configs:
        for block in config["blocks"]:
            ref = base[block["kind"]]
            per_step = {role: ref["cpu_s"][role] / ref["steps"] for role in ref["cpu_s"]}
            ceilings = {"gateways (1 core each)": config["gateways"] / per_step["gateways"],
                        "replicas (1 core each)": config["tritons"] / per_step["tritons"],
                        f"machine ({cores} cores)": cores / sum(per_step.values())}
            binding = min(ceilings, key=ceilings.get)
            hosts = min(ceilings["gateways (1 core each)"], ceilings["replicas (1 core each)"])
            rows.append({"config": config["name"], "kind": block["kind"], "measured": block["steps_per_s"],
                         "predicted": round(ceilings[binding]), "binding": binding,
                         "predicted_on_own_hosts": round(hosts),
                         "ratio": round(block["steps_per_s"] / ceilings[binding], 2),
                         "cores_used": block["cores_used"],  # what the block got of the shared machine
                         "cpu_ms_per_step": round(sum(block["cpu_s"].values()) / block["steps"] * 1e3, 3)})
    for row in rows:  # 2-vs-1 as measured and as predicted, against the same kind in the first configuration
        first = next(r for r in rows if r["kind"] == row["kind"])
        row["measured_vs_first"] = round(row["measured"] / first["measured"], 2)
        row["predicted_vs_first"] = round(row["predicted"] / first["predicted"], 2)
        row["own_hosts_vs_first"] = round(row["predicted_on_own_hosts"] / first["predicted_on_own_hosts"], 2)
        row["cpu_per_step_vs_first"] = round(row["cpu_ms_per_step"] / first["cpu_ms_per_step"], 2)
    return rows


# -- the run -------------------------------------------------------------------------------------------

CONFIGS = (("1 gateway, 1 Triton", 1, 1), ("2 gateways, 1 Triton", 2, 1), ("1 gateway, 2 Tritons", 1, 2),
           ("2 gateways, 2 Tritons", 2, 2))  # (name, gateways, Triton replicas)


def gateway_flags(a: argparse.Namespace) -> tuple[str, ...]:
    """The same in every configuration: the batch bound, and a deadline long enough for a loaded machine
    (a step past it is a StepError, counted in the block's errors)."""
    return ("--max-batch", str(a.max_batch), "--deadline-ms", str(a.deadline_ms))


def start_gateways(a: argparse.Namespace, where: Path, tritons: str, repository: Path) -> list:
    """Two gateways on `tritons` sharing one registry file, each with its own experience log, started at once."""
    from tether.stack import GatewayProcess

    gateways = [GatewayProcess(triton_url=tritons, policy=MODEL, log_path=where / f"gateway-{g}.log", timeout=180.0,
                               extra_args=("--registry", str(where / "registry.sqlite"), "--gateway-id", f"gateway-{g}",
                                           "--experience-dir", str(where / f"gateway-{g}" / "experience"),
                                           "--model-repository", str(repository), *gateway_flags(a)))
                for g in range(2)]
    where.mkdir(parents=True, exist_ok=True)
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda gw: gw.start(), gateways))
    except BaseException:
        for gw in gateways:
            gw.stop()
        raise
    return gateways


def run_config(a: argparse.Namespace, name: str, gateways: list, tritons: list) -> dict:
    """The batch-1 block and the vector block through `gateways`."""
    roles = {"gateways": [gw.pid for gw in gateways], "tritons": [p for t in tritons for p in triton_pids(t)]}
    addresses = [gw.address for gw in gateways]
    say(f"{name}: gateways {addresses}, tritons {[t.grpc_url for t in tritons]}")
    blocks = []
    for kind, sessions, rows in (("batch-1", a.sessions, 0), (f"vector x{a.rows}", a.vector_sessions, a.rows)):
        block = run_block(addresses, roles, clients=a.clients, sessions=sessions, rows=rows, seconds=a.seconds,
                          prefix=f"{len(gateways)}g{len(tritons)}t-{kind.split()[0]}")
        block["kind"] = kind
        blocks.append(block)
        say(f"{name}, {kind}: {block['steps_per_s']:.0f} steps/s ({block['rows_per_s']:.0f} rows/s), "
            f"rtt p50/p99 {block['rtt_ms']['p50']}/{block['rtt_ms']['p99']} ms, cpu {block['cpu_s']}"
            + (f", errors {block['errors']}" if block["errors"] else ""))
    return {"name": name, "gateways": len(gateways), "tritons": len(tritons), "blocks": blocks}


def run(a: argparse.Namespace) -> dict:
    from inference_server import ModelRepository, TritonServer
    from trainer.policy import MLPPolicy

    tmp = Path(tempfile.mkdtemp(prefix="tether-scale-out-"))
    repo = ModelRepository(tmp / "models")
    repo.write_version(MODEL, 1, MLPPolicy(OBS[0], ACT[0], seed=0), OBS, ACT, max_batch_size=256)
    result: dict = {"machine": platform.machine(), "cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg(),
                    "seconds": a.seconds, "sessions": a.sessions, "vector_sessions": a.vector_sessions,
                    "rows": a.rows, "clients": a.clients, "max_batch": a.max_batch, "run_dir": str(tmp),
                    "configs": []}
    with contextlib.ExitStack() as stack:
        tritons = [TritonServer(repo.root, models=[MODEL], log_path=tmp / f"triton-{i}.log") for i in range(2)]
        for triton in tritons:
            stack.callback(triton.stop)
        t0 = time.monotonic()
        with ThreadPoolExecutor(2) as pool:  # started together
            list(pool.map(lambda t: t.start(), tritons))
        say(f"tritons on {[t.grpc_url for t in tritons]} (ready in {time.monotonic() - t0:.1f} s)")
        result["triton_batches"] = triton_batch_times(tritons[0].grpc_url, (1, 8, 32, 64, 128, 256), a.calls)
        logs: list[Path] = []
        for n_tr in (1, 2):  # two gateways per Triton set, started together; the 1-gateway case uses the first
            urls = ",".join(t.grpc_url for t in tritons[:n_tr])
            gateways = start_gateways(a, tmp / f"t{n_tr}", urls, repo.root)
            logs += [tmp / f"t{n_tr}" / f"gateway-{g}" / "experience" for g in range(2)]
            try:
                result["configs"] += [run_config(a, name, gateways[:n_gw], tritons[:n_tr])
                                      for name, n_gw, n in CONFIGS if n == n_tr]
            finally:
                for gw in gateways:
                    gw.stop()
        result["transitions"] = transition_bytes(logs)
        if a.nats:
            result["nats"] = run_nats(a, tmp, tritons[0], roles_tritons=triton_pids(tritons[0]))
    return result


def run_nats(a: argparse.Namespace, tmp: Path, triton, roles_tritons: list[int]) -> dict:
    """One gateway streaming to a one-server JetStream (`--experience nats://`), the batch-1 block, and the
    stream's bytes per message from its stream info."""
    from tether.cluster.nats import NatsCluster, nats_server_binary
    from tether.stack import GatewayProcess

    if not nats_server_binary():
        say("nats-server not installed: no NATS block")
        return {"skipped": "nats-server not installed"}
    with NatsCluster(tmp / "nats", servers=1) as nats:
        with GatewayProcess(triton_url=triton.grpc_url, policy=MODEL, log_path=tmp / "nats-gateway.log",
                            extra_args=("--registry", str(tmp / "nats-registry.sqlite"), "--experience", nats.url,
                                        *gateway_flags(a)), timeout=120.0) as gw:
            block = run_block([gw.address], {"gateways": [gw.pid], "tritons": roles_tritons}, clients=a.clients,
                              sessions=a.sessions, rows=0, seconds=a.seconds, prefix="nats")
        block["kind"], block["stream"] = "batch-1, --experience nats://", asyncio.run(stream_info(nats.url))
        say(f"NATS: {block['steps_per_s']:.0f} steps/s, rtt p50/p99 {block['rtt_ms']['p50']}/{block['rtt_ms']['p99']}"
            f" ms, stream {block['stream']}")
        return block


def model(result: dict, a: argparse.Namespace) -> dict:
    blocks = [b for c in result["configs"] for b in c["blocks"]]
    gateway, triton = fit_gateway(blocks), fit_triton(result["triton_batches"])
    transition = result["transitions"]["transition_bytes"]
    stream = (result.get("nats") or {}).get("stream") or {}
    stored = stream.get("bytes_per_message") or transition
    out = {"gateway": gateway, "triton": triton, "stream_bytes_per_transition": {
        "serialized_transition": transition, "mcap_disk_per_record": result["transitions"]["disk_bytes_per_record"],
        "jetstream_per_message": stream.get("bytes_per_message")},
        "robots": {"robots": 2000, "hz": 50, **plan(rows_per_s=2000 * 50, rows_per_message=1, gateway=gateway,
                                                     triton=triton, max_batch=a.max_batch, transition=stored)},
        "sims": {"envs": 10000, "hz": a.sim_hz, "rows_per_session": 256,
                 **plan(rows_per_s=10000 * a.sim_hz, rows_per_message=256, gateway=gateway, triton=triton,
                        max_batch=max(a.max_batch, 256), transition=stored)},
        "check": check(result["configs"], os.cpu_count() or 1)}
    out["conclusion"] = conclusion(out["check"])
    return out


def conclusion(rows: list[dict]) -> str:
    """Two gateways against one, as measured here, as predicted for this machine and on hosts of their own."""
    two = [r for r in rows if r["config"] == CONFIGS[1][0]]
    parts = [f"{r['kind']} x{r['measured_vs_first']} measured, x{r['predicted_vs_first']} predicted here, "
             f"x{r['own_hosts_vs_first']} on own hosts" for r in two]
    return (f"2 gateways vs 1 on these {os.cpu_count()} shared cores: " + "; ".join(parts)
            + ". Gateways on one machine share its cores: they scale like hosts only on hosts of their own.")


def print_table(result: dict) -> None:
    print(f"\n{'configuration':<24}{'block':<12}{'steps/s':>9}{'rows/s':>9}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'gw cpu':>8}{'tr cpu':>8}{'cli cpu':>8}")
    for c in result["configs"]:
        for b in c["blocks"]:
            print(f"{c['name']:<24}{b['kind']:<12}{b['steps_per_s']:>9.0f}{b['rows_per_s']:>9.0f}"
                  f"{b['rtt_ms']['p50']:>8.2f}{b['rtt_ms']['p99']:>8.2f}{b['cpu_s']['gateways']:>8.2f}"
                  f"{b['cpu_s']['tritons']:>8.2f}{b['cpu_s']['clients']:>8.2f}")
    if result.get("nats") and "steps_per_s" in result["nats"]:
        b = result["nats"]
        print(f"{'1 gw, NATS stream':<24}{'batch-1':<12}{b['steps_per_s']:>9.0f}{b['rows_per_s']:>9.0f}"
              f"{b['rtt_ms']['p50']:>8.2f}{b['rtt_ms']['p99']:>8.2f}{b['cpu_s']['gateways']:>8.2f}"
              f"{b['cpu_s']['tritons']:>8.2f}{b['cpu_s']['clients']:>8.2f}")
    m = result["model"]
    print(f"\ncapacity model: gateway {m['gateway']['cpu_us_per_message']} us CPU per message + "
          f"{m['gateway']['cpu_us_per_row']} us per row; Triton per batch {m['triton']['t0_ms']} ms + "
          f"{m['triton']['t1_us_per_row']} us x B; stream {m['stream_bytes_per_transition']}")
    for key in ("robots", "sims"):
        p = m[key]
        what = f"{p.get('robots', p.get('envs'))} {key} at {p['hz']} Hz"
        print(f"  {what:<26} {p['messages_per_s']} msg/s, {p['rows_per_s']:.0f} rows/s: {p['gateways']} gateways "
              f"({p['gateway_cores']} cores), {p['replicas']} Triton replicas (B={p['triton_batch']}, "
              f"{p['triton_cores']} cores), stream {p.get('stream_mb_per_s', '-')} MB/s "
              f"(x3 replicated {p.get('stream_mb_per_s_replicated', '-')} MB/s)")
    print(f"\n{'configuration':<24}{'block':<12}{'measured':>9}{'predicted':>10}{'ratio':>7}  binding ceiling"
          f"{'':<10}{'2v1 meas':>9}{'2v1 pred':>9}{'own hosts':>10}{'cores':>7}{'cpu/step':>9}")
    for r in m["check"]:
        print(f"{r['config']:<24}{r['kind']:<12}{r['measured']:>9.0f}{r['predicted']:>10}{r['ratio']:>7}  "
              f"{r['binding']:<25}{r['measured_vs_first']:>9}{r['predicted_vs_first']:>9}{r['own_hosts_vs_first']:>10}"
              f"{r['cores_used']:>7}{r['cpu_per_step_vs_first']:>9}")
    print(conclusion(m["check"]))
    print("(steps/s; predicted = the lowest ceiling with the 1-gateway, 1-Triton block's CPU per step of every role;"
          " own hosts = each gateway and replica on its own cores; cores = CPU seconds of every role / wall, what the"
          " block got of the shared machine; cpu/step = CPU per step of all roles against the first configuration)")


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__)
    p.add_argument("--seconds", type=float, default=6.0, help="per block")
    p.add_argument("--sessions", type=int, default=32, help="single-env sessions (batch-1 block)")
    p.add_argument("--vector-sessions", type=int, default=4, help="vectorised sessions (vector block)")
    p.add_argument("--rows", type=int, default=64, help="rows per vectorised session")
    p.add_argument("--clients", type=int, default=2, help="load-generator processes")
    p.add_argument("--max-batch", type=int, default=64, help="the gateways' --max-batch")
    p.add_argument("--deadline-ms", type=int, default=1000, help="the gateways' --deadline-ms")
    p.add_argument("--calls", type=int, default=60, help="infer calls per batch size for t0 + t1*B")
    p.add_argument("--sim-hz", type=float, default=50.0, help="the simulated envs' step rate in the prediction")
    p.add_argument("--nats", action=argparse.BooleanOptionalAction, default=True,
                   help="a block with --experience nats:// (one nats-server) for the stream's bytes per message")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)  # the load generator: gateway addresses
    p.add_argument("--prefix", default="w", help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker_main(a)
    for name in ("seconds", "sessions", "vector_sessions", "rows", "clients", "calls"):
        if getattr(a, name) <= 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    started = time.monotonic()
    result = run(a)
    result["model"] = model(result, a)
    result["wall_s"] = round(time.monotonic() - started, 1)
    report(a.json, result, print_table)
    say(f"done in {result['wall_s']} s; JSON {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
