"""Hot swap: publish -> live time (a small MLP and a ~100 MB wide MLP), weight transfer MB/s over
`tether.v1.Policies.Publish`, and the control steps of running MuJoCo sims during swaps versus
without swaps, in one run.

    python benchmarks/hot_swap.py [--sessions 4 --period-ms 20 --deadline-ms 50 --small-swaps 5
                                   --big-swaps 3 --huge-swaps 1 --quiet-s 6 --json benchmarks/results/hot_swap.json]

Triton and the gateway (`--switch step`: a session acts with a new version from its next step)
are subprocesses; the sims are a subprocess of this script (`--worker`), N Hopper-v5 sessions
each stepping every `--period-ms` and recording every control step (send time, round trip,
version). This process publishes new weights like a trainer does (safetensors, 1 MiB chunks,
probe batch) and records each swap's window, from the first byte sent to the reply (the version
gated, served by Triton, verified on the probe batch and live). Steps sent inside a window (plus
0.5 s) count as "during swaps", the others as "without". Prints a table and writes JSON.

Models: `small` (a 64x64 MLP served by torch), `small_ort` (the same, written with serve="onnx":
its versions are served by onnxruntime), `onnx` (the MLP imported as an ONNX file, as `tether
policy import` sends it), `big` (a 5000x5000 MLP, 25 M parameters, ~100 MB, served by torch), `huge`
(`--huge-swaps`: a 16000x16000 MLP, 256 M parameters, ~1 GB, written to a safetensors file and sent from
disk with `PoliciesClient.publish_file`). The sessions act with `small`, which its swaps move them to; the
other swaps run beside them. Each swap records the gateway's resident memory growth (sampled every 5 ms).

Every step keeps its Action.timing, so a late step is told apart by the hop it spent longest in (to the gateway,
batching, Triton, back to the sim), and every swap lists when, from its first byte, its late steps and errors
were sent. `--stub-load-nice 0` loads new versions at their stub's own priority (as before; default: 19 steps
nicer, inference_server/triton_model.py); `--autogroup-nice -20` (root) gives this run's sessions (sims,
gateway, Triton, publisher: each its own) the CPU a quiet machine would, on a machine shared with other work.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import safetensors.torch
import torch
from bench import machine, parser, report, specs

from bridge.client import PoliciesClient, Session
from bridge.client.weights import safetensors_parts
from bridge.common.percentiles import p50_p99
from inference_server import ModelRepository, TritonServer
from inference_server.triton_model import LOAD_NICE_ENV
from protos import bridge_pb2, policies_pb2
from protos.codec import decode_all, encode, encode_all
from tether.stack import GatewayProcess
from trainer.policy import MLPPolicy

SMALL, ORT, BIG, ONNX, HUGE = "swap_mlp", "swap_mlp_ort", "swap_big", "swap_onnx", "swap_huge"
BIG_HIDDEN = (5000, 5000)  # 11*5000 + 5000*5000 + 5000*3 ≈ 25.1 M float32 parameters ≈ 100 MB
HUGE_HIDDEN = (16000, 16000)  # ≈ 256.2 M float32 parameters ≈ 1.02 GB
CHUNK = 1 << 20
KINDS = ("small", "small_ort", "onnx", "big", "huge")
LINGER_S = 0.5  # steps this long after a swap's reply still count as "during" it
KIND = {"action": 0, "episode_end": 1, "error": 2}
# a step row: its send time (monotonic), round trip, version, kind, session, then its Action.timing (wall clock:
# sent, gateway received, inference start/end, gateway sent), when the sim got it, and a StepError's code
COLUMNS = ("t0", "rtt", "version", "kind", "session", "sent", "gw_recv", "infer_start", "infer_end", "gw_send",
           "received", "error_code")
# where a late action's round trip went: the hop between two timing columns
HOPS = {"to_gateway": ("sent", "gw_recv"), "batching": ("gw_recv", "infer_start"),
        "triton": ("infer_start", "infer_end"), "gateway_after": ("infer_end", "gw_send"),
        "to_sim": ("gw_send", "received")}


# -- the sims (a subprocess) --------------------------------------------------------------------------------------


async def _session(address: str, index: int, period_s: float, ready: asyncio.Event, start: asyncio.Event,
                   stop_at: list[float], rows: list[tuple]) -> None:
    from sim.mujoco import GymnasiumEnv

    env = GymnasiumEnv("Hopper-v5", seed=index)
    zero = {s.name: np.zeros(s.shape, s.dtype) for s in env.action_spec()}
    hello = bridge_pb2.Hello(session_id=f"swap-{index}", policy=SMALL, source="bench:hot_swap",
                             observation_spec=[s.to_proto() for s in env.observation_spec()],
                             action_spec=[s.to_proto() for s in env.action_spec()])
    async with Session(address, hello, reply_timeout_s=60.0) as session:
        ready.set()
        await start.wait()
        ts, step, episode = env.reset(), 0, 0
        due = time.monotonic()
        while time.monotonic() < stop_at[0]:
            t0 = time.monotonic_ns()
            msg = await session.step(bridge_pb2.Observation(
                step=step, t_sent_ns=time.time_ns(), step_type=int(ts.step_type), episode=episode,
                tensors=encode_all(ts.observation), reward=ts.reward, terminated=ts.terminated,
                applied_action=encode_all(ts.applied_action or {})))
            rtt, received = time.monotonic_ns() - t0, time.time_ns()
            kind = msg.WhichOneof("kind")
            version = msg.action.policy_version if kind == "action" else -1
            t = msg.action.timing
            rows.append((t0, rtt, version, KIND.get(kind, 3), index, t.t_sent_ns, t.gateway_recv_ns, t.infer_start_ns,
                         t.infer_end_ns, t.gateway_send_ns, received, msg.error.code if kind == "error" else 0))
            step += 1
            if kind == "episode_end" or ts.last():
                ts, episode = env.reset(), episode + 1
            else:
                ts = env.step(decode_all(msg.action.tensors) if kind == "action" else zero)
            due += period_s
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                due = time.monotonic()  # behind: no burst to catch up
    env.close()


async def _worker(address: str, sessions: int, period_ms: float, out: Path) -> None:
    rows: list[tuple] = []
    readies = [asyncio.Event() for _ in range(sessions)]
    start, stop_at = asyncio.Event(), [float("inf")]
    tasks = [asyncio.create_task(_session(address, i, period_ms / 1e3, readies[i], start, stop_at, rows))
             for i in range(sessions)]
    await asyncio.gather(*(r.wait() for r in readies))
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    start.set()
    await loop.run_in_executor(None, sys.stdin.readline)  # the parent says when to stop
    stop_at[0] = time.monotonic()
    await asyncio.gather(*tasks)
    np.save(out, np.asarray(rows, dtype=np.int64).reshape(-1, len(COLUMNS)))


# -- publishing (this process) ------------------------------------------------------------------------------------


def publish(policies: PoliciesClient, name: str, module: torch.nn.Module, observation_spec, *, parent: int) -> dict:
    """Publish `module`'s weights as a new version of `name`; the timings of each part."""
    t0 = time.monotonic()
    data = safetensors.torch.save({k: v.contiguous() for k, v in module.state_dict().items()})
    t_serialised = time.monotonic()
    digest = hashlib.sha256(data).hexdigest()
    t_hashed = time.monotonic()
    probe = np.random.default_rng(parent).standard_normal((4, *observation_spec.shape)).astype(np.float32)
    with torch.no_grad():
        reference = module(torch.from_numpy(probe)).numpy()
    header = policies_pb2.PublishHeader(policy=name, format="safetensors", size=len(data), sha256=digest,
                                        lineage=policies_pb2.Lineage(parent_version=parent, trainer="bench"),
                                        probe_inputs=[encode(observation_spec.name, probe)],
                                        probe_outputs=[encode("action", reference)])
    marks: dict[str, float] = {}

    def chunks():
        marks["first"] = time.monotonic()
        yield policies_pb2.PublishChunk(header=header)
        view = memoryview(data)
        for i in range(0, len(data), CHUNK):
            yield policies_pb2.PublishChunk(data=bytes(view[i:i + CHUNK]))
        marks["last"] = time.monotonic()

    reply = policies.publish_stream(chunks())
    return _figures(reply, name, len(data), marks["first"], time.monotonic(), serialise_s=t_serialised - t0,
                    sha256_s=t_hashed - t_serialised, client_send_s=marks["last"] - marks["first"])


