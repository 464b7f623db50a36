"""GaussianPolicy as served (TorchScript), and Policies Fetch/Publish over real gRPC on loopback."""

from __future__ import annotations

import math

import grpc
import numpy as np
import pytest
import torch

from bridge.client import PoliciesClient, WeightsError
from bridge.client.weights import from_safetensors
from protos import policies_pb2
from protos.codec import Spec
from tests.trainer.standin import StandIn
from trainer.policy import GaussianPolicy, MLPPolicy, probe_outputs
from trainer.weights import build_policy

OBS = Spec("observation", np.float32, (4,))
ACT = Spec("action", np.float32, (2,), low=(-3.0,), high=(3.0,))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_gaussian_policy_samples_in_torchscript_with_consistent_log_prob():
    policy = GaussianPolicy(OBS, ACT, seed=0, log_std_init=-0.5)
    scripted = torch.jit.script(policy)
    obs = torch.randn(64, 4)
    torch.manual_seed(1)
    with torch.no_grad():
        action, log_prob, mean = scripted(obs)
    assert action.shape == (64, 2) and log_prob.shape == (64, 1) and mean.shape == (64, 2)
    assert log_prob.dtype == torch.float32
    torch.testing.assert_close(mean, policy.mean(obs))
    assert bool((mean.abs() <= 3).all())
    torch.testing.assert_close(log_prob[:, 0], policy.log_prob(obs, action)[0], atol=1e-5, rtol=1e-5)
    z = (action - mean) / math.exp(-0.5)  # the sampling really has std exp(log_std)
    assert 0.8 < float(z.std()) < 1.2
    torch.manual_seed(1)
    with torch.no_grad():
        torch.testing.assert_close(scripted(obs)[0], action)  # seeded: reproducible
    specs = GaussianPolicy.output_specs(ACT)
    assert [(s.name, s.shape) for s in specs] == [("action", (2,)), ("log_prob", (1,)), ("action_mean", (2,))]


def test_build_policy_checks_the_served_specs():
    outputs = GaussianPolicy.output_specs(ACT)
    assert isinstance(build_policy("gaussian", (OBS,), outputs), GaussianPolicy)
    assert isinstance(build_policy("mlp", (OBS,), (ACT,)), MLPPolicy)
    with pytest.raises(ValueError, match="--arch gaussian needs outputs"):
        build_policy("gaussian", (OBS,), (ACT,))
    with pytest.raises(ValueError, match="--arch mlp has one output"):
        build_policy("mlp", (OBS,), outputs)
    with pytest.raises(ValueError, match="arch 'rnn'"):
        build_policy("rnn", (OBS,), (ACT,))


def test_fetch_then_publish_round_trip():
    with StandIn(OBS, ACT, policy="p", seed=3) as gw, PoliciesClient(gw.address, timeout_s=20) as client:
        served = client.fetch("p")
        assert (served.policy, served.version) == ("p", 1)
        assert served.inputs == (OBS,) and [s.name for s in served.outputs] == ["action", "log_prob", "action_mean"]
        policy = build_policy("gaussian", served.inputs, served.outputs)
        policy.load_state_dict(served.state_dict, strict=True)
        torch.testing.assert_close(policy.mean(torch.ones(1, 4)), gw.modules[1].mean(torch.ones(1, 4)))
        with torch.no_grad():
            policy.log_std.fill_(-1.0)
            policy.net[0].bias.add_(0.1)
        probe = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
        lineage = policies_pb2.Lineage(parent_version=1, trainer_step=80, data_offset=1234, trainer="test")
        reply = client.publish("p", policy.state_dict(), lineage=lineage, probe_inputs={"observation": probe},
                               probe_outputs=probe_outputs(policy, probe), atol=1e-4, chunk_bytes=1000)
        assert reply.version == 2 and gw.max_error <= 1e-4
        again = client.fetch("p")
        assert again.version == 2 and again.lineage.data_offset == 1234
        for k, v in policy.state_dict().items():
            assert torch.equal(again.state_dict[k], v), k

        wrong = {"action_mean": probe_outputs(policy, probe)["action_mean"] + 0.1}
        with pytest.raises(grpc.RpcError) as err:
            client.publish("p", policy.state_dict(), lineage=lineage, probe_inputs={"observation": probe},
                           probe_outputs=wrong, atol=1e-4)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        broken = dict(policy.state_dict(), log_std=torch.tensor([float("nan"), 0.0]))
        with pytest.raises(ValueError, match="log_std: refusing to publish NaN"):
            client.publish("p", broken, lineage=lineage, probe_inputs={}, probe_outputs={})
        assert gw.newest() == 2


