"""`tether policy import`: a TorchScript module and an ONNX file made here, read with their specs,
probed locally, sent as a Publish stream and served by a real Triton matching the local outputs;
bad files and wrong specs refused with a message naming what is wrong."""

from __future__ import annotations

import asyncio
import hashlib
import io

import numpy as np
import pytest
import torch

from inference_server import PolicyClient
from inference_server.artifact import ArtifactError, specs_to_json
from protos.codec import Spec, decode_all, specs_from_proto
from tests.support.gateways import gateway_process
from tether import policy_cli
from tether.cli import main as tether_main

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

OBS = (Spec("obs", np.float32, (4,), (-2.0,), (2.0,)),)
ACT = (Spec("action", np.float32, (2,), (-1.0,), (1.0,)),)


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """policy.pt (TorchScript with tether.json), bare.pt (without), policy.onnx (torch.onnx.export)."""
    folder = tmp_path_factory.mktemp("files")
    module = Policy().eval()
    scripted = torch.jit.script(module)
    torch.jit.save(scripted, str(folder / "policy.pt"), _extra_files={"tether.json": specs_to_json(OBS, ACT)})
    torch.jit.save(scripted, str(folder / "bare.pt"))
    buffer = io.BytesIO()
    torch.onnx.export(module, (torch.zeros(1, 4),), buffer, input_names=["obs"], output_names=["action"],
                      dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, dynamo=False)
    (folder / "policy.onnx").write_bytes(buffer.getvalue())
    return folder, module


def test_specs_come_from_the_file_or_the_command_line(files):
    folder, _ = files
    ts = policy_cli.read_policy_file(folder / "policy.pt")
    assert (ts.format, ts.inputs, ts.outputs) == ("torchscript", OBS, ACT) and ts.outputs[0].high == (1.0,)
    onnx = policy_cli.read_policy_file(folder / "policy.onnx", outputs=ACT)
    assert onnx.format == "onnx" and onnx.inputs == OBS and onnx.outputs[0].low == (-1.0,)
    assert policy_cli.read_policy_file(folder / "policy.onnx").inputs[0].low == ()  # the graph has no bounds
    bare = policy_cli.read_policy_file(folder / "bare.pt", inputs=OBS, outputs=ACT)
    assert bare.inputs == OBS
    with pytest.raises(ArtifactError, match="declares no specs: pass --obs and --action"):
        policy_cli.read_policy_file(folder / "bare.pt")


@pytest.mark.parametrize("name", ["policy.pt", "policy.onnx"])
def test_probe_and_reference_outputs_are_the_modules(files, name):
    folder, module = files
    policy = policy_cli.read_policy_file(folder / name, inputs=OBS)  # the bounds (an ONNX graph has none)
    probe = policy_cli.probe_inputs(policy.inputs, batch=8, seed=1)
    assert probe["obs"].shape == (8, 4) and np.abs(probe["obs"]).max() <= 2.0
    np.testing.assert_array_equal(probe["obs"], policy_cli.probe_inputs(policy.inputs, batch=8, seed=1)["obs"])
    expected = policy_cli.reference_outputs(policy, probe)
    with torch.no_grad():
        np.testing.assert_allclose(expected["action"], module(torch.from_numpy(probe["obs"])).numpy(), atol=1e-6)