def _figures(reply: policies_pb2.PublishReply, name: str, size: int, start: float, end: float, *,
             serialise_s: float = 0.0, sha256_s: float = 0.0, client_send_s: float = 0.0) -> dict:
    """A publish's figures: its reply, its size and the client's times (monotonic seconds)."""
    stream_s = end - start
    return {"policy": name, "version": reply.version, "bytes": size, "serialise_s": serialise_s, "sha256_s": sha256_s,
            "start_ns": int(start * 1e9), "end_ns": int(end * 1e9), "publish_to_live_s": stream_s,
            "server_s": reply.load_seconds, "client_send_s": client_send_s, "transfer_s": stream_s - reply.load_seconds,
            "transfer_mb_s": size / 1e6 / max(stream_s - reply.load_seconds, 1e-9),
            "max_abs_error": reply.max_abs_error, "ready_versions": list(reply.ready_versions)}


def onnx_file(module: torch.nn.Module, observation_spec) -> bytes:
    import io

    buffer = io.BytesIO()
    name = observation_spec.name
    torch.onnx.export(module, (torch.zeros(1, *observation_spec.shape),), buffer, input_names=[name],
                      output_names=["action"], dynamic_axes={name: {0: "batch"}, "action": {0: "batch"}}, dynamo=False)
    return buffer.getvalue()


