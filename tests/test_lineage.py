"""SFT then RL, with the lineage in the registry, on real components: a scripted controller's demonstrations
logged through the gateway -> `tether train --algo bc` publishes version B (lineage algo "bc"), which goes live
through the normal path (direct rollout: the gate passed, live) -> `tether train --algo ppo` starts from the
served B while the sims act with it and publishes versions whose parent chain reaches B (algo "ppo") -> after a
gateway restart the registry on disk still tells the chain (RolloutStatus and List)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys

import grpc
import pytest

from bridge.common.processes import spawn
from protos import policies_pb2, policies_pb2_grpc
from sim.client import run_sessions
from sim.mujoco import make_env
from tests.support.waiting import wait_until
from tests.test_behaviour_cloning import controller
from tether.rollout_cli import lineage_chain
from tether.stack import Stack

pytestmark = pytest.mark.slow
ENV, POLICY = "InvertedPendulum-v5", "invertedpendulum_v5"


def rollout_status(gateway: str) -> policies_pb2.RolloutStatusReply:
    with grpc.insecure_channel(gateway) as channel:
        return policies_pb2_grpc.PoliciesStub(channel).RolloutStatus(
            policies_pb2.RolloutStatusRequest(policy=POLICY), timeout=30)


def listing(gateway: str) -> policies_pb2.PolicyList:
    with grpc.insecure_channel(gateway) as channel:
        return policies_pb2_grpc.PoliciesStub(channel).List(policies_pb2.ListRequest(policy=POLICY), timeout=30)


def train(gateway: str, algo: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "tether", "train", "--algo", algo, "--gateway", gateway, "--policy", POLICY,
            "--nproc", "1", "--seed", "0", *args]


def chain_of(versions: dict[int, policies_pb2.PolicyVersion], version: int
             ) -> list[tuple[int, str]]:
    """(version, algo) from `version` back through its parents."""
    out = []
    while version in versions and version not in {v for v, _ in out}:
        out.append((version, versions[version].lineage.algo))
        version = versions[version].lineage.parent_version
    return out


@pytest.mark.timeout(360)
def test_bc_then_ppo_lineage_is_recorded_in_the_registry_and_survives_a_gateway_restart(tmp_path):
    log_dir = tmp_path / "experience"
    with Stack(tmp_path, envs=[ENV], stochastic=True,
               gateway_args=["--experience-dir", str(log_dir), "--deadline-ms", "2000", "--switch", "step"]) as stack:
        demo = asyncio.run(run_sessions(stack.gateway, lambda i: make_env(ENV, seed=i), envs=4, steps=2000,
                                        controller=controller))
        assert demo.steps == 2000 and not demo.errors
        bc = subprocess.run(train(stack.gateway, "bc", "--experience-dir", str(log_dir), "--steps", "100",
                                  "--lr", "3e-3", "--summary", str(tmp_path / "bc.json")),
                            capture_output=True, text=True, timeout=300)
        assert bc.returncode == 0, bc.stderr[-3000:]
        b = json.loads((tmp_path / "bc.json").read_text())["published_version"]
        versions = {v.version: v for v in rollout_status(stack.gateway).versions}
        assert versions[b].state == "live", versions[b]   # B went live the normal way before PPO starts from it
        assert (versions[b].lineage.algo, versions[b].lineage.parent_version) == ("bc", 1), versions[b].lineage
        start = versions[b].lineage.data_offset  # PPO learns from what comes after the demonstrations

        ppo_cmd = train(stack.gateway, "ppo", "--from-offset", str(start), "--batch", "256", "--epochs", "2",
                        "--minibatches", "2", "--steps", "3", "--summary", str(tmp_path / "ppo.json"))
        with open(tmp_path / "ppo.log", "w") as log:
            ppo = spawn(ppo_cmd, stdout=log, stderr=subprocess.STDOUT)
            try:  # the sims act with what is served (B, then PPO's versions) until the trainer is done
                acted = asyncio.run(run_sessions(stack.gateway, lambda i: make_env(ENV, seed=10 + i), envs=4,
                                                 seconds=240, until=lambda _: ppo.poll() is not None))
                ppo.wait(60)
            finally:
                if ppo.poll() is None:
                    ppo.kill()
        assert ppo.returncode == 0, (tmp_path / "ppo.log").read_text()[-3000:]
        summary = json.loads((tmp_path / "ppo.json").read_text())
        assert summary["parent_version"] == b and summary["published_versions"], summary
        assert b in acted.policy_versions, acted.policy_versions   # PPO's data came from B (and its successors)
        newest = summary["published_versions"][-1]

        before = rollout_status(stack.gateway)
        address = stack.restart_gateway()
        def answers():  # the restarted gateway answers once its registry and repository are read back
            with contextlib.suppress(grpc.RpcError):
                return rollout_status(address), listing(address)

        after, listed = wait_until(answers, "the restarted gateway answering", timeout=60, period=0.2)

    for reply in (before, after):
        versions = {v.version: v for v in reply.versions}
        for v in summary["published_versions"]:
            chain = chain_of(versions, v)
            assert chain[0] == (v, "ppo") and (b, "bc") in chain and chain[-1] == (1, ""), chain
        assert lineage_chain(reply.versions, versions[newest]).startswith("ppo <- v"), lineage_chain(
            reply.versions, versions[newest])
    listed_versions = {v.version: v for v in listed.versions}  # List: the versions loaded, each with its lineage
    assert listed_versions[newest].lineage == versions[newest].lineage, listed_versions[newest]
