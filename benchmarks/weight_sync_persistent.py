"""What a persistent model instance gives weight sync, measured before it was built (now built as
inference_server/versions_model.py, `tether gateway --persistent-versions`; through the gateway:
benchmarks/weight_sync.py, mode `persistent`). New weights -> the first answer at exactly that version, two ways
in one Triton, interleaved (same machine, same load):

- `stub`: what the learning loop does, a version folder (written by `ModelRepository.write_weights`: ONNX
  re-weighted), Triton `load_model` (a new python-backend stub: interpreter, numpy, onnxruntime), then the
  first request at that version;
- `persistent`: one python-backend model that stays loaded and, on a request carrying the parameter
  `load`, opens that version's policy.onnx in an onnxruntime session of its own (no new process), then
  answers requests carrying `version` with that session.

    python benchmarks/weight_sync_persistent.py [--versions 12 --json benchmarks/results/weight_sync_persistent.json]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aio
from bench import machine, parser, report, specs

from inference_server import ModelRepository, PolicyClient, TritonServer
from trainer.policy import GaussianPolicy

ENV = "InvertedPendulum-v5"
ENGINE = '''import json
import numpy as np


class TritonPythonModel:
    def initialize(self, args):
        import asyncio  # noqa: F401  (the stub imports it at its first request anyway)
        import onnxruntime as ort
        import triton_python_backend_utils as pb
        self._pb, self._ort, self._sessions = pb, ort, {}
        self._options = ort.SessionOptions()
        self._options.intra_op_num_threads = self._options.inter_op_num_threads = 1

    def execute(self, requests):
        pb, responses = self._pb, []
        for request in requests:
            params = json.loads(request.parameters() or "{}")
            batch = pb.get_input_tensor_by_name(request, "observation").as_numpy()
            if "load" in params:  # new weights: a session of this process, no new stub
                session = self._ort.InferenceSession(params["load"], sess_options=self._options,
                                                     providers=["CPUExecutionProvider"])
                session.run(["action_mean"], {"observation": np.zeros((1, batch.shape[1]), np.float32)})
                self._sessions[int(params["version"])] = session
            (mean,) = self._sessions[int(params["version"])].run(["action_mean"], {"observation": batch})
            responses.append(pb.InferenceResponse(output_tensors=[pb.Tensor("action_mean", mean)]))
        return responses
'''


def engine(root: Path, obs_dim: int) -> None:
    (root / "engine" / "1").mkdir(parents=True)
    (root / "engine" / "1" / "model.py").write_text(ENGINE)
    (root / "engine" / "config.pbtxt").write_text(
        'name: "engine"\nbackend: "python"\nmax_batch_size: 0\n'
        f'input [ {{ name: "observation" data_type: TYPE_FP32 dims: [ -1, {obs_dim} ] }} ]\n'
        'output [ { name: "action_mean" data_type: TYPE_FP32 dims: [ -1, 1 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n")


async def measure(server: TritonServer, repo: ModelRepository, policy: GaussianPolicy, versions: int) -> dict:
    client, triton = PolicyClient(server.grpc_url), aio.InferenceServerClient(server.grpc_url)
    batch = np.zeros((16, policy.net[0].in_features), np.float32)

    def inputs():
        tensor = grpcclient.InferInput("observation", list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch)
        return [tensor]

    seconds: dict[str, list[float]] = {"stub": [], "persistent": []}
    for version in range(2, versions + 2):
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.01 * torch.randn_like(p))
        repo.write_weights("p", version, policy.state_dict(), base_version=version - 1)
        for how in (("stub", "persistent") if version % 2 else ("persistent", "stub")):
            started = time.monotonic()
            if how == "stub":
                if version >= 4:
                    repo.retire("p", version - 2)  # as the gateway does: the two newest stay loaded
                await client.load_model("p")
                await client.infer("p", version, {"observation": batch}, ["action_mean"])
            else:
                onnx = str(repo.root / "p" / str(version) / "policy.onnx")
                await triton.infer("engine", inputs(), parameters={"load": onnx, "version": version})
                await triton.infer("engine", inputs(), parameters={"version": version})
            seconds[how].append(time.monotonic() - started)
            await asyncio.sleep(0.5)
    await triton.close()
    await client.close()
    return {how: {"median_s": statistics.median(s[1:]), "max_s": max(s[1:]), "seconds": s}
            for how, s in seconds.items()}  # the first of each warms up


def main(argv: list[str] | None = None) -> dict:
    p = parser(__file__, __doc__)
    p.add_argument("--versions", type=int, default=12)
    a = p.parse_args(argv)
    if a.versions < 2:
        p.error(f"--versions must be >= 2, got {a.versions}")
    obs, act = specs(ENV)
    result = {"machine": machine(cpus=os.cpu_count(), load_avg_1m=os.getloadavg()[0]),
              "config": {"env": ENV, "versions": a.versions}}
    with tempfile.TemporaryDirectory(prefix="tether-persistent-") as tmp:
        repo = ModelRepository(Path(tmp) / "models")
        policy = GaussianPolicy(obs[0], act[0], seed=0, log_std_init=0.0)
        repo.write_version("p", 1, policy, obs, GaussianPolicy.output_specs(act[0]), serve="onnx")
        engine(repo.root, obs[0].shape[0])
        with TritonServer(repo.root, models=["p", "engine"], log_path=Path(tmp) / "triton.log") as server:
            result["new_version_to_first_answer"] = asyncio.run(measure(server, repo, policy, a.versions))
    result["machine"]["load_avg_1m_after"] = os.getloadavg()[0]
    return report(a.json, result, print_table)


def print_table(result: dict) -> None:
    r, m = result["new_version_to_first_answer"], result["machine"]
    print(f"{'new weights -> first answer at that version':<46} {'median s':>9} {'max s':>7}")
    for how, what in (("stub", "a Triton version (a new stub)"), ("persistent", "a persistent instance")):
        print(f"{what:<46} {r[how]['median_s']:>9.3f} {r[how]['max_s']:>7.3f}")
    print(f"load average {m['load_avg_1m']:.1f} -> {m['load_avg_1m_after']:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
