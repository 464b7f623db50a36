"""The gate against a real Triton, real gateways and real `tether sim` processes (InvertedPendulum-v5).

The evaluation sims are pinned to the version under test by the gateway's rollout controller
(`pin_session`); SimEvaluator checks from the sims' own summary that every evaluation action came
from the pinned version.
"""

from __future__ import annotations

import asyncio
import hashlib

import grpc
import numpy as np
import pytest
import safetensors.torch
import torch

from bridge.experience import read_transitions
from bridge.gate import EvaluationError, Gate, GateConfig, SimEvaluator
from inference_server import ModelRepository, PolicyClient, TritonServer
from protos import bridge_pb2, policies_pb2, policies_pb2_grpc
from sim.client import run_sessions
from sim.mujoco import make_env
from tests.gate.helpers import ACT, OBS, STABLE, Linear, probe_header
from tests.support.gateways import running_gateway
from trainer.policy import GaussianPolicy

ENV = "InvertedPendulum-v5"
STEPS = 40  # episode length of every sim here: the stabiliser's return is exactly 40


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate")
    repo = ModelRepository(root / "models")
    repo.write_version("pend", 1, Linear(STABLE), OBS, ACT)
    with TritonServer(repo.root, models=["pend"], log_path=root / "triton.log") as server:
        yield server, repo, root


def background_sims(address: str, stop: asyncio.Event, progress: dict) -> asyncio.Task:
    """A session acting on the live gateway until `stop` (the live version must keep serving it)."""
    return asyncio.create_task(run_sessions(
        address, lambda i: make_env(ENV, seed=100 + i, max_episode_steps=STEPS), envs=1, seconds=300,
        on_progress=lambda s: progress.update(steps=s.steps), until=lambda s: stop.is_set(), progress_every=0.05))


async def wait_for(condition, what: str, *, rounds: int = 1200) -> None:
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def publish(stub, weights: dict[str, torch.Tensor], reference: torch.nn.Module) -> policies_pb2.PublishReply:
    """Publish `weights` as the trainer does, with `reference`'s outputs on the probe batch."""
    data = safetensors.torch.save(weights)
    header = probe_header("pend", reference)
    header.size, header.sha256 = len(data), hashlib.sha256(data).hexdigest()
    header.lineage.CopyFrom(policies_pb2.Lineage(parent_version=1, trainer="test"))
    chunks = [policies_pb2.PublishChunk(header=header)]
    chunks += [policies_pb2.PublishChunk(data=data[i:i + 4096]) for i in range(0, len(data), 4096)]
    return await stub.Publish(iter(chunks))


