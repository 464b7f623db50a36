"""Weight sync in the learning loop: the trainer's policy (a Gaussian MLP, as `tether demo --train` writes it) is
served by onnxruntime, so a published version is served within a fraction of a second; the gate's consistency
check (the probe batch at exactly the new version against the trainer's outputs, within the ONNX tolerance) still
rejects a version whose served outputs are not the trainer's."""

from __future__ import annotations

import asyncio
import hashlib
import os
import statistics
import time

import grpc
import numpy as np
import pytest
import torch

from bridge.client import PoliciesClient
from bridge.gate.checks import SERVING_TOLERANCES
from inference_server import ModelRepository, onnx_export
from inference_server.formats.onnx import onnx_weights
from protos import policies_pb2
from protos.codec import Spec, encode_all
from tests.support.gateways import running_gateway
from trainer.policy import GaussianPolicy, probe_outputs

ENV = "InvertedPendulum-v5"
OBS = (Spec("observation", np.float32, (4,)),)
PUBLISHES = 6  # the first warms up (the gateway's first ONNX export imports torch.onnx and onnxruntime): not timed
REGRESSION_S = 2.0  # the target is 0.5 s median; only a clear regression fails (a torch-served version: 1.5-3 s
# quiet, 5-10 s while training). Each version is a Triton stub process (~0.2 CPU-s to start): on a machine with
# more than 4 runnable processes per core the limit grows with that contention, so over-subscription alone does
# not fail it (at load 17 on 2 cores the median was 2.5 s)


def limit_s(load: float) -> float:
    """REGRESSION_S scaled by the CPU contention beyond 4 runnable processes per core.

    >>> limit_s(0.5 * (os.cpu_count() or 1)), limit_s(8.0 * (os.cpu_count() or 1))
    (2.0, 4.0)
    """
    return REGRESSION_S * max(1.0, load / (os.cpu_count() or 1) / 4)


@pytest.fixture(scope="module")
def served(triton, tmp_path_factory):
    """The learning loop's policy (served by onnxruntime) in the session's Triton; gateways publish into its
    repository with a registry of this module's."""
    name = triton.add_initial_policy(ENV)
    assert triton.repo.serving_format(name, 1) == "onnx"
    return triton.server, triton.repo, name, triton.publishing(tmp_path_factory.mktemp("weight_sync"))


def trained(repo: ModelRepository, name: str, version: int, seed: int) -> GaussianPolicy:
    """The served weights of `version`, moved as an update would move them."""
    served = repo.state_dict(name, version)
    action = Spec("action", np.float32, (1,), low=(-3.0,), high=(3.0,))
    policy = GaussianPolicy(OBS[0], action)
    policy.load_state_dict(served)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.net.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return policy


def probe(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((16, 4)) * 2).astype(np.float32)


def test_publish_to_served_is_sub_second_through_onnxruntime_and_within_its_tolerance(served):
    server, repo, name, publishing = served

    async def scenario():
        async with running_gateway(server.grpc_url, policy=name, **publishing) as gw:
            with PoliciesClient(gw.address) as client:
                seconds, errors = [], []
                for i in range(PUBLISHES):
                    parent = repo.versions(name)[-1]
                    policy, batch = trained(repo, name, parent, seed=i), probe(i)
                    started = time.monotonic()
                    reply = await asyncio.to_thread(
                        client.publish, name, policy.state_dict(), probe_inputs={"observation": batch},
                        probe_outputs=probe_outputs(policy, batch),
                        lineage=policies_pb2.Lineage(parent_version=parent, trainer_step=i, trainer="test"))
                    seconds.append(time.monotonic() - started)
                    errors.append(reply.max_abs_error)
                    assert reply.version == parent + 1 and repo.serving_format(name, reply.version) == "onnx"
                    # the served file holds the trainer's tensors exactly, log_std too (only the sampled outputs
                    # read it: no probe can compare it), put into the parent's graph by name, not re-exported
                    served_file = (repo.root / name / str(reply.version) / "policy.onnx").read_bytes()
                    sent = policy.state_dict()
                    weights = onnx_weights(served_file)
                    assert "log_std" in weights and all(np.array_equal(a, sent[k].numpy()) for k, a in weights.items())
                    assert gw.rollout.rollout(name).live == reply.version  # served and live, no other step
                return seconds, errors

    load = os.getloadavg()[0]
    all_seconds, errors = asyncio.run(scenario())
    load = max(load, os.getloadavg()[0])
    seconds = all_seconds[1:]
    print(f"publish -> served: median {statistics.median(seconds):.3f} s, max {max(seconds):.3f} s (first, warming "
          f"up: {all_seconds[0]:.3f} s); max abs error {max(errors):.2e}; load average {load:.1f}")
    assert statistics.median(seconds) < limit_s(load), (seconds, f"load average {load:.1f}")
    assert max(errors) <= SERVING_TOLERANCES["onnx"]["float32"][1], errors


