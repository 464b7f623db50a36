"""Imported policy files served by a real tritonserver: a TorchScript archive and ONNX files
(torch.onnx.export and onnx.helper), each matching its reference; bad files refused before
anything is written; a version that fails to load in Triton leaves the others serving."""

from __future__ import annotations

import asyncio
import io
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from inference_server import InferenceError, ModelRepository, PolicyClient, TritonServer
from inference_server.artifact import ArtifactError, parse_spec, specs_to_json
from inference_server.formats import ONNX, TORCHSCRIPT, check_artifact, detect, imported_file
from inference_server.formats.onnx import onnx_batch_is_fixed
from protos.codec import Spec

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

OBS = (Spec("obs", np.float32, (3,)),)
ACT = (Spec("action", np.float32, (2,), (-1.0,), (1.0,)),)


def torchscript_bytes(module: torch.nn.Module, specs=(OBS, ACT)) -> bytes:
    buffer = io.BytesIO()
    extra = {"tether.json": specs_to_json(*specs)} if specs is not None else {}
    torch.jit.save(torch.jit.script(module), buffer, _extra_files=extra)
    return buffer.getvalue()


def onnx_bytes(module: torch.nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.onnx.export(module, (torch.zeros(1, 3),), buffer, input_names=["obs"], output_names=["action"],
                      dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, dynamo=False)
    return buffer.getvalue()


def helper_onnx(batch: int | str = 1) -> bytes:
    """onnx.helper: action = clip(obs[:, :2] * 0.5 + 0.1) and steps = counter + 1 (int64), batch fixed at 1."""
    graph = helper.make_graph(
        [helper.make_node("Slice", ["obs", "zero", "two", "one"], ["head"]),
         helper.make_node("Mul", ["head", "half"], ["scaled"]),
         helper.make_node("Add", ["scaled", "tenth"], ["shifted"]),
         helper.make_node("Clip", ["shifted", "low", "high"], ["action"]),
         helper.make_node("Add", ["counter", "one_i"], ["steps"])],
        "policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [batch, 3]),
         helper.make_tensor_value_info("counter", TensorProto.INT64, [batch, 1])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, [batch, 2]),
         helper.make_tensor_value_info("steps", TensorProto.INT64, [batch, 1])],
        [helper.make_tensor(name, dtype, dims, [value]) for name, dtype, dims, value in [
            ("zero", TensorProto.INT64, [1], 0), ("two", TensorProto.INT64, [1], 2), ("one", TensorProto.INT64, [1], 1),
            ("half", TensorProto.FLOAT, [], 0.5), ("tenth", TensorProto.FLOAT, [], 0.1),
            ("low", TensorProto.FLOAT, [], -1), ("high", TensorProto.FLOAT, [], 1),
            ("one_i", TensorProto.INT64, [], 1)]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.fixture(scope="module")
def module():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2), torch.nn.Tanh()).eval()


@pytest.fixture(scope="module")
def served(tmp_path_factory, module):
    """One Triton: a TorchScript import, an ONNX export, an onnx.helper graph, and a trained-style
    model ("mixed") whose version 2 is an imported ONNX file."""
    repo = ModelRepository(tmp_path_factory.mktemp("import") / "models")
    repo.write_artifact("ts", 1, "torchscript", torchscript_bytes(module), OBS, ACT)
    repo.write_artifact("ox", 1, "onnx", onnx_bytes(module), OBS, ACT)
    inputs, outputs = ONNX.read_specs(helper_onnx())
    repo.write_artifact("rows", 1, "onnx", helper_onnx(), inputs, outputs)
    repo.write_version("mixed", 1, torch.nn.Linear(3, 2), OBS, ACT)
    repo.write_artifact("mixed", 2, "onnx", onnx_bytes(module), OBS, ACT)
    with TritonServer(repo.root, models=["ts", "ox", "rows", "mixed"]) as server:
        yield repo, server


def run(server: TritonServer, fn):
    async def main():
        client = PolicyClient(server.grpc_url, timeout_s=10.0)
        try:
            return await fn(client)
        finally:
            await client.close()

    return asyncio.run(main())


