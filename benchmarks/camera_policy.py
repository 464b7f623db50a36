"""Camera robots' costs: MuJoCo's offscreen render per frame, the camera chunk policy's latency (torch, Triton).

    python benchmarks/camera_policy.py [--per-round 200 --json PATH]

1. Render: CameraReach's `top` and `front` cameras at 224x224 (EGL through Mesa, on the CPU), `--per-round` steps
   each; wall ms per frame (p50/p99) and the JPEG encode of a frame (protos.codec.encode_image, quality 90).
2. Policy: trainer.camera_policy.CameraChunkPolicy (two 224x224 cameras + the 4-float state -> H x 2), H = 16 and
   50, batch 1: the torch module in this process (one thread), and a real tritonserver serving it as TorchScript
   (torch in the python backend) and as ONNX (onnxruntime), called with `tritonclient` gRPC; p50/p99 ms.
Prints a table and writes JSON (default benchmarks/results/camera_policy.json).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
from bench import machine, parser, report, say


def percentiles(samples_ns: list[int]) -> dict:
    ms = np.asarray(samples_ns) / 1e6
    return {"p50": round(float(np.percentile(ms, 50)), 3), "p99": round(float(np.percentile(ms, 99)), 3)}


def render(steps: int) -> dict:
    from protos.codec import encode_image
    from sim.camera_reach import CameraReach, expert_action
    from sim.cameras import with_cameras

    env = with_cameras(CameraReach(seed=0), ["top", "front"], size=224)
    frame_ns, jpeg_ns, sizes = [], [], []
    ts = env.reset()
    for _ in range(steps):
        ts = env.reset() if ts.last() else env.step(expert_action(ts.observation))
        start = time.perf_counter_ns()
        images = env.renderer.render(env._data)
        frame_ns.append((time.perf_counter_ns() - start) // 2)
        start = time.perf_counter_ns()
        sizes.append(len(encode_image("top", images["top"], quality=90).data))
        jpeg_ns.append(time.perf_counter_ns() - start)
    env.close()
    return {"render_ms_per_frame": percentiles(frame_ns), "jpeg_encode_ms": percentiles(jpeg_ns),
            "jpeg_bytes": int(np.mean(sizes)), "raw_bytes": 224 * 224 * 3, "mujoco_gl": os.environ.get("MUJOCO_GL")}


def policy_latency(calls: int) -> dict:
    import torch
    import tritonclient.grpc as triton_grpc

    from inference_server import ModelRepository, TritonServer
    from protos.codec import Spec
    from trainer.camera_policy import CameraChunkPolicy

    torch.set_num_threads(1)
    state = Spec("observation", np.float32, (4,))
    cameras = [Spec(name, np.uint8, (224, 224, 3)) for name in ("top", "front")]
    action = Spec("action", np.float32, (2,), low=(-1.0,), high=(1.0,))
    rng = np.random.default_rng(0)
    feed = {"observation": rng.uniform(-0.2, 0.2, (1, 4)).astype(np.float32),
            **{c.name: rng.integers(0, 256, (1, 224, 224, 3), dtype=np.uint8) for c in cameras}}
    repo, results, models = ModelRepository(Path(tempfile.mkdtemp(prefix="camera-bench-"))), {}, []
    for horizon in (16, 50):
        policy = CameraChunkPolicy(state, cameras, action, horizon=horizon, seed=0).eval()
        samples = []
        with torch.inference_mode():
            for _ in range(calls + 10):
                start = time.perf_counter_ns()
                policy(*(torch.from_numpy(feed[s.name]) for s in policy.inputs))
                samples.append(time.perf_counter_ns() - start)
        results[f"torch_h{horizon}"] = percentiles(samples[10:])
        for serve in ("torchscript", "onnx"):
            name = f"camera_{serve}_h{horizon}"
            repo.write_version(name, 1, policy, policy.inputs, policy.outputs, serve=serve)
            models.append(name)
    with TritonServer(repo.root, models=models) as server:
        client = triton_grpc.InferenceServerClient(server.grpc_url)
        inputs = []
        for name, array in feed.items():
            tensor = triton_grpc.InferInput(name, list(array.shape), "UINT8" if array.dtype == np.uint8 else "FP32")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        for name in models:
            samples = []
            for _ in range(calls + 10):
                start = time.perf_counter_ns()
                client.infer(name, inputs, model_version="1")
                samples.append(time.perf_counter_ns() - start)
            key = f"triton_{name.removeprefix('camera_')}"
            results[key] = percentiles(samples[10:])
            say(f"{key}: {results[key]}")
        triton_version = server.version
    return {"batch": 1, "triton_version": triton_version, **results}


def print_table(result: dict) -> None:
    r = result["render"]
    rows = [("render per frame (224x224)", f"{r['render_ms_per_frame']['p50']} / {r['render_ms_per_frame']['p99']} ms"),
            ("JPEG encode per frame (q90)", f"{r['jpeg_encode_ms']['p50']} / {r['jpeg_encode_ms']['p99']} ms, "
                                            f"{r['jpeg_bytes']} of {r['raw_bytes']} bytes")]
    rows += [(f"policy {key} (batch 1)", f"{value['p50']} / {value['p99']} ms")
             for key, value in result["policy"].items() if isinstance(value, dict)]
    width = max(len(k) for k, _ in rows)
    print(f"{'':<{width}}  p50 / p99")
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))


def main() -> dict:
    a = parser(__file__, __doc__, per_round=(200, "frames rendered, and policy calls per model")).parse_args()
    say("rendering")
    rendered = render(a.per_round)
    say("policy latency")
    result = {"machine": machine(cpus=os.cpu_count(), load=os.getloadavg()), "render": rendered,
              "policy": policy_latency(a.per_round)}
    return report(a.json, result, print_table)


if __name__ == "__main__":
    main()