def onnx_import(repo: ModelRepository, name: str, policy: GaussianPolicy, reference: GaussianPolicy,
                batch: np.ndarray) -> policies_pb2.PublishHeader:
    """`policy` exported to ONNX, published as an imported file whose reference outputs are `reference`'s."""
    outputs = GaussianPolicy.output_specs(Spec("action", np.float32, (1,), low=(-3.0,), high=(3.0,)))
    data = onnx_export.export(torch.jit.script(policy), OBS, outputs)
    header = policies_pb2.PublishHeader(
        policy=name, format="onnx", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
        inputs=[s.to_proto() for s in OBS], outputs=[s.to_proto() for s in outputs],
        probe_inputs=encode_all({"observation": batch}), probe_outputs=encode_all(probe_outputs(reference, batch)),
        lineage=policies_pb2.Lineage(parent_version=repo.versions(name)[-1], trainer="test"))
    return header, data


async def publish_a_wrong_then_the_right_export(gw, repo: ModelRepository, name: str):
    """Three publishes to a running gateway: the trainer's weights with one off by 1e-2 against the right
    weights' outputs, an ONNX file whose weights differ from the reference outputs it came with (both to be
    refused by the consistency check), then the right ONNX file (to pass: the tolerance is not what refused
    the wrong ones). Returns (live before, [the refusals], the accepted reply, live after)."""
    live, parent, batch = gw.rollout.rollout(name).live, repo.versions(name)[-1], probe(10)
    right = trained(repo, name, parent, seed=10)
    wrong = trained(repo, name, parent, seed=10)
    with torch.no_grad():  # one weight off by 1e-2: the mean moves by ~3e-4, 6x the ONNX tolerance
        wrong.net[0].weight[0, 0] += 1e-2
    refused = []
    with PoliciesClient(gw.address) as client:
        try:
            await asyncio.to_thread(client.publish, name, wrong.state_dict(), probe_inputs={"observation": batch},
                                    probe_outputs=probe_outputs(right, batch),
                                    lineage=policies_pb2.Lineage(parent_version=parent, trainer="test"))
        except grpc.RpcError as exc:
            refused.append(exc)
    async with PoliciesClient(gw.address, aio=True) as policies:
        header, data = onnx_import(repo, name, wrong, right, batch)
        try:
            await policies.publish_stream([policies_pb2.PublishChunk(header=header),
                                           policies_pb2.PublishChunk(data=data)])
        except grpc.aio.AioRpcError as exc:
            refused.append(exc)
        header, data = onnx_import(repo, name, right, right, batch)
        accepted = await policies.publish_stream([policies_pb2.PublishChunk(header=header),
                                                  policies_pb2.PublishChunk(data=data)])
    return live, refused, accepted, gw.rollout.rollout(name).live


def test_the_consistency_check_rejects_a_served_onnx_version_that_is_not_the_trainers(served):
    server, repo, name, publishing = served

    async def scenario():
        async with running_gateway(server.grpc_url, policy=name, **publishing) as gw:
            return await publish_a_wrong_then_the_right_export(gw, repo, name)

    live, refused, accepted, now = asyncio.run(scenario())
    assert len(refused) == 2, refused
    for exc in refused:
        assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION and "consistency" in exc.details(), exc.details()
    assert accepted.max_abs_error <= SERVING_TOLERANCES["onnx"]["float32"][1]
    assert now == accepted.version and accepted.version > live