def test_specs_are_read_from_the_files(module):
    assert TORCHSCRIPT.read_specs(torchscript_bytes(module)) == (OBS, ACT)
    assert TORCHSCRIPT.read_specs(torchscript_bytes(module, specs=None)) is None
    assert ONNX.read_specs(onnx_bytes(module)) == (OBS, (Spec("action", np.float32, (2,)),))
    inputs, outputs = ONNX.read_specs(helper_onnx())
    assert [(s.name, s.dtype.name, s.shape) for s in inputs + outputs] == [
        ("obs", "float32", (3,)), ("counter", "int64", (1,)), ("action", "float32", (2,)), ("steps", "int64", (1,))]
    assert onnx_batch_is_fixed(helper_onnx()) and not onnx_batch_is_fixed(onnx_bytes(module))
    assert detect(torchscript_bytes(module)) is TORCHSCRIPT and detect(helper_onnx()) is ONNX


@pytest.mark.slow
@pytest.mark.parametrize("model", ["ts", "ox", "mixed"])
def test_imported_versions_serve_their_reference_outputs(served, module, model):
    repo, server = served
    obs = np.random.default_rng(1).standard_normal((6, 3)).astype(np.float32)
    with torch.no_grad():
        reference = module(torch.from_numpy(obs)).numpy()
    version = max(repo.versions(model))
    out = run(server, lambda c: c.infer(model, version, {"obs": obs}, ["action"]))
    np.testing.assert_allclose(out["action"], reference, rtol=1e-5, atol=1e-6)
    assert repo.imported_format(model, version) == ("torchscript" if model == "ts" else "onnx")


@pytest.mark.slow
def test_onnx_with_a_batch_of_one_runs_row_by_row_with_int64(served):
    _, server = served
    obs = np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32) * 4
    counter = np.arange(5, dtype=np.int64)[:, None]
    out = run(server, lambda c: c.infer("rows", 1, {"obs": obs, "counter": counter}, ["action", "steps"]))
    session = ort.InferenceSession(helper_onnx(), providers=["CPUExecutionProvider"])
    expected = np.concatenate([session.run(["action"], {"obs": obs[i:i + 1], "counter": counter[i:i + 1]})[0]
                               for i in range(5)])
    np.testing.assert_allclose(out["action"], expected, rtol=1e-6)
    np.testing.assert_array_equal(out["steps"], counter + 1)
    assert out["steps"].dtype == np.int64 and np.abs(out["action"]).max() <= 1.0