def publish_import(policies: PoliciesClient, name: str, data: bytes, obs_spec, act_spec) -> dict:
    """An ONNX file through `tether policy import`'s path (format "onnx": served by onnxruntime in Triton)."""
    from tether.policy_cli import PolicyFile, probe_inputs, publish_chunks, reference_outputs

    policy = PolicyFile("onnx", data, tuple(obs_spec), tuple(act_spec), source="bench")
    probe = probe_inputs(policy.inputs, batch=4)
    expected = reference_outputs(policy, probe)
    t0 = time.monotonic()
    reply = policies.publish_stream(publish_chunks(policy, name, probe, expected))
    return _figures(reply, name, len(data), t0, time.monotonic())


def publish_from_file(client: PoliciesClient, module: torch.nn.Module, path: Path, observation_spec, *,
                      parent: int) -> dict:
    """`module`'s weights written to a safetensors file (from the tensors' memory, as a trainer's checkpoint),
    then sent from disk in 1 MiB chunks (`PoliciesClient.publish_file`: a digest pass, then the stream)."""
    t0 = time.monotonic()
    with path.open("wb") as f:
        for part in safetensors_parts(module.state_dict()):
            f.write(part)
    size = path.stat().st_size
    probe = np.random.default_rng(parent).standard_normal((4, *observation_spec.shape)).astype(np.float32)
    with torch.no_grad():
        reference = module(torch.from_numpy(probe)).numpy()
    t_start = time.monotonic()
    reply = client.publish_file(HUGE, path, lineage=policies_pb2.Lineage(parent_version=parent, trainer="bench"),
                                probe_inputs={observation_spec.name: probe}, probe_outputs={"action": reference})
    t_end = time.monotonic()
    path.unlink()
    return _figures(reply, HUGE, size, t_start, t_end, serialise_s=t_start - t0)


class RssPeak:
    """A process's resident memory sampled every 5 ms in a thread: `growth_mib` = peak - at the start.

        with RssPeak(pid) as rss:
            ...
        rss.growth_mib
    """

    def __init__(self, pid: int):
        self.pid, self.start, self.peak = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> RssPeak:
        self.start = self.peak = _rss_kib(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.start) / 1024

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_kib(self.pid))
            time.sleep(0.005)


def _rss_kib(pid: int, field: str = "VmRSS") -> int:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return next((int(line.split()[1]) for line in lines if line.startswith(field + ":")), 0)


