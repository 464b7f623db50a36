"""No lock or blocking call stands between an operator and the fleet (issue 14, point 6): a real
gateway on a real Triton, over real gRPC, whose gate evaluation is held on an event the test
controls (a stand-in for tens of seconds of simulation). While it is held, Rollback, Promote, Pin,
SetCanary, RolloutStatus and the fleet's e-stop and release answer within a second, and the judging
loop rolls back a regressing canary; afterwards the publish does not promote a version judged
against one that was rolled back meanwhile. Publishes past the caps are refused with
RESOURCE_EXHAUSTED; a flood of bad tokens costs one scrypt per distinct token."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from bridge.gate import GateConfig
from bridge.gateway.rollout.config import RolloutPlan
from bridge.gateway.versions.publisher import PublishLimits
from bridge.registry import Thresholds
from bridge.security.tokens import TokenStore
from protos import fleet_pb2, fleet_pb2_grpc, policies_pb2, policies_pb2_grpc
from tests.gateway.rollout_helpers import Fleet, publish, variant
from tests.support.gateways import running_gateway

ANSWER_S = 1.0  # each call also has a 30 s deadline: behind the old lock it would wait for the whole gate
HELD = GateConfig(eval_env="Held-v0", eval_episodes=2)  # evaluation runs (the evaluator is the stand-in below)


class HeldEvaluator:
    """The gate's evaluation as the gateway drives it (the session pinned through the rollout, then
    unpinned), held at `hold_version` until the test sets `release`."""

    def __init__(self, rollout):
        self.rollout = rollout
        self.hold_version: int | None = None
        self.entered, self.release = asyncio.Event(), asyncio.Event()
        self.calls: list[int] = []

    async def returns(self, policy: str, version: int, episodes: int) -> list[float]:
        self.calls.append(version)
        session = f"gate-{policy}-v{version}"
        await self.rollout.pin_session(session, version)  # takes the rollout lock, as a real evaluation does
        try:
            if version == self.hold_version:
                self.entered.set()
                await self.release.wait()
        finally:
            await self.rollout.unpin_session(session)
        return [1.0] * episodes


def gateway(triton, folder, policy: str, **config):
    """On the session's Triton, publishing into its repository with a registry of its own in `folder`."""
    return running_gateway(triton.url, triton_timeout_s=60, policy=policy, **triton.publishing(folder), gate=HELD,
                           **config)


async def timed(call) -> tuple[float, object]:
    started = time.monotonic()
    result = await call
    return time.monotonic() - started, result