def test_bad_files_are_refused_before_anything_is_written(tmp_path, module):
    repo = ModelRepository(tmp_path)
    ts, ox = torchscript_bytes(module), onnx_bytes(module)
    cases = [
        ("torchscript", ts[: len(ts) // 2], OBS, ACT, "not a complete TorchScript archive"),
        ("onnx", ox[: len(ox) // 3], OBS, ACT, "neither a TorchScript archive nor an ONNX model"),
        ("onnx", ox, (Spec("obs", np.float32, (4,)),), ACT, r"ONNX input 'obs' is float32\[3\], declared float32\[4\]"),
        ("onnx", ox, (Spec("state", np.float32, (3,)),), ACT, "the ONNX graph has no input 'state'"),
        ("onnx", ox, OBS, (Spec("action", np.float64, (2,)),), r"ONNX output 'action' is float32\[2\]"),
        ("torchscript", ts, OBS, (Spec("action", np.float32, (3,)),), "differ from the archive's tether.json"),
        ("torchscript", b"PK\x03\x04" + b"\0" * 64, OBS, ACT, "not a complete TorchScript archive"),
        ("onnx", ox, OBS, (Spec("action", np.float32, (2,), (1.0,), (-1.0,)),), "low .* above high"),
        ("keras", ox, OBS, ACT, "format 'keras'"),
    ]
    for fmt, data, inputs, outputs, needle in cases:
        with pytest.raises(ValueError, match=needle):
            repo.write_artifact("bad", 1, fmt, data, inputs, outputs)
    assert not (tmp_path / "bad").exists() or list((tmp_path / "bad").iterdir()) == []
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("x/readme.txt", "hello")
    with pytest.raises(ArtifactError, match="no x/data.pkl"):
        check_artifact("torchscript", zipped.getvalue(), OBS, ACT)


def test_onnx_with_external_data_or_a_fixed_batch_is_refused(tmp_path, module):
    model = onnx.load_model_from_string(onnx_bytes(module))
    weight = model.graph.initializer[0]
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value="/etc/passwd")
    with pytest.raises(ArtifactError, match="external files"):
        check_artifact("onnx", model.SerializeToString(), OBS, ACT)
    with pytest.raises(ArtifactError, match="fixed batch dimension 4"):
        check_artifact("onnx", helper_onnx(batch=4), *ONNX.read_specs(helper_onnx(batch=4)))


def test_existing_models_keep_their_specs_and_imported_weights_stay_unread(tmp_path, module):
    repo = ModelRepository(tmp_path)
    repo.write_artifact("p", 1, "torchscript", torchscript_bytes(module), OBS, ACT)
    other = (Spec("obs", np.float32, (4,)),)
    with pytest.raises(ValueError, match="differ from the inputs/outputs of the existing versions"):
        repo.write_artifact("p", 2, "onnx", onnx_bytes(module), other, ACT)
    with pytest.raises(ValueError, match="imported torchscript file"):
        repo.write_weights("p", 2, {})
    with pytest.raises(ValueError, match="imported torchscript file"):
        repo.state_dict("p", 1)
    with pytest.raises(FileExistsError):
        repo.write_artifact("p", 1, "onnx", onnx_bytes(module), OBS, ACT)
    assert repo.versions("p") == [1]


@pytest.mark.parametrize(("text", "needle"), [
    ("obs:float32", "NAME:DTYPE:SHAPE"), ("obs:complex64:3", "unsupported dtype"), ("obs:float32:x", "numbers"),
    ("a:float32:2:0,0,0:1", "3 low bounds for 2 elements"), ("obs:float32:3:1", "NAME:DTYPE:SHAPE"),
])
def test_bad_spec_strings_name_the_value(text, needle):
    with pytest.raises(ArtifactError, match=needle):
        parse_spec(text)


@pytest.mark.slow
def test_a_version_that_fails_to_load_leaves_the_others_serving(served, module):
    repo, server = served
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:  # passes the static check, fails torch.jit.load in Triton
        archive.writestr("x/data.pkl", b"not a pickle")
        archive.writestr("x/code/__torch__.py", b"nonsense")
    repo.write_artifact("ts", 2, "torchscript", zipped.getvalue(), OBS, ACT)

    async def scenario(client):
        with pytest.raises(InferenceError, match="version 2"):
            await client.load_model("ts")
        return await client.ready_versions("ts"), await client.infer("ts", 1, {"obs": np.zeros((1, 3), np.float32)},
                                                                      ["action"])

    try:
        ready, out = run(server, scenario)
    finally:
        repo.retire("ts", 2)
    assert ready == [1] and out["action"].shape == (1, 2)


@pytest.mark.slow
def test_a_torchscript_file_with_nan_weights_is_not_served(served, module):
    repo, server = served
    broken = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh())
    with torch.no_grad():
        broken[0].bias[1] = float("nan")
    repo.write_artifact("nan", 1, "torchscript", torchscript_bytes(broken), OBS, ACT)  # statically fine

    async def scenario(client):
        with pytest.raises(InferenceError, match=r"weight '0.bias' has non-finite values"):
            await client.load_model("nan")
        return await client.ready_versions("nan")

    assert run(server, scenario) == []


@pytest.mark.slow
def test_loading_a_new_version_leaves_the_loaded_ones_as_they_are(served, module):
    """Triton reloads a version whose folder changed since it loaded it: the stub must not write
    bytecode there (model.py's is written beside it), or every swap restarts the previous version."""
    from bridge.common.processes import group_members

    repo, server = served

    def stubs() -> dict[int, str]:
        found = {}
        for pid in group_members(server.pid):
            try:
                argv = open(f"/proc/{pid}/cmdline").read().split("\0")  # noqa: SIM115
            except OSError:
                continue
            if "triton_python_backend_stub" in argv[0] and "/ox/" in argv[1]:
                found[pid] = argv[1].split("/")[-2]
        return found

    before = stubs()
    assert sorted(before.values()) == ["1"]
    repo.write_artifact("ox", 2, "onnx", onnx_bytes(module), OBS, ACT)
    run(server, lambda c: c.load_model("ox"))
    after = stubs()
    assert sorted(after.values()) == ["1", "2"] and set(before) < set(after)  # v1's stub is the same process
    assert sorted(p.name for p in (repo.root / "ox" / "1").iterdir()) == ["__pycache__", "artifact.json", "model.py",
                                                                          "policy.onnx"]


def test_an_imported_file_carries_its_readable_weights(module):
    ox = onnx.load_model_from_string(onnx_bytes(module))
    bias = next(t for t in ox.graph.initializer if t.name.endswith("0.bias"))
    values = onnx.numpy_helper.to_array(bias).copy()
    values[0] = np.nan
    bias.CopyFrom(onnx.numpy_helper.from_array(values, bias.name))
    imported = imported_file("onnx", ox.SerializeToString(), OBS, ACT)
    assert imported.format == "onnx" and imported.inputs == OBS and isinstance(imported.data, bytes)
    shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in imported.items()} == shapes
    assert torch.isnan(imported[bias.name]).sum() == 1  # the gate's integrity check sees it
    ts = imported_file("torchscript", torchscript_bytes(module), OBS, ACT)  # read in a subprocess
    assert ts.outputs == ACT and ts.keys() == module.state_dict().keys()
    torch.testing.assert_close(ts["0.weight"], module.state_dict()["0.weight"])
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:  # passes the static check, fails torch.jit.load
        archive.writestr("x/data.pkl", b"not a pickle")
        archive.writestr("x/code/__torch__.py", b"nonsense")
    with pytest.raises(ArtifactError, match=r"does not load \(torch.jit.load\)"):
        imported_file("torchscript", zipped.getvalue(), OBS, ACT)
    with pytest.raises(ArtifactError, match="travels with its input and output specs"):
        imported_file("onnx", onnx_bytes(module), (), ACT)


@pytest.mark.slow
def test_module_versions_served_with_onnxruntime_follow_their_base(tmp_path):
    """write_version(serve="onnx"): the TorchScript stays (architecture, weights), onnxruntime serves;
    write_weights keeps serving the new version that way; a stochastic policy's mean matches too."""
    from trainer.policy import GaussianPolicy, MLPPolicy

    obs, act = Spec("observation", np.float32, (5,)), Spec("action", np.float32, (2,), (-1.0,), (1.0,))
    repo = ModelRepository(tmp_path / "models")
    mlp = MLPPolicy(obs, act, seed=0)
    repo.write_version("fast", 1, mlp, (obs,), (act,), serve="onnx")
    weights = {k: v * 1.5 if k.startswith("net.") else v for k, v in repo.state_dict("fast", 1).items()}
    repo.write_weights("fast", 2, weights)
    gaussian = GaussianPolicy(obs, act, seed=0)
    repo.write_version("noisy", 1, gaussian, (obs,), GaussianPolicy.output_specs(act), serve="onnx")
    for version in (1, 2):
        assert {"policy.pt", "policy.onnx"} <= {p.name for p in (repo.root / "fast" / str(version)).iterdir()}
    x = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
    mlp.load_state_dict(weights)

    async def scenario(client):
        fast = await client.infer("fast", 2, {"observation": x}, ["action"])
        noisy = await client.infer("noisy", 1, {"observation": x}, ["action", "log_prob", "action_mean"])
        return fast, noisy

    with TritonServer(repo.root, models=["fast", "noisy"]) as server:
        fast, noisy = run(server, scenario)
    with torch.no_grad():
        np.testing.assert_allclose(fast["action"], mlp(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)
        mean = gaussian(torch.from_numpy(x))[2].numpy()
    np.testing.assert_allclose(noisy["action_mean"], mean, rtol=1e-5, atol=1e-6)
    assert noisy["action"].shape == (4, 2) and noisy["log_prob"].shape == (4, 1)
    assert np.isfinite(noisy["log_prob"]).all() and not np.allclose(noisy["action"], noisy["action_mean"])
    with pytest.raises(ValueError, match="serve 'tensorrt'"):
        repo.write_version("x", 1, mlp, (obs,), (act,), serve="tensorrt")
