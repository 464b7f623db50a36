"""ONNX versions of a module-written policy (inference_server.onnx_export): a later version's file is the base's
graph with the new weights put in by name (no export), exact in every tensor the graph reads, including the
ones only the sampled outputs depend on (which no output comparison can check); a base whose initializers are
not named after the state dict (a file written before, whose exporter merged equal tensors) is exported again."""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from inference_server import ModelRepository, onnx_export
from inference_server.formats.onnx import ONNX, onnx_weights
from protos.codec import Spec
from trainer.policy import GaussianPolicy

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.* in torch >= 2.9

OBS = (Spec("observation", np.float32, (11,)),)
ACTION = Spec("action", np.float32, (3,), low=(-1.0,) * 3, high=(1.0,) * 3)
OUTPUTS = GaussianPolicy.output_specs(ACTION)


def moved(policy: GaussianPolicy, seed: int) -> GaussianPolicy:
    """`policy` after an update: every parameter moved, log_std too."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    return policy


def assert_holds(data: bytes, policy: GaussianPolicy) -> None:
    """Every initializer of `data` is the state-dict tensor of its name, and the graph reads every tensor the
    served function uses (the log-std and the bounds included)."""
    state = policy.state_dict()
    weights = onnx_weights(data)
    assert set(weights) == set(state) - {"obs_count"}, sorted(weights)  # obs_count: the normaliser's, not served
    for name, array in weights.items():
        assert np.array_equal(array, state[name].numpy()), name


def test_export_names_every_tensor_after_the_state_dict_even_equal_ones():
    policy = GaussianPolicy(OBS[0], ACTION, seed=0, log_std_init=0.0)  # log_std, center, the head's bias: all 0
    data = onnx_export.export(torch.jit.script(policy), OBS, OUTPUTS)
    assert_holds(data, policy)  # the exporter did not merge the equal zero tensors into one
    assert {p.key: p.value for p in onnx.load_model_from_string(data).metadata_props} == \
        {"tether.initializers": "state_dict"}


def test_reweight_puts_a_later_versions_weights_in_the_base_graph_exactly():
    policy = GaussianPolicy(OBS[0], ACTION, seed=0, log_std_init=0.0)
    base = onnx_export.export(torch.jit.script(policy), OBS, OUTPUTS)
    policy = moved(policy, seed=1)
    data = onnx_export.reweight(base, torch.jit.script(policy), *ONNX.read_specs(base))
    assert_holds(data, policy)
    batch = np.random.default_rng(0).standard_normal((5, 11)).astype(np.float32)
    (served,) = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(["action_mean"],
                                                                                  {"observation": batch})
    with torch.no_grad():
        expected = policy.mean(torch.from_numpy(batch)).numpy()
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-5)
    # the sampled outputs: log_prob = sum(-noise^2/2 - log_std - log(sqrt(2 pi))), so with the noise recovered
    # from (action - mean) / std, the served log-prob is the new log_std's
    action, log_prob, mean = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(
        ["action", "log_prob", "action_mean"], {"observation": batch})
    log_std = policy.log_std.detach().numpy()
    noise = (action - mean) / np.exp(log_std)
    np.testing.assert_allclose(log_prob[:, 0], (-0.5 * noise ** 2 - log_std - 0.9189385332046727).sum(-1),
                               rtol=1e-4, atol=1e-4)


def test_a_base_not_named_after_the_state_dict_is_exported_again():
    policy = GaussianPolicy(OBS[0], ACTION, seed=0, log_std_init=0.0)
    scripted = torch.jit.script(policy)
    zeros = torch.zeros(1, 11)
    import io
    buffer = io.BytesIO()  # how versions were exported before: the equal zero tensors merged into one
    torch.onnx.export(scripted, (zeros,), buffer, input_names=["observation"],
                      output_names=[s.name for s in OUTPUTS], dynamo=False,
                      dynamic_axes={n: {0: "batch"} for n in ["observation", *(s.name for s in OUTPUTS)]})
    old = buffer.getvalue()
    assert "log_std" not in onnx_weights(old)  # merged: substituting by name would lose it
    policy = moved(policy, seed=2)
    data = onnx_export.reweight(old, torch.jit.script(policy), *ONNX.read_specs(old))
    assert_holds(data, policy)


def test_write_weights_reweights_instead_of_exporting(tmp_path):
    repo = ModelRepository(tmp_path)
    policy = GaussianPolicy(OBS[0], ACTION, seed=0, log_std_init=0.0)
    repo.write_version("p", 1, policy, OBS, OUTPUTS, serve="onnx")
    seconds = []
    for version in range(2, 6):
        policy = moved(policy, seed=version)
        started = time.monotonic()
        repo.write_weights("p", version, policy.state_dict())
        seconds.append(time.monotonic() - started)
        assert repo.serving_format("p", version) == "onnx"
        assert_holds((tmp_path / "p" / str(version) / "policy.onnx").read_bytes(), policy)
    print(f"write_weights (TorchScript + ONNX re-weighted + fsyncs): {[round(s, 3) for s in seconds]} s")