def test_a_version_on_disk_is_published_from_the_file_in_chunks(tmp_path):
    """`publish_file`: a safetensors file sent from disk (a digest pass, then the stream), as the trainer sends a
    version too large to hold twice; `safetensors_parts` writes the bytes `safetensors.torch.save` would."""
    from safetensors.torch import save

    from bridge.client.weights import safetensors_parts

    with StandIn(OBS, ACT, policy="p", seed=3) as gw, PoliciesClient(gw.address, timeout_s=20) as client:
        policy = build_policy("gaussian", (OBS,), client.fetch("p").outputs)
        policy.load_state_dict(client.fetch("p").state_dict)
        with torch.no_grad():
            policy.net[0].weight.mul_(1.5)
        assert b"".join(safetensors_parts(policy.state_dict())) == save(policy.state_dict())
        path = tmp_path / "v2.safetensors"
        with path.open("wb") as f:
            for part in safetensors_parts(policy.state_dict()):
                f.write(part)
        probe = np.random.default_rng(1).normal(size=(4, 4)).astype(np.float32)
        reply = client.publish_file("p", path, lineage=policies_pb2.Lineage(parent_version=1),
                                    probe_inputs={"observation": probe}, probe_outputs=probe_outputs(policy, probe),
                                    atol=1e-4, chunk_bytes=1000)
        assert reply.version == 2
        assert all(torch.equal(client.fetch("p").state_dict[k], v) for k, v in policy.state_dict().items())
        with pytest.raises(FileNotFoundError, match="no safetensors file"):
            client.publish_file("p", tmp_path / "missing.safetensors", lineage=policies_pb2.Lineage(),
                                probe_inputs={}, probe_outputs={})


def test_garbage_weights_are_named():
    with pytest.raises(WeightsError, match="not a safetensors blob"):
        from_safetensors(b"\x00" * 10)


def test_hidden_sizes_come_from_the_served_weights():
    from trainer.weights import hidden_sizes

    assert hidden_sizes(GaussianPolicy(OBS, ACT, hidden=(32, 16)).state_dict()) == (32, 16)
    assert hidden_sizes(MLPPolicy(OBS, ACT, hidden=(8,)).state_dict()) == (8,)
    with pytest.raises(WeightsError, match="not an MLP policy"):
        hidden_sizes({"w": torch.zeros(1)})


def test_background_publisher_lets_training_go_on_and_a_restart_recognises_its_weights():
    from trainer.publisher import BackgroundPublisher, served_version_of

    probe = np.zeros((2, 4), np.float32)
    with StandIn(OBS, ACT, policy="p") as gw, PoliciesClient(gw.address, timeout_s=20) as client:
        gw.publish_delay_s = 0.5
        served = client.fetch("p")
        policy = build_policy("gaussian", served.inputs, served.outputs)
        policy.load_state_dict(served.state_dict)
        assert served_version_of(client.list("p"), policy.state_dict()).version == 1
        publisher = BackgroundPublisher(client, "p")
        with torch.no_grad():
            policy.log_std.fill_(-2.0)
        publisher.submit(policy.state_dict(), lineage=policies_pb2.Lineage(parent_version=1),
                         probe_inputs={"observation": probe}, probe_outputs=probe_outputs(policy, probe))
        with torch.no_grad():
            policy.log_std.fill_(-3.0)  # training goes on: the snapshot is what gets published
        assert publisher.busy and publisher.result() == 0
        with pytest.raises(RuntimeError, match="in flight"):
            publisher.submit(policy.state_dict(), lineage=policies_pb2.Lineage(), probe_inputs={}, probe_outputs={})
        publisher._future.result()  # finished, but its outcome not yet taken: a submit would lose it
        assert not publisher.busy and not publisher.idle
        with pytest.raises(RuntimeError, match="not taken"):
            publisher.submit(policy.state_dict(), lineage=policies_pb2.Lineage(), probe_inputs={}, probe_outputs={})
        assert publisher.result(wait=True) == 2 and publisher.idle and publisher.result() == 0
        publisher.close()
        assert torch.equal(client.fetch("p").state_dict["log_std"], torch.full((2,), -2.0))
        assert served_version_of(client.list("p"), policy.state_dict()) is None
        with torch.no_grad():
            policy.log_std.fill_(-2.0)
        assert served_version_of(client.list("p"), policy.state_dict()).version == 2