def receive_costs(module: torch.nn.Module) -> dict:
    """CPU and wall seconds of what the gateway does with a big publish's bytes on receipt, one by one
    (CPU time is what a quiet machine would take; wall time here includes the other processes)."""
    from bridge.gate.checks import integrity

    weights = {k: v.contiguous() for k, v in module.state_dict().items()}
    data = safetensors.torch.save(weights)
    chunks = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]

    def concatenated() -> bytes:  # the servicer's loop (policies_service.Publish)
        joined = bytearray()
        for c in chunks:
            joined += c
        return bytes(joined)

    def preallocated() -> memoryview:  # into one buffer of the announced size, no final copy
        buffer = bytearray(len(data))
        view, at = memoryview(buffer), 0
        for c in chunks:
            view[at:at + len(c)] = c
            at += len(c)
        return view

    steps = {"concatenate_bytearray_then_bytes": concatenated, "preallocated_buffer": preallocated,
             "sha256": lambda: hashlib.sha256(data).hexdigest(),
             "safetensors_load": lambda: safetensors.torch.load(data),
             "gate_integrity_incl_sha256": lambda: integrity(weights, weights, sha256=hashlib.sha256(data).hexdigest(),
                                                             data=data)}
    costs = {}
    for name, fn in steps.items():
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        costs[name] = {"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - t0}
    return {"mb": len(data) / 1e6, "steps": costs}


def perturbed(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 1e-3)
    return module


def autogroup_nice(pids: list[int], nice: int) -> None:
    """Each pid's autogroup (Linux's CFS shares the CPU fairly between sessions first, then by niceness within
    one) at niceness `nice`: on a machine shared with other work, -20 (root) gives this run's sessions the
    CPU a quiet machine would."""
    for pid in pids:
        try:
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
        except OSError as exc:
            raise SystemExit(f"--autogroup-nice {nice}: cannot set /proc/{pid}/autogroup ({exc}; needs autogroup "
                             "scheduling, and root for a negative value)") from None


def stats(rows: np.ndarray, deadline_ms: float) -> dict:
    if len(rows) == 0:
        return {"steps": 0}
    ms = rows[:, 1] / 1e6
    p50, p99 = p50_p99(ms.tolist())  # nearest rank (bridge.common.percentiles)
    errors = rows[rows[:, 3] >= KIND["error"]]
    return {"steps": int(len(rows)), "p50_ms": float(p50), "p99_ms": float(p99),
            "max_ms": float(ms.max()), "past_deadline": int((ms > deadline_ms).sum()),
            "errors": int(len(errors)),
            "error_codes": {int(c): int((errors[:, COLUMNS.index("error_code")] == c).sum())
                            for c in np.unique(errors[:, COLUMNS.index("error_code")])},
            "late_actions_by_hop": late_hops(rows, deadline_ms)}


def late_hops(rows: np.ndarray, deadline_ms: float) -> dict:
    """For the actions answered past the deadline: how many had each hop as their longest, and each hop's
    median ms (a late step's time is spent in the sim's process, the gateway's loop, or Triton)."""
    late = rows[(rows[:, 1] / 1e6 > deadline_ms) & (rows[:, 3] == KIND["action"])]
    if len(late) == 0:
        return {}
    col = COLUMNS.index
    hops = np.stack([(late[:, col(b)] - late[:, col(a)]) / 1e6 for a, b in HOPS.values()], axis=1)
    longest = hops.argmax(axis=1)
    return {name: {"longest_in": int((longest == i).sum()), "median_ms": float(np.median(hops[:, i])),
                   "max_ms": float(hops[:, i].max())} for i, name in enumerate(HOPS)}


def main(argv: list[str] | None = None) -> dict | None:
    p = parser(__file__, __doc__)
    p.add_argument("--sessions", type=int, default=4, help="Hopper-v5 sim sessions stepping throughout")
    p.add_argument("--period-ms", type=float, default=20.0, help="each session's control period")
    p.add_argument("--deadline-ms", type=float, default=50.0, help="a step answered later than this is missed")
    p.add_argument("--small-swaps", type=int, default=5)
    p.add_argument("--big-swaps", type=int, default=3)
    p.add_argument("--huge-swaps", type=int, default=0, help="~1 GB MLP versions, streamed from a file on disk")
    p.add_argument("--onnx-swaps", type=int, default=5, help="the small MLP imported as ONNX (onnxruntime in Triton)")
    p.add_argument("--gap-s", type=float, default=1.0, help="pause between swaps")
    p.add_argument("--quiet-s", type=float, default=6.0, help="stepping without swaps, before and after")
    p.add_argument("--stub-load-nice", type=int, default=None,
                   help=f"how many niceness steps below its stub a new version loads ({LOAD_NICE_ENV}, default 19; "
                        "0: at the stub's own priority, as before)")
    p.add_argument("--autogroup-nice", type=int, default=None,
                   help="niceness of this run's autogroups (sims, gateway, Triton, publisher): -20 shields the "
                        "run from other work on a shared machine (root)")
    p.add_argument("--worker", nargs=3, metavar=("GATEWAY", "SESSIONS", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        asyncio.run(_worker(a.worker[0], int(a.worker[1]), a.period_ms, Path(a.worker[2])))
        return None
    torch.set_num_threads(1)
    load_at_start = os.getloadavg()[0]
    if a.stub_load_nice is not None:  # Triton's stubs inherit it (inference_server.triton_env copies os.environ)
        os.environ[LOAD_NICE_ENV] = str(a.stub_load_nice)
    with tempfile.TemporaryDirectory(prefix="tether-hot-swap-") as tmp:  # GBs with --huge-swaps: never left
        return _run(a, Path(tmp), load_at_start)


def _run(a: argparse.Namespace, run_dir: Path, load_at_start: float) -> dict:
    obs_spec, act_spec = specs("Hopper-v5")
    small = MLPPolicy(obs_spec[0], act_spec[0], seed=0).eval()
    big = MLPPolicy(obs_spec[0], act_spec[0], hidden=BIG_HIDDEN, seed=0).eval()
    repo = ModelRepository(run_dir / "models")
    repo.write_version(SMALL, 1, small, obs_spec, act_spec)
    repo.write_version(ORT, 1, small, obs_spec, act_spec, serve="onnx")  # trainer versions served by onnxruntime
    repo.write_version(BIG, 1, big, obs_spec, act_spec)
    repo.write_artifact(ONNX, 1, "onnx", onnx_file(small, obs_spec[0]), obs_spec, act_spec)
    huge = MLPPolicy(obs_spec[0], act_spec[0], hidden=HUGE_HIDDEN, seed=0).eval() if a.huge_swaps else None
    if huge is not None:
        repo.write_version(HUGE, 1, huge, obs_spec, act_spec)
    big_mb = sum(t.numel() * t.element_size() for t in big.state_dict().values()) / 1e6
    print(f"run dir {run_dir}; big model {sum(p.numel() for p in big.parameters()) / 1e6:.1f} M parameters, "
          f"{big_mb:.0f} MB", flush=True)
    swaps: list[dict] = []
    models = [SMALL, ORT, BIG, ONNX] + ([HUGE] if huge is not None else [])
    with TritonServer(repo.root, models=models, log_path=run_dir / "triton.log") as triton, \
            GatewayProcess(triton_url=triton.grpc_url, policy=SMALL, log_path=run_dir / "gateway.log",
                           extra_args=("--model-repository", str(repo.root), "--switch", "step",
                                       "--deadline-ms", str(int(a.deadline_ms)))) as gateway:
        gw = gateway.address
        out = run_dir / "steps.npy"
        worker = subprocess.Popen([sys.executable, __file__, "--worker", gw, str(a.sessions), str(out),
                                   "--period-ms", str(a.period_ms)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])),
                                  start_new_session=True)  # the sims are not the publisher's: their own session
        if a.autogroup_nice is not None:
            autogroup_nice([os.getpid(), worker.pid, gateway.pid, triton.pid], a.autogroup_nice)
        try:
            if worker.stdout.readline().strip() != "ready":
                raise RuntimeError("the sim worker did not start; see its stderr")
            policies = PoliciesClient(gw, timeout_s=600)
            time.sleep(a.quiet_s)
            for kind, name, module, count in (("small", SMALL, small, a.small_swaps),
                                              ("small_ort", ORT, small, a.small_swaps), ("big", BIG, big, a.big_swaps)):
                for i in range(count):
                    with RssPeak(gateway.pid) as rss:
                        swap = publish(policies, name, perturbed(module, i), obs_spec[0], parent=1 + i)
                    swaps.append({"model": kind, **swap, "gateway_rss_growth_mib": rss.growth_mib})
                    print(f"  {kind} v{swap['version']}: publish -> live {swap['publish_to_live_s']:.2f} s "
                          f"(server {swap['server_s']:.2f} s), {swap['transfer_mb_s']:.0f} MB/s", flush=True)
                    time.sleep(a.gap_s)
            with PoliciesClient(gw, timeout_s=900) as client:
                for i in range(a.huge_swaps):
                    with RssPeak(gateway.pid) as rss:
                        swap = publish_from_file(client, perturbed(huge, i), run_dir / "huge.safetensors",
                                                 obs_spec[0], parent=1 + i)
                    swaps.append({"model": "huge", **swap, "gateway_rss_growth_mib": rss.growth_mib})
                    print(f"  huge v{swap['version']}: publish -> live {swap['publish_to_live_s']:.2f} s (server "
                          f"{swap['server_s']:.2f} s), gateway RSS +{rss.growth_mib:.0f} MiB", flush=True)
                    time.sleep(a.gap_s)
            for i in range(a.onnx_swaps):
                try:
                    swap = publish_import(policies, ONNX, onnx_file(perturbed(small, 100 + i), obs_spec[0]), obs_spec,
                                          act_spec)
                except grpc.RpcError as exc:
                    print(f"  onnx import refused: {exc.details()}", flush=True)
                    break
                swaps.append({"model": "onnx", **swap, "gateway_rss_growth_mib": 0.0})
                print(f"  onnx v{swap['version']}: publish -> live {swap['publish_to_live_s']:.2f} s", flush=True)
                time.sleep(a.gap_s)
            time.sleep(a.quiet_s)
            policies.close()
            gateway_hwm_mib = _rss_kib(gateway.pid, "VmHWM") / 1024
        finally:
            worker.stdin.write("stop\n")
            worker.stdin.close()
            worker.wait(60)
        rows = np.load(out)
        version = triton.version
    late = rows[(rows[:, 1] / 1e6 > a.deadline_ms) | (rows[:, 3] >= KIND["error"])]
    for s in swaps:  # when, from the swap's first byte, its late steps and errors were sent
        mine = late[(late[:, 0] >= s["start_ns"]) & (late[:, 0] <= s["end_ns"] + int(LINGER_S * 1e9))]
        s["late_at_s"] = [round((t - s["start_ns"]) / 1e9, 3) for t in mine[mine[:, 3] < KIND["error"], 0]]
        s["errors_at_s"] = [round((t - s["start_ns"]) / 1e9, 3) for t in mine[mine[:, 3] >= KIND["error"], 0]]
    during = _within(rows, swaps)
    first_acted = {}
    for s in swaps:
        if s["model"] == "small":
            acted = rows[(rows[:, 2] == s["version"]) & (rows[:, 3] == 0)]
            first_acted[s["version"]] = (float((acted[:, 0].min() - s["start_ns"]) / 1e9) if len(acted) else None)
    result = {
        "machine": machine(cpus=os.cpu_count(), load_avg_1m=os.getloadavg()[0], load_avg_1m_at_start=load_at_start,
                           stub_load_nice=os.environ.get(LOAD_NICE_ENV, "default"),
                           niceness=os.getpriority(os.PRIO_PROCESS, 0), autogroup_nice=a.autogroup_nice),
        "triton_version": version,
        "config": {k: getattr(a, k) for k in ("sessions", "period_ms", "deadline_ms", "small_swaps", "big_swaps",
                                              "huge_swaps", "onnx_swaps", "gap_s", "quiet_s")},
        "big_model_mb": big_mb,
        "gateway_peak_rss_mib": gateway_hwm_mib,
        "swaps": swaps,
        **{kind: _summary([s for s in swaps if s["model"] == kind]) for kind in KINDS},
        "first_action_with_new_version_s": first_acted,
        "steps_without_swaps": stats(rows[~during], a.deadline_ms),
        "steps_during_swaps": stats(rows[during], a.deadline_ms),
        "steps_during_swaps_of": {kind: stats(rows[_within(rows, [s for s in swaps if s["model"] == kind])],
                                              a.deadline_ms) for kind in KINDS},
        "receive_costs_big": receive_costs(big),
    }
    return report(a.json, result, print_table)


def _within(rows: np.ndarray, swaps: list[dict]) -> np.ndarray:
    """Rows (steps) sent while one of `swaps` was under way (or just after: LINGER_S)."""
    mask = np.zeros(len(rows), bool)
    for s in swaps:
        mask |= (rows[:, 0] >= s["start_ns"]) & (rows[:, 0] <= s["end_ns"] + int(LINGER_S * 1e9))
    return mask


def _summary(swaps: list[dict]) -> dict:
    if not swaps:
        return {}
    keys = ("publish_to_live_s", "server_s", "transfer_s", "transfer_mb_s", "serialise_s", "sha256_s",
            "gateway_rss_growth_mib")
    return {k: {"median": float(np.median([s[k] for s in swaps])), "max": float(np.max([s[k] for s in swaps]))}
            for k in keys}


def print_table(r: dict) -> None:
    print(f"\n{'model':<10}{'MB':>8}{'publish->live s':>17}{'server s':>10}{'transfer MB/s':>15}"
          f"{'missed':>8}{'errors':>8}{'longest ms':>12}{'gw RSS +MiB':>13}")
    for kind in KINDS:
        rows = [s for s in r["swaps"] if s["model"] == kind]
        if rows:
            during = r["steps_during_swaps_of"][kind]
            print(f"{kind:<10}{rows[0]['bytes'] / 1e6:>8.2f}{r[kind]['publish_to_live_s']['median']:>17.2f}"
                  f"{r[kind]['server_s']['median']:>10.2f}{r[kind]['transfer_mb_s']['median']:>15.0f}"
                  f"{during.get('past_deadline', 0):>8}{during.get('errors', 0):>8}{during.get('max_ms', 0):>12.0f}"
                  f"{r[kind]['gateway_rss_growth_mib']['max']:>13.0f}")
    print(f"\n{'control steps':<16}{'steps':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'missed':>8}{'errors':>8}")
    phases = {key.removeprefix("steps_"): r[key] for key in ("steps_without_swaps", "steps_during_swaps")}
    phases.update({f"  {kind} swaps": r["steps_during_swaps_of"][kind] for kind in r["steps_during_swaps_of"]})
    for name, s in phases.items():
        if s["steps"]:
            print(f"{name:<16}{s['steps']:>8}{s['p50_ms']:>9.2f}{s['p99_ms']:>9.2f}"
                  f"{s['max_ms']:>9.2f}{s['past_deadline']:>8}{s['errors']:>8}")
    print("\nlate actions, the hop each spent longest in (" + ", ".join(HOPS) + "):")
    for name, s in phases.items():
        if s.get("late_actions_by_hop"):
            print(f"{name:<16}" + "  ".join(f"{hop} {v['longest_in']} (median {v['median_ms']:.0f} ms)"
                                            for hop, v in s["late_actions_by_hop"].items() if v["longest_in"]))
    costs = r["receive_costs_big"]
    print(f"\non receipt of {costs['mb']:.0f} MB: " + ", ".join(f"{k} {v['cpu_s']:.2f} CPU-s" for k, v in
                                                          costs["steps"].items()))
    print(f"gateway peak RSS (VmHWM) over the run: {r['gateway_peak_rss_mib']:.0f} MiB")
    print(f"(missed: answered after {r['config']['deadline_ms']:g} ms; load average {r['machine']['load_avg_1m']:.1f} "
          f"on {r['machine']['cpus']} CPUs)")


if __name__ == "__main__":
    main()
