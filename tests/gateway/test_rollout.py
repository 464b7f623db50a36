"""Staged rollout with a real Triton, a real gateway and sessions running: shadow -> canary -> live,
an automatic rollback of a regressed canary, and a restart that restores it all."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import sys

import grpc
import numpy as np
import pytest

from bridge.gateway.rollout.config import RolloutPlan
from bridge.gateway.versions.verify import Fingerprint, SwapFailed
from bridge.registry import State, Thresholds
from inference_server import ModelRepository
from protos import bridge_pb2, policies_pb2, policies_pb2_grpc
from protos.codec import encode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.gateway.rollout_helpers import Fleet, publish, variant
from tests.support.gateways import running_gateway
from tests.support.waiting import until
from trainer.policy import MLPPolicy

THRESHOLDS = Thresholds(min_episodes=3, min_steps=12, max_latency_p99_ratio=1e6)  # latency: a shared box jitters
STAGED = RolloutPlan(mode="staged", shadow_steps=12, canary_labels={"robot": "a"}, canary_episodes=4,
                     thresholds=THRESHOLDS, tick_s=0.05)
LABELS = [{"robot": "a"}, {"robot": "a"}, {"robot": "b"}, {"robot": "b"}]
MAX_ROUNDS = 60


def gateway(triton, folder, policy: str, **config):
    """A gateway on the session's Triton publishing into its repository, its registry in `folder` (a restart with the
    same folder reads it back); a patient start: this shared machine stalls."""
    return running_gateway(triton.url, triton_timeout_s=60, policy=policy, **triton.publishing(folder), **config)


@contextlib.asynccontextmanager
async def publishing(triton, folder, policy: str, **config):
    """`gateway(...)` and a Policies stub on it: (gw, stub)."""
    async with gateway(triton, folder, policy, **config) as gw, grpc.aio.insecure_channel(gw.address) as channel:
        yield gw, policies_pb2_grpc.PoliciesStub(channel)


def states(gw, policy: str) -> dict[int, str]:
    return {r.version: str(r.state) for r in gw.registry.versions(policy)}


def history(gw, policy: str, version: int) -> list[str]:
    return [e.to_state for e in gw.registry.events(policy) if e.kind == "state" and e.version == version]


async def drive_until(fleet: Fleet, done, what: str) -> int:
    for rounds in range(1, MAX_ROUNDS + 1):
        await fleet.round()
        assert not fleet.errors, fleet.errors[:3]
        if done():
            return rounds
    raise AssertionError(f"{what} did not happen within {MAX_ROUNDS} rounds of episodes")


def test_staged_shadow_canary_live_with_sessions_running(triton, tmp_path):
    v1 = triton.add_policy("staged")

    async def scenario():
        async with publishing(triton, tmp_path, "staged", rollout=STAGED, switch="step") as (gw, stub):
            async with Fleet(gw, "staged", LABELS) as fleet:
                await fleet.round()
                reply = await publish(stub, "staged", variant(v1, scale=1.05))
                assert reply.version == 2 and states(gw, "staged")[2] == "shadow"
                fresh = gw.rollout.freshness()
                assert fresh["policies"]["staged"]["newest"] == 2 and fresh["policies"]["staged"]["sessions"] == 4
                assert all(row["version_lag"] == 1 and row["time_lag_s"] >= 0 for row in fresh["sessions"].values())
                await drive_until(fleet, lambda: gw.rollout.rollouts()["staged"].canary == 2, "shadow -> canary")
                shadow = gw.rollout.version_stats("staged")[2]
                assert shadow["shadow_steps"] >= 12 and shadow["shadow_divergence"] > 0
                await drive_until(fleet, lambda: gw.rollout.rollouts()["staged"].live == 2, "canary -> live")
                await fleet.round()
            canary = [vs for vs, labels in zip(fleet.versions, LABELS, strict=True) if labels["robot"] == "a"]
            others = [vs for vs, labels in zip(fleet.versions, LABELS, strict=True) if labels["robot"] == "b"]
            assert all(2 in vs for vs in canary) and all(vs[-1] == 2 for vs in fleet.versions)
            first_v2 = [vs.index(2) for vs in others]
            last_v1_in_canary = [len(vs) - 1 - vs[::-1].index(1) for vs in canary]
            # robot=b met v2 only once it was live: after every canary session had left v1 for good
            # (the rounds keep the sessions in step, so step indices compare across sessions)
            assert min(first_v2) > max(last_v1_in_canary) >= 0, (first_v2, last_v1_in_canary)
            assert history(gw, "staged", 2) == ["candidate", "gated", "shadow", "canary", "live"]
            assert states(gw, "staged") == {1: "retired", 2: "live"}
            gate = gw.registry.get("staged", 2).gate
            assert {c["name"] for c in gate} >= {"integrity", "consistency"} and all(c["passed"] for c in gate)
            stats = gw.rollout.version_stats("staged")
            assert stats[2]["steps"] > 0 and stats[2]["errors"] == 0 and stats[1]["errors"] == 0
            status = await stub.RolloutStatus(policies_pb2.RolloutStatusRequest(policy="staged", events=50))
            assert status.rollout.live == 2 and status.rollout.previous_live == 1 and status.rollout.mode == "staged"
            assert [v.state for v in status.versions] == ["retired", "live"]
            assert any(e.to_state == "live" and e.who == "auto" for e in status.events)
            assert status.freshness.newest == 2

    asyncio.run(scenario())


def test_a_regressed_canary_rolls_back_automatically_and_restart_restores(triton, tmp_path):
    v1 = triton.add_policy("regress")

    async def scenario():
        config = dict(rollout=STAGED, switch="episode")
        async with publishing(triton, tmp_path, "regress", **config) as (gw, stub):
            async with Fleet(gw, "regress", LABELS) as fleet:
                await fleet.round()
                reply = await publish(stub, "regress", variant(v1, flip=True))   # gate passes: probe matches
                assert reply.version == 2
                await drive_until(fleet, lambda: states(gw, "regress")[2] == "rolled_back", "the rollback")
                await fleet.round()
            assert all(vs[-1] == 1 for vs in fleet.versions)
            event = [e for e in gw.registry.events("regress") if e.version == 2 and e.to_state == "rolled_back"][-1]
            assert event.who == "auto" and event.why.startswith("canary regressed: episode return")
            assert gw.rollout.rollouts()["regress"].canary is None
            async def v2_unloaded() -> bool:  # the loop unloads it once no session acts with it
                return 2 not in await gw.control.ready_versions("regress")

            await until(v2_unloaded, "v2 unloaded", timeout=10, period=0.05)
            assert await gw.control.ready_versions("regress") == [1]
            await stub.Pin(policies_pb2.PinRequest(policy="regress", selector="robot=b", version=1, why="hold b"),
                           metadata=(("x-tether-operator", "alice"),))
            before = await gw.control.ready_versions("regress")
        async with gateway(triton, tmp_path, "regress", **config) as gw:   # a restart: same registry file
            rollout = gw.rollout.rollouts()["regress"]
            assert rollout.live == 1 and rollout.pins == {"robot=b": 1} and rollout.canary is None
            assert states(gw, "regress") == {1: "live", 2: "rolled_back"}
            assert await gw.control.ready_versions("regress") == before
            pin = [e for e in gw.registry.events("regress") if e.kind == "pin"][-1]
            assert pin.who == "operator:alice" and pin.why == "hold b"

    asyncio.run(scenario())


def test_a_canary_the_edge_guard_keeps_clamping_rolls_back(triton, tmp_path):
    """Returns as good as the live version's, but the edge guard intervenes on every canary step."""
    v1 = triton.add_policy("guard")

    async def scenario():
        async with publishing(triton, tmp_path, "guard", rollout=STAGED, switch="step") as (gw, stub):
            async with Fleet(gw, "guard", LABELS, clamped_by=2) as fleet:
                await fleet.round()
                await publish(stub, "guard", variant(v1, scale=1.02))
                await drive_until(fleet, lambda: states(gw, "guard")[2] == "rolled_back", "the rollback")
            event = [e for e in gw.registry.events("guard") if e.version == 2 and e.to_state == "rolled_back"][-1]
            assert event.who == "auto" and "guard interventions" in event.why and "episode return" not in event.why
            canary = gw.rollout.version_stats("guard")[2]  # every canary step clamped; a session's last clamp is
            assert canary["guard_interventions"] >= canary["steps"] - 2 >= THRESHOLDS.min_steps - 2  # reported
            # with its next step, and the 2 canary sessions (robot=a) may not have sent theirs at the rollback

    asyncio.run(scenario())