def test_the_publish_stream_carries_the_whole_file_and_its_specs(files):
    folder, _ = files
    policy = policy_cli.read_policy_file(folder / "policy.onnx", outputs=ACT)
    probe = policy_cli.probe_inputs(policy.inputs, batch=3)
    chunks = list(policy_cli.publish_chunks(policy, "walker", probe, policy_cli.reference_outputs(policy, probe),
                                            chunk_bytes=1000))
    header, data = chunks[0].header, b"".join(c.data for c in chunks[1:])
    assert all(len(c.data) <= 1000 for c in chunks[1:]) and len(chunks) == 1 + -(-len(data) // 1000)
    assert data == policy.data and header.size == len(data) and header.sha256 == hashlib.sha256(data).hexdigest()
    assert header.format == "onnx" and header.policy == "walker" and header.lineage.trainer.startswith("import:")
    assert specs_from_proto(header.inputs) == OBS and specs_from_proto(header.outputs)[0].high == (1.0,)
    assert decode_all(header.probe_inputs)["obs"].shape == (3, 4)


@pytest.mark.slow
def test_imported_files_are_served_by_triton_as_computed_locally(files, triton):
    """What the gateway does with an import stream, step by step, against a real Triton (the session's)."""
    folder, _ = files
    repo = triton.repo
    triton.claim("mine")
    streams = {}
    for version, name in enumerate(["policy.pt", "policy.onnx"], start=1):
        policy = policy_cli.read_policy_file(folder / name, outputs=ACT)
        probe = policy_cli.probe_inputs(policy.inputs, seed=version)
        chunks = list(policy_cli.publish_chunks(policy, "mine", probe, policy_cli.reference_outputs(policy, probe)))
        header = chunks[0].header
        data = b"".join(c.data for c in chunks[1:])
        repo.write_artifact(header.policy, version, header.format, data, specs_from_proto(header.inputs),
                            specs_from_proto(header.outputs))
        streams[version] = header

    async def served():
        client = PolicyClient(triton.url, timeout_s=10.0)
        try:
            results = {}
            for version, header in streams.items():
                probe, expected = decode_all(header.probe_inputs), decode_all(header.probe_outputs)
                got = await client.infer("mine", version, probe, list(expected))
                results[version] = float(np.abs(got["action"] - expected["action"]).max())
            return results, await client.ready_versions("mine")
        finally:
            await client.close()

    triton.server.load_model("mine")
    errors, ready = asyncio.run(served())
    assert ready == [1, 2] and max(errors.values()) < 1e-5


def test_bad_files_and_wrong_specs_are_refused_by_the_command(files, tmp_path, capsys):
    folder, _ = files
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes((folder / "policy.onnx").read_bytes()[:300])
    cut = tmp_path / "cut.pt"
    cut.write_bytes((folder / "policy.pt").read_bytes()[:-200])
    cases = [
        ([str(truncated)], "neither a TorchScript archive nor an ONNX model"),
        ([str(cut)], "not a complete TorchScript archive"),
        ([str(folder / "policy.onnx"), "--obs", "obs:float32:5"], r"ONNX input 'obs' is float32\[4\], declared"),
        ([str(folder / "bare.pt"), "--obs", "obs:float32:4", "--action", "action:float32:3"],
         r"output 'action' is float32\[8, 2\] for a batch of 8, declared float32\[8, 3\]"),
        ([str(folder / "bare.pt"), "--obs", "obs:float32:5", "--action", "action:float32:2"],
         "fails on a probe batch"),
        ([str(folder / "policy.pt"), "--action", "action:float32:2:1:-1"], "low .* above high"),
        ([str(tmp_path / "missing.onnx")], "cannot read"),
    ]
    for args, needle in cases:
        with pytest.raises(SystemExit) as exit_info:
            tether_main(["policy", "import", *args, "--name", "x", "--gateway", "127.0.0.1:1", "--timeout", "1"])
        assert exit_info.value.code.startswith("tether policy import: ")
        assert __import__("re").search(needle, exit_info.value.code), (needle, exit_info.value.code)


def test_inspect_prints_the_specs(files, capsys):
    folder, _ = files
    tether_main(["policy", "inspect", str(folder / "policy.onnx")])
    out = capsys.readouterr().out
    assert out.startswith(f"# {folder / 'policy.onnx'}: onnx") and '"name": "obs"' in out
    with pytest.raises(SystemExit, match="without tether.json"):
        tether_main(["policy", "inspect", str(folder / "bare.pt")])


# -- through a real gateway (tether.v1.Policies.Publish -> registry -> gate -> Triton) -------------------------
# A `tether gateway` process on the session's Triton, publishing into its repository with a registry of its own; what
# the gateway recorded is read back through its public RPC (Policies.RolloutStatus), as an operator would.


@pytest.fixture(scope="module")
def gateway(triton, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gateway")
    with gateway_process(triton.url, folder / "gateway.log", *triton.publishing_args(folder), policy="") as gw:
        yield gw.address


@pytest.fixture(scope="module")
def byo(gateway, files) -> int:
    """This module's policy `byo`, created by importing policy.pt (its imports add versions only it sees)."""
    folder, _ = files
    return policy_cli.import_policy_file(gateway, folder / "policy.pt", name="byo")[1].version


def rollout(gateway: str, policy: str):
    """The gateway's Policies.RolloutStatus of `policy`: its rollout (live version) and every version's record."""
    import grpc

    from protos import policies_pb2, policies_pb2_grpc

    with grpc.insecure_channel(gateway) as channel:
        return policies_pb2_grpc.PoliciesStub(channel).RolloutStatus(
            policies_pb2.RolloutStatusRequest(policy=policy), timeout=30)


def served(triton, policy: str, version: int | None, inputs: dict) -> tuple[dict | None, list[int]]:
    """What Triton serves: `version`'s outputs on `inputs` (None: none asked) and the ready versions."""

    async def ask():
        client = PolicyClient(triton.url, timeout_s=10.0)
        try:
            out = None if version is None else await client.infer(policy, version, inputs, ["action"])
            return out, await client.ready_versions(policy)
        finally:
            await client.close()

    return asyncio.run(ask())


def import_command(gateway: str, *args) -> list[str]:
    return ["policy", "import", *map(str, args), "--gateway", gateway, "--timeout", "120"]


@pytest.mark.slow
def test_tether_policy_import_serves_an_onnx_and_a_torchscript_version(files, triton, gateway, byo, capsys):
    folder, module = files
    obs = np.random.default_rng(5).uniform(-2, 2, (6, 4)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(obs)).numpy()
    imported = {}
    for name in ("policy.onnx", "policy.pt"):
        tether_main(import_command(gateway, folder / name, "--name", "byo", "--action", "action:float32:2:-1:1"))
        status = rollout(gateway, "byo")
        version = status.rollout.live
        imported[name] = (version, served(triton, "byo", version, {"obs": obs})[0],
                          next(v for v in status.versions if v.version == version))
    out = capsys.readouterr().out
    assert "imported" in out and "(onnx," in out and "(torchscript," in out and "served and verified" in out
    (v_onnx, onnx_out, onnx_record), (v_ts, ts_out, ts_record) = imported["policy.onnx"], imported["policy.pt"]
    assert v_ts == v_onnx + 1 > byo
    for record, fmt in ((onnx_record, "onnx"), (ts_record, "torchscript")):  # gated like a trainer's version
        checks = {c.name: c for c in record.gate}
        assert record.format == fmt and record.state == "live" and all(c.passed for c in record.gate), record
        assert {"integrity", "consistency"} <= checks.keys() and checks["integrity"].figures["tensors"] == 4
    np.testing.assert_allclose(onnx_out["action"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ts_out["action"], expected, rtol=1e-5, atol=1e-6)
    repo = triton.repo
    assert repo.imported_format("byo", v_onnx) == "onnx" and repo.imported_format("byo", v_ts) == "torchscript"


@pytest.mark.slow
def test_the_gateway_refuses_bad_imports_naming_why_and_keeps_serving(files, triton, gateway, byo):
    import grpc

    from protos import policies_pb2_grpc

    folder, _ = files
    good = policy_cli.read_policy_file(folder / "policy.onnx", outputs=ACT)
    probe = policy_cli.probe_inputs(good.inputs)
    expected = policy_cli.reference_outputs(good, probe)
    truncated = policy_cli.PolicyFile("onnx", good.data[:300], OBS, ACT)
    wrong = policy_cli.PolicyFile("onnx", good.data, OBS, (Spec("action", np.float32, (3,)),))
    zipped = policy_cli.PolicyFile("torchscript", b"PK\x03\x04 not really a zip", OBS, ACT)

    live = rollout(gateway, "byo").rollout.live
    refusals = []
    with grpc.insecure_channel(gateway) as channel:
        stub = policies_pb2_grpc.PoliciesStub(channel)
        for policy in (truncated, wrong, zipped):
            with pytest.raises(grpc.RpcError) as info:
                stub.Publish(policy_cli.publish_chunks(policy, "byo", probe, expected), timeout=120)
            refusals.append((info.value.code(), info.value.details()))
    current = rollout(gateway, "byo").rollout.live
    out, ready = served(triton, "byo", current, {"obs": probe["obs"]})
    assert live == current and current in ready
    assert all(code == grpc.StatusCode.INVALID_ARGUMENT for code, _ in refusals), refusals
    assert "neither a TorchScript archive nor an ONNX model" in refusals[0][1]
    assert "ONNX output 'action' is float32[2], declared float32[3]" in refusals[1][1]
    assert "not a complete TorchScript archive" in refusals[2][1]
    assert out["action"].shape == (8, 2)


@pytest.mark.slow
def test_a_new_name_creates_a_policy(files, triton, gateway, capsys):
    folder, module = files
    tether_main(import_command(gateway, folder / "policy.onnx", "--name", "walker"))
    assert served(triton, "walker", None, {})[1] == [1]
    assert "as walker v1" in capsys.readouterr().out
