"""Weight sync through one persistent Triton model (`tether gateway --persistent-versions`): the learning loop's
ONNX versions are opened by `<policy>.versions` (inference_server/versions_model.py) at their first request, no
stub process per version. Each published version is served at exactly its trainer's weights, a wrong export is
still refused by the gate's consistency check, and after Triton is SIGKILLed and restarted the persistent model
serves the versions again from their files on disk."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import time

import grpc
import numpy as np
import pytest

from bridge.client import PoliciesClient
from bridge.common.processes import group_members
from bridge.gate.checks import SERVING_TOLERANCES
from bridge.gateway.config import GatewayConfig
from inference_server import InferenceError, ModelRepository, TritonServer
from inference_server.repository import versions_model_name
from protos import policies_pb2
from tests.gateway.test_weight_sync import ENV, limit_s, probe, publish_a_wrong_then_the_right_export, trained
from tests.support.gateways import running_gateway
from tests.support.waiting import until
from tether.initial_policy import write_initial_policy
from trainer.policy import probe_outputs

RTOL, ATOL = SERVING_TOLERANCES["onnx"]["float32"]  # the gate's onnxruntime tolerance: |d| <= atol + rtol * |want|


def close(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.all(np.abs(got - want) <= ATOL + RTOL * np.abs(want)))


def own_triton(repo: ModelRepository, name: str, **ports) -> TritonServer:
    """A Triton of its own (its processes are counted, or it is killed) loading only the persistent model, as
    `tether demo --train` starts it; not started."""
    return TritonServer(repo.root, models=[versions_model_name(name)], log_path=repo.root.parent / "triton.log",
                        **ports)


@pytest.fixture
def policy_repo(tmp_path):
    repo = ModelRepository(tmp_path / "models")
    name = write_initial_policy(repo, ENV, stochastic=True)  # the learning loop's policy: ONNX versions
    repo.write_versions_model(name)
    return repo, name


def publish(client: PoliciesClient, repo: ModelRepository, name: str, seed: int):
    parent = repo.versions(name)[-1]
    policy, batch = trained(repo, name, parent, seed=seed), probe(seed)
    reply = client.publish(name, policy.state_dict(), probe_inputs={"observation": batch},
                           probe_outputs=probe_outputs(policy, batch),
                           lineage=policies_pb2.Lineage(parent_version=parent, trainer_step=seed, trainer="test"))
    return reply, policy


def test_the_reserved_name_is_refused_as_a_policy():
    with pytest.raises(ValueError, match="reserved for the persistent models"):
        GatewayConfig(triton_url="127.0.0.1:1", policy="p.versions", model_repository="/tmp", persistent_versions=True)
    with pytest.raises(ValueError, match="reserved for the persistent model"):
        ModelRepository("/tmp").versions("p.versions")
    with pytest.raises(ValueError, match="needs --model-repository"):
        GatewayConfig(triton_url="127.0.0.1:1", policy="p", persistent_versions=True)


def test_each_version_is_served_at_exactly_its_weights_by_one_persistent_process(policy_repo):
    repo, name = policy_repo

    async def scenario(server):
        async with running_gateway(server.grpc_url, policy=name, model_repository=repo.root,
                                   persistent_versions=True) as gw:
            published, seconds = {}, []
            with PoliciesClient(gw.address) as client:
                for seed in range(4):
                    started = time.monotonic()
                    reply, policy = await asyncio.to_thread(publish, client, repo, name, seed)
                    seconds.append(time.monotonic() - started)
                    assert reply.max_abs_error <= ATOL, reply
                    assert gw.rollout.rollout(name).live == reply.version
                    published[reply.version] = policy
            batch = probe(99)
            kept = await gw.control.ready_versions(name)  # the versions still on disk (the others were retired)
            assert kept and max(kept) == max(published) and set(kept) <= {1, *published}, kept
            for version in kept:
                if version in published:  # each version's outputs are its own trainer's, not a neighbour's
                    got = await gw.control.infer(name, version, {"observation": batch}, ["action_mean"])
                    want = probe_outputs(published[version], batch)["action_mean"]
                    assert close(got["action_mean"], want), (version, np.abs(got["action_mean"] - want).max())
            outputs = [probe_outputs(p, batch)["action_mean"] for p in published.values()]
            assert not np.allclose(outputs[-1], outputs[-2], atol=1e-3)  # the versions do differ
            gone = min(published)  # retired (the rollout keeps the live and the previous live): refused, named
            assert gone not in kept and gone in repo.retired_versions(name), (kept, repo.retired_versions(name))
            with pytest.raises(InferenceError, match=f"version {gone} has no file"):
                await gw.control.infer(name, gone, {"observation": batch}, ["action_mean"])
            return seconds

    load = os.getloadavg()[0]
    with own_triton(repo, name) as server:
        seconds = asyncio.run(scenario(server))
        # tritonserver and one python-backend stub: no process was started per version
        assert len(group_members(server.pid)) == 2, group_members(server.pid)
    load = max(load, os.getloadavg()[0])
    print(f"persistent: publish -> served {[f'{s:.3f}' for s in seconds]} s (load {load:.1f})")
    assert statistics.median(seconds[1:]) < limit_s(load), seconds


def test_the_consistency_check_still_rejects_a_wrong_export(triton, tmp_path):
    name = triton.add_initial_policy(ENV, load=False)  # in the session's Triton: its persistent model only
    triton.server.load_model(triton.repo.write_versions_model(name))

    async def scenario():
        async with running_gateway(triton.url, policy=name, persistent_versions=True,
                                   **triton.publishing(tmp_path)) as gw:
            return await publish_a_wrong_then_the_right_export(gw, triton.repo, name)

    live, refused, accepted, now = asyncio.run(scenario())
    assert len(refused) == 2, refused
    for exc in refused:
        assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION and "consistency" in exc.details(), exc.details()
    assert accepted.max_abs_error <= ATOL and now == accepted.version > live


def test_after_triton_is_killed_and_restarted_the_persistent_model_serves_the_version_from_disk(policy_repo):
    repo, name = policy_repo
    server = own_triton(repo, name)
    server.start()
    try:
        async def scenario():
            nonlocal server
            async with running_gateway(server.grpc_url, policy=name, model_repository=repo.root,
                                       persistent_versions=True) as gw:
                with PoliciesClient(gw.address) as client:
                    reply, policy = await asyncio.to_thread(publish, client, repo, name, 3)
                batch = probe(7)
                want = probe_outputs(policy, batch)["action_mean"]
                got = await gw.control.infer(name, reply.version, {"observation": batch}, ["action_mean"])
                assert close(got["action_mean"], want)
                os.killpg(server.pid, signal.SIGKILL)  # tritonserver and its stub: nothing in memory survives
                ports = {"grpc_port": server.grpc_port, "http_port": server.http_port}
                server.stop()
                server = own_triton(repo, name, **ports)
                await asyncio.to_thread(server.start)
                async def served():  # the gateway's stream reconnects; the model opens the version's file again
                    with contextlib.suppress(Exception):
                        return await gw.control.infer(name, reply.version, {"observation": batch}, ["action_mean"])

                got = await until(served, "the restarted Triton serving the version", period=0.05)
                assert close(got["action_mean"], want), np.abs(got["action_mean"] - want).max()
                assert reply.version in await gw.control.ready_versions(name)

        asyncio.run(scenario())
    finally:
        server.stop()