def test_a_version_an_operator_put_live_that_regresses_rolls_back_to_the_previous(triton, tmp_path):
    v1 = triton.add_policy("liveback")
    slow = RolloutPlan(mode="staged", shadow_steps=10**6, thresholds=THRESHOLDS, tick_s=0.05)

    async def scenario():
        async with publishing(triton, tmp_path, "liveback", rollout=slow, switch="step") as (gw, stub):
            async with Fleet(gw, "liveback", LABELS) as fleet:
                await fleet.round()
                await publish(stub, "liveback", variant(v1, flip=True))
                await stub.Promote(policies_pb2.PromoteRequest(policy="liveback", version=2, to="live", why="hurry"))
                await drive_until(fleet, lambda: states(gw, "liveback")[2] == "rolled_back", "the rollback")
                await fleet.round()
            assert all(vs[-1] == 1 for vs in fleet.versions) and gw.rollout.rollouts()["liveback"].live == 1
            event = [e for e in gw.registry.events("liveback") if e.to_state == "rolled_back"][-1]
            assert event.who == "auto" and event.why.startswith("live regressed: episode return")
            restored = [e for e in gw.registry.events("liveback") if e.version == 1 and e.to_state == "live"][-1]
            assert restored.from_state == "retired" and "v2 rolled_back" in restored.why

    asyncio.run(scenario())


