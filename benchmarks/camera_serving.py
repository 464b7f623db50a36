"""Camera robots through the gateway, side by side in one run: N robots x 2 cameras at 30 Hz, chunks of H = 16.

    python benchmarks/camera_serving.py [--robots 8,32,64,96,128 --seconds 8 --rounds 3 --per-round 100 --json PATH]

Measured, on loopback (Triton and the gateways are subprocesses, the robots run here on one event loop):
- bytes per observation, raw pixels vs JPEG (quality 90), at the policy's resolution (two 224x224 RGB
  frames rendered by MuJoCo from `sim.camera_reach`), and JPEG encode/decode p50/p99 per frame (simplejpeg);
- the round trip of one camera step through the gateway (JPEG in, decoded at the gateway) against a raw
  `tritonclient` call carrying the decoded uint8 tensors to the same model, blocks alternated: the
  gateway's own cost beyond the Triton call;
- starvation: each robot runs the edge's chunk loop (`bridge.client.chunks.ChunkExecutor`: an action per
  tick, each chunk aligned to the tick it was asked before, the seam blended over H/4 ticks), asks for the
  next chunk when H/2 actions remain, with `Observation.deadline_ns` = when its queue runs dry; a tick with
  no action once the first chunk arrived is a starved tick. For each N, a gateway serving earliest deadline
  first and one serving in arrival order, alternated; the delay d (ticks between sending and the chunk's
  arrival) is recorded;
- the same robots over a link of 20 Mbit/s and 50 ms each way (tests/support/link.py, a token-bucket proxy on
  loopback), JPEG vs raw pixels.
Prints a table and writes JSON (default benchmarks/results/camera_serving.json) and an SVG of starvation vs N.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as triton_grpc
from bench import machine, parser, report, say
from svgplot import line_plot

from bridge.client import Session
from bridge.client.chunks import ChunkConfig, ChunkExecutor
from bridge.common.percentiles import p50_p99
from inference_server import ModelRepository, TritonServer
from protos import bridge_pb2
from protos.codec import JPEG, RAW, Spec, decode, encode, encode_image
from sim.camera_reach import CameraReach, expert_action
from sim.cameras import with_cameras

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python benchmarks/camera_serving.py`: the shaped link lives in tests/support
    sys.path.insert(0, str(ROOT))
from tests.support.link import Link, Shape  # noqa: E402
from tether.topology import gateway_process  # noqa: E402
from trainer.camera_policy import CameraChunkPolicy, chunk_spec  # noqa: E402

MODEL, CAMERAS, SIZE, QUALITY = "camera_chunk", ("top", "front"), 224, 90


def ms(samples_ns) -> dict:
    p50, p99 = p50_p99(list(samples_ns))
    return {"p50": p50 / 1e6, "p99": p99 / 1e6, "n": len(samples_ns)}


def rendered_frames(count: int) -> tuple[list[dict[str, np.ndarray]], tuple[Spec, ...], tuple[Spec, ...]]:
    """`count` observations of CameraReach (the expert acting), each with its two rendered cameras."""
    env = with_cameras(CameraReach(seed=0), CAMERAS, size=SIZE)
    try:
        frames, ts = [], env.reset()
        while len(frames) < count:
            frames.append({k: np.array(v) for k, v in ts.observation.items()})
            ts = env.reset() if ts.last() else env.step(expert_action(ts.observation))
        return frames, env.observation_spec(), env.action_spec()
    finally:
        env.close()


def codec_figures(frames: list[dict[str, np.ndarray]]) -> dict:
    raw = sum(frames[0][c].nbytes for c in CAMERAS)
    encoded, enc, dec = [], [], []
    for frame in frames:
        size = 0
        for c in CAMERAS:
            t0 = time.perf_counter_ns()
            tensor = encode_image(c, frame[c], quality=QUALITY)
            t1 = time.perf_counter_ns()
            decode(tensor)
            enc.append(t1 - t0)
            dec.append(time.perf_counter_ns() - t1)
            size += len(tensor.data)
        encoded.append(size)
    jpeg = float(np.median(encoded))
    return {"raw_bytes_per_observation": raw, "jpeg_bytes_per_observation_p50": jpeg, "bytes_ratio": raw / jpeg,
            "encode_ms": ms(enc), "decode_ms": ms(dec)}


def observation_tensors(frame: dict[str, np.ndarray], *, jpeg: bool) -> list:
    return [encode_image(k, v, quality=QUALITY) if jpeg and k in CAMERAS else encode(k, v) for k, v in frame.items()]


def hello(name: str, obs: tuple[Spec, ...], act: tuple[Spec, ...], *, jpeg: bool) -> bridge_pb2.Hello:
    specs = [s.to_proto() for s in obs]
    for s in specs:
        s.encoding = JPEG if jpeg and s.name in CAMERAS else RAW
    return bridge_pb2.Hello(session_id=name, source="bench:camera", observation_spec=specs,
                            action_spec=[s.to_proto() for s in act])


# -- the gateway's cost beyond Triton -----------------------------------------------------------------------

def raw_round_trips(url: str, frames: list[dict[str, np.ndarray]], n: int) -> list[int]:
    client = triton_grpc.InferenceServerClient(url)
    samples = []
    for i in range(n):
        frame = frames[i % len(frames)]
        t0 = time.perf_counter_ns()
        inputs = []
        for name, value in frame.items():
            tensor = triton_grpc.InferInput(name, [1, *value.shape], "UINT8" if value.dtype == np.uint8 else "FP32")
            tensor.set_data_from_numpy(value[None])
            inputs.append(tensor)
        client.infer(MODEL, inputs, model_version="1").as_numpy("action")
        samples.append(time.perf_counter_ns() - t0)
    client.close()
    return samples


async def gateway_round_trips(address: str, payloads: list[list], n: int, name: str, obs, act, *,
                              jpeg: bool) -> list[int]:
    """Round trips of camera steps whose tensors are ready (a camera driver's JPEG bytes: no encoding here)."""
    samples = []
    async with Session(address, hello(name, obs, act, jpeg=jpeg)) as s:
        for step in range(n):
            t0 = time.perf_counter_ns()
            reply = await s.step(bridge_pb2.Observation(step=step, step_type=bridge_pb2.FIRST if step == 0
                                                        else bridge_pb2.MID, tensors=payloads[step % len(payloads)]))
            if reply.WhichOneof("kind") != "action":
                raise RuntimeError(f"{name} step {step}: {reply}")
            samples.append(time.perf_counter_ns() - t0)
    return samples


# -- robots executing chunks in real time ---------------------------------------------------------------------

async def robot(address: str, name: str, payloads: list[list], obs, act, *, hz: float, horizon: int,
                seconds: float, jpeg: bool) -> dict:
    """One robot's control loop on `ChunkExecutor` (the edge's and `tether sim`'s): an action per tick, the next
    chunk asked for at H/2 left with the deadline of its queue running dry."""
    period_ns = int(1e9 / hz)
    executor = ChunkExecutor(ChunkConfig(horizon=horizon), size=act[0].shape[-1])  # the chunk spec is (H, A)
    ticks, trips, inflight, step = int(seconds * hz), [], None, 0
    async with Session(address, hello(name, obs, act, jpeg=jpeg), reply_timeout_s=30) as s:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for tick in range(ticks):
            if (wait := t0 + tick * period_ns / 1e9 - loop.time()) > 0:
                await asyncio.sleep(wait)
            if inflight is not None and inflight.done():
                reply, inflight = inflight.result(), None
                if reply.WhichOneof("kind") == "action":
                    executor.arrive(decode(reply.action.tensors[0]), now=tick,
                                    policy_version=reply.action.policy_version, at_ns=s.received_ns)
                    trips.append(s.received_ns - reply.action.timing.t_sent_ns)
                else:
                    executor.lost()
            if inflight is None and executor.due(tick):
                request = executor.request(tick, step=step)
                observation = bridge_pb2.Observation(step=step, step_type=bridge_pb2.FIRST if step == 0 else
                                                     bridge_pb2.MID, tensors=payloads[step % len(payloads)])
                executor.fill(observation, request, deadline_ns=executor.deadline_ns(tick, now_ns=s.clock(),
                                                                                     period_ns=period_ns))
                inflight, step = loop.create_task(s.step(observation)), step + 1
            executor.act(tick, at_ns=s.clock())
        if inflight is not None:
            await inflight
    return {"ticks": ticks, "starved": executor.idle, "delays": list(executor.delay_counts.elements()),
            "trips": trips}


async def fleet(address: str, robots: int, payloads, obs, act, *, hz: float, horizon: int, seconds: float,
                jpeg: bool, tag: str) -> dict:
    runs = await asyncio.gather(*(robot(address, f"{tag}-{i}", payloads, obs, act, hz=hz, horizon=horizon,
                                        seconds=seconds, jpeg=jpeg) for i in range(robots)))
    ticks, starved = sum(r["ticks"] for r in runs), sum(r["starved"] for r in runs)
    delays = [d for r in runs for d in r["delays"]]
    return {"robots": robots, "ticks": ticks, "starved": starved, "starved_pct": 100.0 * starved / max(ticks, 1),
            "chunks": len(delays), "delay_ticks_p50": float(np.median(delays)) if delays else None,
            "delay_ticks_max": int(max(delays)) if delays else None,
            "round_trip_ms": ms([t for r in runs for t in r["trips"]])}


def main(argv: list[str] | None = None) -> dict:
    p = parser(__file__, __doc__, rounds=(3, "alternating raw/gateway blocks"), per_round=(100, "steps per block"))
    p.add_argument("--robots", default="8,32,64,96,128", help="fleet sizes for the starvation comparison")
    p.add_argument("--seconds", type=float, default=8.0, help="per fleet run")
    p.add_argument("--hz", type=float, default=30.0, help="the robots' control rate")
    p.add_argument("--horizon", type=int, default=16, help="actions per chunk (H)")
    p.add_argument("--max-batch", type=int, default=8, help="the gateways' largest Triton batch")
    p.add_argument("--link-robots", type=int, default=2, help="robots over the 20 Mbit/s, 50 ms link (0: skip)")
    a = p.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="tether-camera-bench-"))
    say("rendering frames")
    frames, obs, act = rendered_frames(30)
    codec = codec_figures(frames)
    say(f"raw {codec['raw_bytes_per_observation']} B vs JPEG {codec['jpeg_bytes_per_observation_p50']:.0f} B "
        f"per observation ({codec['bytes_ratio']:.1f}x)")
    state = next(s for s in obs if s.name not in CAMERAS)
    policy = CameraChunkPolicy(state, [s for s in obs if s.name in CAMERAS], act[0], horizon=a.horizon, seed=0)
    chunk_act = (chunk_spec(act[0], a.horizon),)
    repo = ModelRepository(run_dir / "models")
    repo.write_version(MODEL, 1, policy, policy.inputs, policy.outputs)
    jpeg_payloads = [observation_tensors(f, jpeg=True) for f in frames]
    raw_payloads = [observation_tensors(f, jpeg=False) for f in frames]
    load_before = os.getloadavg()
    common = ("--max-batch", str(a.max_batch), "--deadline-ms", "5000")
    with TritonServer(repo.root, models=[MODEL], log_path=run_dir / "triton.log") as triton, \
            gateway_process(triton_url=triton.grpc_url, policy=MODEL, log_path=run_dir / "gw_edf.log",
                            extra_args=(*common, "--batch-order", "deadline")) as edf, \
            gateway_process(triton_url=triton.grpc_url, policy=MODEL, log_path=run_dir / "gw_fifo.log",
                            extra_args=(*common, "--batch-order", "arrival")) as fifo:
        paths = {"raw_tritonclient": lambda n, r: raw_round_trips(triton.grpc_url, frames, n),
                 "gateway_jpeg": lambda n, r: asyncio.run(gateway_round_trips(
                     edf, jpeg_payloads, n, f"lat-jpeg-{r}", obs, chunk_act, jpeg=True)),
                 "gateway_raw": lambda n, r: asyncio.run(gateway_round_trips(
                     edf, raw_payloads, n, f"lat-raw-{r}", obs, chunk_act, jpeg=False))}
        for measure in paths.values():
            measure(20, "warmup")
        samples: dict[str, list[int]] = {k: [] for k in paths}
        for r in range(a.rounds):
            for name in (list(paths) if r % 2 == 0 else list(paths)[::-1]):
                samples[name] += paths[name](a.per_round, r)
            say(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{k} p50 {np.median(v) / 1e6:.2f} ms"
                                                        for k, v in samples.items()))
        latency = {k: ms(v) for k, v in samples.items()}
        starvation = []
        for n in (int(x) for x in a.robots.split(",") if x.strip()):
            level = {}
            for order, address in (("arrival", fifo), ("deadline", edf)):
                level[order] = asyncio.run(fleet(address, n, jpeg_payloads, obs, chunk_act, hz=a.hz,
                                                 horizon=a.horizon, seconds=a.seconds, jpeg=True,
                                                 tag=f"n{n}-{order}"))
            starvation.append({"robots": n, **level})
            say(f"{n} robots: starved {level['arrival']['starved_pct']:.2f}% arrival order, "
                f"{level['deadline']['starved_pct']:.2f}% EDF; d p50 {level['deadline']['delay_ticks_p50']}")
        link = {}
        if a.link_robots:
            shape = Shape(delay_s=0.050, rate_bps=20e6)
            for kind, payloads, jpeg in (("jpeg", jpeg_payloads, True), ("raw", raw_payloads, False)):
                with Link(edf, up=shape, down=shape) as wire:
                    link[kind] = asyncio.run(fleet(wire.address, a.link_robots, payloads, obs, chunk_act, hz=a.hz,
                                                   horizon=a.horizon, seconds=a.seconds, jpeg=jpeg,
                                                   tag=f"link-{kind}"))
                    link[kind]["bytes_up_per_s"] = wire.bytes_up / a.seconds
                say(f"20 Mbit/s link, {a.link_robots} robots, {kind}: starved {link[kind]['starved_pct']:.2f}%, "
                    f"round trip p50 {link[kind]['round_trip_ms']['p50']:.1f} ms")
    result = {
        "machine": machine(cpus=os.cpu_count(), load_average_before=[round(x, 2) for x in load_before],
                           load_average_after=[round(x, 2) for x in os.getloadavg()]),
        "config": {"cameras": list(CAMERAS), "size": SIZE, "quality": QUALITY, "hz": a.hz, "horizon": a.horizon,
                   "max_batch": a.max_batch, "seconds": a.seconds, "ask_at_remaining": a.horizon // 2},
        "codec": codec, "latency_ms": latency,
        "gateway_cost_p50_ms": {k: latency[k]["p50"] - latency["raw_tritonclient"]["p50"]
                                for k in latency if k != "raw_tritonclient"},
        "starvation": starvation, "link_20mbit_50ms": link,
    }
    report(a.json, result, print_table)
    if starvation:
        plot = a.json.with_suffix(".svg")
        plot.write_text(line_plot({order: ([lv["robots"] for lv in starvation],
                                           [lv[order]["starved_pct"] for lv in starvation])
                                   for order in ("arrival", "deadline")},
                                  title="Ticks without an action vs robots (2 cameras, 30 Hz, H = 16)",
                                  x_label="robots", y_label="% ticks starved"))
        print(f"wrote {plot}")
    return result


def print_table(r: dict) -> None:
    c = r["codec"]
    print(f"\nper observation: raw {c['raw_bytes_per_observation']} B, JPEG q{r['config']['quality']} "
          f"{c['jpeg_bytes_per_observation_p50']:.0f} B ({c['bytes_ratio']:.1f}x fewer)")
    print(f"per frame: encode p50/p99 {c['encode_ms']['p50']:.3f}/{c['encode_ms']['p99']:.3f} ms, "
          f"decode {c['decode_ms']['p50']:.3f}/{c['decode_ms']['p99']:.3f} ms")
    print(f"\n{'path':<20}{'p50 ms':>10}{'p99 ms':>10}{'beyond Triton p50':>20}")
    for name, f in r["latency_ms"].items():
        extra = f"{r['gateway_cost_p50_ms'][name]:>20.3f}" if name in r["gateway_cost_p50_ms"] else ""
        print(f"{name:<20}{f['p50']:>10.3f}{f['p99']:>10.3f}{extra}")
    if r["starvation"]:
        print(f"\n{'robots':<8}{'arrival %':>11}{'EDF %':>9}{'d p50':>7}{'d max':>7}{'rtt p50':>9}{'rtt p99':>9}")
        for lv in r["starvation"]:
            e = lv["deadline"]
            print(f"{lv['robots']:<8}{lv['arrival']['starved_pct']:>11.2f}{e['starved_pct']:>9.2f}"
                  f"{e['delay_ticks_p50']!s:>7}{e['delay_ticks_max']!s:>7}{e['round_trip_ms']['p50']:>9.1f}"
                  f"{e['round_trip_ms']['p99']:>9.1f}")
    for kind, lv in r["link_20mbit_50ms"].items():
        print(f"link 20 Mbit/s 50 ms, {lv['robots']} robots, {kind}: starved {lv['starved_pct']:.2f}%, round trip "
              f"p50/p99 {lv['round_trip_ms']['p50']:.1f}/{lv['round_trip_ms']['p99']:.1f} ms, "
              f"{lv['bytes_up_per_s'] * 8 / 1e6:.2f} Mbit/s up")
    m = r["machine"]
    print(f"load average before {m['load_average_before']}, after {m['load_average_after']} ({m['cpus']} cpus)\n")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