async def held_publish(gw, stub, evaluator, module, version: int, **kw) -> asyncio.Task:
    """A publish of `version` whose evaluation is held: returns once the gate is inside the evaluation."""
    evaluator.hold_version = version
    evaluator.entered.clear()
    task = asyncio.ensure_future(publish(stub, gw.config.policy, variant(module, scale=1.2), **kw))
    waiter = asyncio.ensure_future(evaluator.entered.wait())
    done, _ = await asyncio.wait({task, waiter}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
    assert waiter in done, f"the publish of v{version} never reached its evaluation: {task}"
    return task


def test_operators_are_answered_within_a_second_while_a_publish_is_gated(triton, tmp_path):
    module = triton.add_policy("heldgate")

    async def scenario():
        async with gateway(triton, tmp_path, "heldgate") as gw, grpc.aio.insecure_channel(gw.address) as channel:
            evaluator = gw.rollout.gate.evaluator = HeldEvaluator(gw.rollout)
            stub, fleet = policies_pb2_grpc.PoliciesStub(channel), fleet_pb2_grpc.FleetStub(channel)
            evaluator.release.set()
            assert (await publish(stub, "heldgate", variant(module, scale=1.1))).version == 2  # direct: v2 live
            assert gw.rollout.rollouts()["heldgate"].live == 2 and evaluator.calls == [2, 1]
            evaluator.release.clear()
            task = await held_publish(gw, stub, evaluator, module, 3)
            assert gw.registry.get("heldgate", 3).state.value == "candidate"
            alice = (("x-tether-operator", "alice"),)
            seconds = {}
            seconds["rollback"], status = await timed(stub.Rollback(
                policies_pb2.RollbackRequest(policy="heldgate", why="v2 regresses"), metadata=alice, timeout=30))
            assert status.rollout.live == 1 and status.rollout.previous_live == 0
            seconds["pin"], status = await timed(stub.Pin(
                policies_pb2.PinRequest(policy="heldgate", selector="robot=arm_2", version=1, why="hold"),
                metadata=alice, timeout=30))
            assert status.rollout.pins["robot=arm_2"] == 1
            seconds["canary"], _ = await timed(stub.SetCanary(
                policies_pb2.CanaryRequest(policy="heldgate", fraction=0.5, why="half"), metadata=alice, timeout=30))
            seconds["status"], status = await timed(stub.RolloutStatus(
                policies_pb2.RolloutStatusRequest(policy="heldgate", events=5), timeout=30))
            assert len(status.events) == 5 and status.events[-1].kind == "canary"
            assert [e.id for e in status.events] == [e.id for e in gw.registry.events("heldgate", limit=10_000)[-5:]]
            seconds["estop"], _ = await timed(fleet.EStop(fleet_pb2.EStopRequest(all=True, reason="drill"),
                                                          metadata=alice, timeout=30))
            seconds["release"], _ = await timed(fleet.Release(fleet_pb2.EStopRequest(all=True, reason="drill over"),
                                                              metadata=alice, timeout=30))
            assert not task.done(), "the evaluation was released before the test said so"
            print("answered during a held gate (s):", {k: round(v, 3) for k, v in seconds.items()})
            assert max(seconds.values()) < ANSWER_S, seconds
            evaluator.release.set()
            with pytest.raises(grpc.aio.AioRpcError) as superseded:
                await asyncio.wait_for(task, 120)
            assert superseded.value.code() == grpc.StatusCode.ABORTED
            assert "judged against v2, which was rolled_back during its gate" in superseded.value.details()
            states = {r.version: r.state.value for r in gw.registry.versions("heldgate")}
            assert states == {1: "live", 2: "rolled_back", 3: "rejected"}
            assert gw.rollout.rollouts()["heldgate"].live == 1 and gw.catalog.current("heldgate").version == 1
            assert 3 not in await gw.control.ready_versions("heldgate")  # withdrawn: unloaded
            assert gw.rollout.rollouts()["heldgate"].pins == {"robot=arm_2": 1}  # the gate's pin is gone

            evaluator.release.set()  # the next publish is judged against the live v1 and goes live
            reply = await publish(stub, "heldgate", variant(module, scale=0.9))
            assert reply.version == 4 and gw.rollout.rollouts()["heldgate"].live == 4

    asyncio.run(scenario())


def test_publishes_past_the_caps_are_refused_with_resource_exhausted(triton, tmp_path):
    module = triton.add_policy("capped")

    async def scenario():
        async with gateway(triton, tmp_path, "capped") as gw, grpc.aio.insecure_channel(gw.address) as channel:
            evaluator = gw.rollout.gate.evaluator = HeldEvaluator(gw.rollout)
            stub = policies_pb2_grpc.PoliciesStub(channel)
            gw.publisher.admission.limits = PublishLimits(max_inflight=1)
            task = await held_publish(gw, stub, evaluator, module, 2)
            with pytest.raises(grpc.aio.AioRpcError) as count:
                await publish(stub, "capped", variant(module, scale=1.3))
            assert count.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "1 publishes are in flight, the gateway's cap is 1" in count.value.details()
            held = gw.publisher.admission.bytes_held
            assert gw.publisher.admission.inflight == 1 and held > 0
            gw.publisher.admission.limits = PublishLimits(max_inflight=4, max_bytes=held + held // 2)
            with pytest.raises(grpc.aio.AioRpcError) as size:
                await publish(stub, "capped", variant(module, scale=1.3))
            assert size.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"more than the gateway's cap of {held + held // 2} bytes" in size.value.details()
            assert gw.publisher.admission.refused == 2
            evaluator.release.set()
            assert (await asyncio.wait_for(task, 120)).version == 2
            assert (gw.publisher.admission.inflight, gw.publisher.admission.bytes_held) == (0, 0)
            assert [r.version for r in gw.registry.versions("capped")] == [1, 2]  # the refused ones left no trace

    asyncio.run(scenario())


def test_publish_audits_the_authenticated_identity_and_bad_tokens_cost_one_scrypt_each(triton, tmp_path):
    module = triton.add_policy("audited")
    store = TokenStore(tmp_path / "tokens.json")
    trainer = store.add("ci", role="trainer")

    async def scenario():
        async with gateway(triton, tmp_path, "audited", tokens=tmp_path / "tokens.json") as gw, \
                grpc.aio.insecure_channel(gw.address) as channel:
            gw.rollout.gate.evaluator = HeldEvaluator(gw.rollout)
            gw.rollout.gate.evaluator.release.set()
            stub = policies_pb2_grpc.PoliciesStub(channel)
            reply = await publish(stub, "audited", variant(module, scale=1.1),  # lineage.trainer = "test"
                                  metadata=(("authorization", f"Bearer {trainer}"),
                                            ("x-tether-operator", "mallory")))
            first = gw.registry.events("audited", version=reply.version)[0]
            assert (first.to_state, first.who) == ("candidate", "trainer:ci")
            assert "'test'" in first.why  # the client's own word for its trainer is kept, as a detail

            tokens = gw.auth.tokens
            before = tokens.scrypt_calls
            bad = [f"ci.wrong-secret-{i}" for i in range(4)]

            async def status(token: str):
                try:
                    await stub.RolloutStatus(policies_pb2.RolloutStatusRequest(policy="audited"),
                                             metadata=(("authorization", f"Bearer {token}"),))
                except grpc.aio.AioRpcError as exc:
                    return exc.code()
                return grpc.StatusCode.OK

            codes = await asyncio.gather(*(status(token) for token in bad * 15))
            assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
            assert tokens.scrypt_calls - before == len(bad)  # 60 refusals, 4 hashes
            assert await status(trainer) == grpc.StatusCode.OK
            assert tokens.scrypt_calls - before == len(bad)  # the good token's result is cached since the Publish
            tokens.add("other", role="viewer")  # a change of the file empties the cache: hashed once again
            assert await status(trainer) == grpc.StatusCode.OK and await status(trainer) == grpc.StatusCode.OK
            assert tokens.scrypt_calls - before == len(bad) + 1

    asyncio.run(scenario())


def test_a_regressing_canary_is_rolled_back_automatically_while_a_publish_is_gated(triton, tmp_path):
    """The judging loop takes the rollout lock every tick: it rolls back a canary whose sessions earn
    negative returns while another version's evaluation is held; the held version then goes on."""
    module = triton.add_policy("autoback")
    plan = RolloutPlan(mode="staged", shadow_steps=10**6, canary_episodes=10**6, tick_s=0.05,
                       thresholds=Thresholds(min_episodes=3, min_steps=12, max_latency_p99_ratio=1e6))
    labels = [{"robot": "a"}, {"robot": "a"}, {"robot": "b"}, {"robot": "b"}]

    async def scenario():
        async with gateway(triton, tmp_path, "autoback", rollout=plan, switch="episode") as gw, \
                grpc.aio.insecure_channel(gw.address) as channel:
            evaluator = gw.rollout.gate.evaluator = HeldEvaluator(gw.rollout)
            stub = policies_pb2_grpc.PoliciesStub(channel)
            async with Fleet(gw, "autoback", labels) as fleet:
                await fleet.round()
                evaluator.release.set()
                assert (await publish(stub, "autoback", variant(module, flip=True))).version == 2  # shadow
                evaluator.release.clear()
                task = await held_publish(gw, stub, evaluator, module, 3)
                seconds, status = await timed(stub.Promote(policies_pb2.PromoteRequest(
                    policy="autoback", version=2, to="canary", canary_labels={"robot": "a"}, why="try"), timeout=30))
                assert status.rollout.canary == 2 and seconds < ANSWER_S, seconds  # promoted during the gate
                for _ in range(60):  # episodes until the judging loop rolls the canary back (bounded)
                    await fleet.round()
                    assert not fleet.errors, fleet.errors[:3]
                    if gw.registry.get("autoback", 2).state.value == "rolled_back":
                        break
                assert gw.registry.get("autoback", 2).state.value == "rolled_back", "no automatic rollback"
                assert not task.done(), "the rollback came only after the gate: it waited for the gate"
                event = gw.registry.latest_events("autoback", limit=50)
                assert any(e.version == 2 and e.to_state == "rolled_back" and e.who == "auto" for e in event)
                evaluator.release.set()
                assert (await asyncio.wait_for(task, 120)).version == 3  # judged against v1, still live
                rollout = gw.rollout.rollouts()["autoback"]
                assert (rollout.live, rollout.shadow, rollout.canary) == (1, 3, None)

    asyncio.run(scenario())


def test_the_publish_caps_are_gateway_flags_and_bad_ones_are_named():
    from bridge.gateway.cli import parse_args
    from bridge.gateway.config import _security_kwargs

    limits = _security_kwargs(parse_args(["--triton", "x:1", "--max-publishes", "2", "--max-publish-mb", "100"]))
    assert limits["publish_limits"] == PublishLimits(max_inflight=2, max_bytes=100 << 20)
    with pytest.raises(SystemExit, match="max_inflight must be an integer >= 1, got 0"):
        _security_kwargs(parse_args(["--triton", "x:1", "--max-publishes", "0"]))