def test_operator_rollback_needs_a_previous_live_and_names_the_refusal(triton, tmp_path):
    triton.add_policy("manual")

    async def scenario():
        async with publishing(triton, tmp_path, "manual") as (gw, stub):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Rollback(policies_pb2.RollbackRequest(policy="manual", why="try"))
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "no previous live version" in refused.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await stub.Promote(policies_pb2.PromoteRequest(policy="manual", version=1, to="famous"))
            assert "state 'famous'" in bad.value.details()
            assert gw.registry.get("manual", 1).state is State.LIVE
            start = [e for e in gw.registry.events("manual") if e.to_state == "live"]
            assert [(e.version, e.who, e.why) for e in start] == [(1, "gateway", "serving at start")]

    asyncio.run(scenario())


def test_restart_restores_canary_shadow_and_pins_and_triton_serves_the_same(triton, tmp_path):
    """Operator steps (no sessions, so nothing advances by itself): v2 canary at 30 %, v3 shadow, a pin."""
    v1 = triton.add_policy("restart")
    slow = RolloutPlan(mode="staged", shadow_steps=10**6, canary_episodes=10**6, thresholds=THRESHOLDS)

    async def scenario():
        async with publishing(triton, tmp_path, "restart", rollout=slow) as (gw, stub):
            await publish(stub, "restart", variant(v1, scale=1.1))
            request = policies_pb2.PromoteRequest(policy="restart", version=2, to="canary", canary_fraction=0.3)
            status = await stub.Promote(request)
            assert status.rollout.canary == 2 and status.rollout.canary_fraction == pytest.approx(0.3)
            await publish(stub, "restart", variant(v1, scale=1.2))
            status = await stub.Pin(policies_pb2.PinRequest(policy="restart", selector="session=x", version=2, why="x"))
            before, ready = gw.rollout.rollouts()["restart"], await gw.control.ready_versions("restart")
            assert (before.live, before.canary, before.shadow, ready) == (1, 2, 3, [1, 2, 3])
        async with gateway(triton, tmp_path, "restart", rollout=slow) as gw:
            assert gw.rollout.rollouts()["restart"] == before
            assert await gw.control.ready_versions("restart") == ready
            assert states(gw, "restart") == {1: "live", 2: "canary", 3: "shadow"}
            assert gw.rollout.acting("restart", "x", {}).version == 2

    asyncio.run(scenario())