def test_bad_candidates_are_rejected_naming_the_failing_check_while_the_live_version_serves(pendulum):
    """Through the gateway's own publish flow: integrity, consistency and evaluation each reject one."""
    server, repo, root = pendulum
    stable = torch.tensor([STABLE])
    gate = GateConfig(eval_env=ENV, eval_episodes=2, eval_max_steps=STEPS, eval_margin=0.1, sanity_samples=64)

    async def scenario():
        async with running_gateway(server.grpc_url, policy="pend", model_repository=repo.root,
                                   experience_dir=root / "experience", gate=gate) as gw:
            stop, progress = asyncio.Event(), {"steps": 0}
            sims = background_sims(gw.address, stop, progress)
            errors = {}
            try:
                await wait_for(lambda: progress["steps"] >= 100, "the live session's first 100 steps")
                steps_before = progress["steps"]
                async with grpc.aio.insecure_channel(gw.address) as channel:
                    stub = policies_pb2_grpc.PoliciesStub(channel)
                    candidates = {
                        "nan": ({"k": torch.tensor([[1.0, float("nan"), 1.0, 1.0]])}, Linear(STABLE)),
                        # a wrong export: the trainer computed with k, the file holds k / 2 (which balances too)
                        "wrong_export": ({"k": stable * 0.5}, Linear(STABLE)),
                        # the sign flip: exported faithfully, actions in bounds, but it drops the pole
                        "worse": ({"k": -stable}, Linear(tuple(-g for g in STABLE))),
                    }
                    for key, (weights, reference) in candidates.items():
                        with pytest.raises(grpc.aio.AioRpcError) as refused:
                            await publish(stub, weights, reference)
                        errors[key] = refused.value
                live_version = gw.catalog.current("pend").version
                steps_during_gate = progress["steps"] - steps_before
            finally:
                stop.set()
                stats = await sims
            records = {r.version: r for r in gw.registry.versions("pend")}
            ready = await gw.control.ready_versions("pend")
            return errors, records, stats, live_version, steps_during_gate, ready

    errors, records, stats, live_version, steps_during_gate, ready = asyncio.run(scenario())
    nan, wrong, worse = errors["nan"], errors["wrong_export"], errors["worse"]
    assert nan.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "integrity" in nan.details() and "weight 'k' has 1 non-finite values" in nan.details()
    assert wrong.code() == grpc.StatusCode.FAILED_PRECONDITION and "consistency" in wrong.details()
    assert worse.code() == grpc.StatusCode.FAILED_PRECONDITION and "evaluation" in worse.details()
    assert "worse than the incumbent" in worse.details()

    rejected = {v: r for v, r in records.items() if r.state == "rejected"}
    assert len(rejected) == 3 and records[1].state == "live"
    gates = [{c["name"]: c for c in r.gate} for _, r in sorted(rejected.items())]
    assert [sorted(n for n, c in g.items() if not c["passed"]) for g in gates] == [
        ["integrity"], ["consistency"], ["evaluation"]]
    consistency = gates[1]["consistency"]["figures"]
    assert consistency["max_abs_error"] > 0.01 and consistency["worst"] > 1
    assert gates[1]["evaluation"]["figures"]["candidate_mean"] == STEPS   # k / 2 keeps the pole up
    evaluation = gates[2]["evaluation"]["figures"]
    assert evaluation["incumbent_mean"] == STEPS and evaluation["candidate_mean"] < STEPS / 2
    assert evaluation["episodes"] == 2 and gates[2]["consistency"]["figures"]["max_abs_error"] < 1e-5
    integrity_s = gates[0]["integrity"]["figures"]["seconds"]  # 4 weights: may round to 0.0, never above the sims'
    assert evaluation["seconds"] > 0 and 0 <= integrity_s < evaluation["seconds"], (integrity_s, evaluation)
    sanity = gates[2]["action_sanity"]            # real recorded observations; actions clamped to the bounds
    assert sanity["passed"] and sanity["figures"]["samples"] > 50 and sanity["figures"]["out_of_bounds"] == 0
    assert sanity["figures"]["bounded"] == 1.0    # judged against the bounds the sims declared in their Hello
    sessions = {t.session for t in read_transitions(root / "experience")}
    assert sessions and not [s for s in sessions if s.startswith("gate-")]  # evaluation episodes are no data

    # the live version kept serving throughout: every action of the live session came from v1, no errors;
    # the refused versions were withdrawn from Triton
    assert live_version == 1 and set(stats.policy_versions) == {1} and not stats.errors
    assert steps_during_gate > 0 and stats.steps >= 100   # it kept acting while the gate ran the sims
    assert ready == [1]


def test_the_gate_on_served_versions_consistency_and_actions_leaving_the_bounds(pendulum, tmp_path):
    """Gate.check_served without the rollout: each version is addressed exactly in Triton."""
    server, repo, _ = pendulum
    wild_gains = tuple(50 * g for g in STABLE)

    async def scenario():
        client, version = PolicyClient(server.grpc_url, timeout_s=30.0), None
        try:
            async with running_gateway(server.grpc_url, policy="pend", experience_dir=tmp_path / "experience") as gw:
                empty = await Gate(client=client, experience_dir=tmp_path / "experience", evaluator=None,
                                   config=GateConfig()).action_sanity("pend", 1, ACT)   # the log exists, still empty
                await run_sessions(gw.address, lambda i: make_env(ENV, seed=i, max_episode_steps=STEPS), envs=2,
                                   steps=150)
            # the gateway has closed its log: every check below reads the same 100 newest observations
            version = max(repo.versions("pend") + repo.retired_versions("pend")) + 1
            repo.write_version("pend", version, Linear(wild_gains, limit=1e6), OBS, ACT)
            await client.load_model("pend")
            config = GateConfig(sanity_samples=100, max_jerk=0.5)
            gate = Gate(client=client, experience_dir=tmp_path / "experience", evaluator=None, config=config)
            wild = await gate.check_served(policy="pend", version=version, incumbent=1, action_spec=ACT,
                                           header=probe_header("pend", Linear(wild_gains, limit=1e6)))
            stale = await gate.consistency("pend", version, probe_header("pend", Linear(STABLE)))
            good = await gate.check_served(policy="pend", version=1, incumbent=None, action_spec=ACT,
                                           header=probe_header("pend", Linear(STABLE)))
            strict = Gate(client=client, experience_dir=tmp_path / "experience", evaluator=None,
                          config=GateConfig(sanity_samples=100, max_jerk=1e-6))
            jerky = await strict.action_sanity("pend", 1, ACT)
        finally:
            if version is not None:  # out of Triton again: other tests see v1 only
                repo.retire("pend", version)
                await client.load_model("pend")
            await client.close()
        return empty, wild, stale, good, jerky

    empty, wild, stale, good, jerky = asyncio.run(scenario())
    assert empty.is_skipped and "no observations of policy 'pend'" in empty.detail
    assert [c.name for c in wild] == ["consistency", "action_sanity", "evaluation"]
    consistency, sanity, evaluation = wild
    assert consistency.passed and consistency.figures["max_abs_error"] < 1e-4      # faithfully exported, but
    assert not sanity.passed and sanity.figures["out_of_bounds"] > 0 and "leaves its bounds" in sanity.detail
    assert evaluation.is_skipped and "no eval env" in evaluation.detail
    assert not stale.passed and "stale weights" in stale.detail   # v1's outputs are not what this version serves
    assert all(c.passed for c in good) and good[0].figures["max_abs_error"] < 1e-5
    sanity = good[1]
    assert sanity.figures["samples"] == 100 and sanity.figures["out_of_bounds"] == 0
    assert 0 < sanity.figures["max_jerk"] <= 0.5 and sanity.figures["pairs"] >= 90   # consecutive steps of episodes
    assert not jerky.passed and "max jerk" in jerky.detail and jerky.figures["max_jerk"] == sanity.figures["max_jerk"]


def test_sim_evaluator_refuses_a_run_the_gateway_did_not_pin(pendulum):
    server, _, _ = pendulum

    async def scenario():
        async with running_gateway(server.grpc_url, policy="pend") as gw:
            ignored = SimEvaluator(address=gw.address, env=ENV, pin=lambda s, v: None, unpin=lambda s: None,
                                   seed=0, max_steps=10)
            with pytest.raises(EvaluationError, match="acted with versions \\[1\\], not only v7"):
                await ignored.returns("pend", 7, 1)

    asyncio.run(scenario())


def test_an_episode_budget_splits_over_named_sessions_and_replays_the_same_episodes(pendulum, tmp_path):
    """What SimEvaluator relies on: `--episodes K` over N sessions "<prefix>-i", seeded episodes replayed."""
    server, _, _ = pendulum

    async def scenario():
        async with running_gateway(server.grpc_url, policy="pend", experience_dir=tmp_path / "experience") as gw:
            return [await run_sessions(gw.address, lambda i: make_env(ENV, seed=5 + i, max_episode_steps=10),
                                       envs=2, episodes=3, session_prefix=run) for run in ("one", "two")]

    runs = asyncio.run(scenario())
    assert [(s.episodes, len(s.returns), s.cut_episodes, s.sessions) for s in runs] == [(3, 3, 0, 2)] * 2
    firsts: dict[str, dict[int, bytes]] = {}
    for t in read_transitions(tmp_path / "experience"):
        if t.step_type == bridge_pb2.FIRST:
            firsts.setdefault(t.session, {})[t.episode] = t.observation[0].data
    assert sorted(firsts) == ["one-0", "one-1", "two-0", "two-1"]
    assert {s: len(e) for s, e in firsts.items()} == {"one-0": 2, "one-1": 1, "two-0": 2, "two-1": 1}
    assert firsts["one-0"] == firsts["two-0"] and firsts["one-1"] == firsts["two-1"]   # the same seeds
    assert firsts["one-0"][0] != firsts["one-0"][1] != firsts["one-1"][0]


def test_a_stochastic_policy_is_judged_on_its_mean_action(pendulum, tmp_path):
    """PPO's GaussianPolicy samples around a mean squashed into the bounds; its samples leave them."""
    server, repo, _ = pendulum
    policy = GaussianPolicy(OBS[0], ACT[0], log_std_init=1.0, seed=0)   # std e: many samples beyond +-3
    repo.write_version("gauss", 1, policy, OBS, GaussianPolicy.output_specs(ACT[0]))

    async def scenario():
        client = PolicyClient(server.grpc_url, timeout_s=30.0)
        try:
            await client.load_model("gauss")
            async with running_gateway(server.grpc_url, policy="gauss", experience_dir=tmp_path / "experience") as gw:
                await run_sessions(gw.address, lambda i: make_env(ENV, seed=i, max_episode_steps=STEPS), envs=1,
                                   steps=100)
            gate = Gate(client=client, experience_dir=tmp_path / "experience", evaluator=None,
                        config=GateConfig(sanity_samples=64))
            # the action spec as the rollout passes it: every served output but log_prob
            sanity = await gate.action_sanity("gauss", 1, (ACT[0], GaussianPolicy.output_specs(ACT[0])[2]))
            sampled = await client.infer("gauss", 1, {"observation": np.zeros((64, 4), np.float32)}, ["action"])
            return sanity, sampled["action"]
        finally:
            await client.close()

    sanity, sampled = asyncio.run(scenario())
    assert np.abs(sampled).max() > 3      # the served samples do leave the bounds...
    assert sanity.passed and sanity.figures["samples"] == 64 and sanity.figures["out_of_bounds"] == 0
    assert "judged on the means ['action_mean']" in sanity.detail   # ...the policy's means do not
    assert sanity.figures["bounded"] == 0.5                           # action_mean's spec declares no bounds