async def tether(*args: str) -> tuple[int, str]:
    """The real `tether` command in a subprocess (the gateway keeps serving in this event loop)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tether", *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    return proc.returncode, out.decode()


def test_cli_round_trip_list_rollback_pin_canary(triton, tmp_path):
    v1 = triton.add_policy("cli")

    async def scenario():
        async with publishing(triton, tmp_path, "cli") as (gw, stub):
            assert (await publish(stub, "cli", variant(v1, scale=0.9))).version == 2
            common = ("--gateway", gw.address, "--policy", "cli", "--operator", "bob")
            code, out = await tether("rollout", "list", *common)
            assert code == 0, out
            assert re.search(r"^v1\s+retired\s", out, re.M) and re.search(r"^v2\s+live\s+0\s+pass", out, re.M), out
            assert "live v2 (previous v1)" in out and "-> live  by auto: rollout direct" in out
            code, out = await tether("rollout", "rollback", *common, "--why", "jerky on arm_2")
            assert code == 0 and "live v1 (previous v-)" in out, out
            assert states(gw, "cli") == {1: "live", 2: "rolled_back"}
            code, out = await tether("rollout", "pin", *common, "session=arm_2", "1", "--why", "hold")
            assert code == 0 and "pins: session=arm_2 -> v1" in out, out
            code, out = await tether("rollout", "canary", *common, "--fraction", "0.5", "--why", "half")
            assert code == 0 and gw.rollout.rollouts()["cli"].canary_fraction == 0.5, out
            code, out = await tether("rollout", "promote", *common, "2", "--to", "live", "--why", "again")
            assert code != 0 and "v2 is rolled_back; it may not move to live" in out, out
            events = [e for e in gw.registry.events("cli") if e.who == "operator:bob"]
            assert [e.kind for e in events] == ["state", "state", "pin", "canary"]
            assert events[0].why == "jerky on arm_2"

    asyncio.run(scenario())


def test_stale_weights_behind_a_version_number_are_caught(triton, tmp_path):
    """The output fingerprint: Triton still serves the old weights of v1 while the file says otherwise."""
    triton.add_policy("stale")

    async def scenario():
        async with gateway(triton, tmp_path, "stale") as gw:
            served_v1 = await gw.catalog.ensure("stale", 1)
            repo = triton.repo
            assert await Fingerprint(gw.control).verify(repo, served_v1)   # agrees: figures per output
            other = ModelRepository(tmp_path / "other")
            other.write_version("stale", 1, MLPPolicy(OBS[0], ACT[0], seed=5), OBS, ACT)
            shutil.copyfile(other.root / "stale" / "1" / "policy.pt", repo.root / "stale" / "1" / "policy.pt")
            with pytest.raises(SwapFailed, match="stale or wrong weights are served"):
                await Fingerprint(gw.control).verify(repo, served_v1)

    asyncio.run(scenario())


def test_a_vectorised_session_is_shadowed_and_follows_a_label_pin(triton, tmp_path):
    v1 = triton.add_policy("vec")
    slow = RolloutPlan(mode="staged", shadow_steps=10**6, thresholds=THRESHOLDS)
    rows = np.random.default_rng(2).standard_normal((3, 11)).astype(np.float32)

    async def scenario():
        async with publishing(triton, tmp_path, "vec", rollout=slow) as (gw, stub):
            h = hello("vec-0", obs=OBS, act=ACT, policy="vec")
            h.num_envs, h.labels["robot"] = 3, "a"
            async with RawSession(gw.address, h) as s:
                async def step(t: int) -> int:
                    obs = bridge_pb2.Observation(step=t, tensors=[encode("observation", rows)],
                                                 env_step_types=[bridge_pb2.FIRST if t == 0 else bridge_pb2.MID] * 3)
                    await s.call.write(bridge_pb2.ClientMessage(observation=obs))
                    reply = await s.call.read()
                    assert reply.WhichOneof("kind") == "action" and len(reply.action.env_errors) == 0, reply
                    return reply.action.policy_version

                assert await step(0) == 1
                await publish(stub, "vec", variant(v1, scale=1.1))
                assert {await step(t) for t in range(1, 6)} == {1}
                await until(lambda: gw.rollout.version_stats("vec")[2]["shadow_steps"] >= 5,  # in tasks of their own
                            "the shadow's last inferences", timeout=5, period=0.05)
                shadow = gw.rollout.version_stats("vec")[2]
                assert shadow["shadow_steps"] >= 5 and shadow["shadow_divergence"] > 0 and shadow["steps"] == 0
                await stub.Pin(policies_pb2.PinRequest(policy="vec", selector="robot=a", version=2, why="try a"))
                assert await step(6) == 2

    asyncio.run(scenario())
