"""Who may open a session on a real gateway (real Triton, real gRPC): with tokens or client certificates
configured, `Bridge.Connect` needs the robot role (or operator); labels route (pins, canary) only from
identities allowed to route; sessions are capped per proven identity; `num_envs` is bounded; the gate's
own simulator sessions get through a token-checking gateway."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import grpc
import pytest

from bridge.client import Credentials, aio_channel
from bridge.gateway.session.limits import Limits
from bridge.security.tokens import TokenStore
from protos import bridge_pb2, bridge_pb2_grpc
from tests.conftest import ACT, OBS
from tests.gateway.helpers import hello
from tests.security.helpers import client_files, make_certs, step_loop
from tests.support.gateways import running_gateway
from tests.support.waiting import until

OK, UNAUTH, DENIED = grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED


async def connect(channel, session_id: str, steps: int = 2, **fields) -> tuple[grpc.StatusCode, str]:
    """(OK, the last reply's kind) or (the refusal's code, its details)."""
    h = hello(session_id, obs=OBS, act=ACT)
    for key, value in fields.items():
        if key == "labels":
            h.labels.update(value)
        else:
            setattr(h, key, value)
    try:
        replies = await step_loop(channel, h, steps=steps)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return OK, replies[-1].WhichOneof("kind")


@pytest.fixture
def tokens(tmp_path):
    store = TokenStore(tmp_path / "tokens.json")
    return {name: store.add(name, role=role) for name, role in
            (("arm_1", "robot"), ("bob", "viewer"), ("alice", "operator"), ("tina", "trainer"))}


def all_closed(gw) -> bool:
    """No session open, none admitted (streams end asynchronously: wait on it)."""
    return not gw.sessions and len(gw.admission) == 0


def test_with_tokens_a_session_needs_the_robot_role(triton, tokens, tmp_path):
    async def scenario():
        async with running_gateway(triton.url, policy="tiny", tokens=tmp_path / "tokens.json") as gw:
            got = {}
            for who in (None, "bob", "tina", "arm_1", "alice"):
                async with aio_channel(gw.address, Credentials(token=tokens[who] if who else None)) as channel:
                    got[who] = await connect(channel, f"s-{who}")
            async with aio_channel(gw.address, Credentials(token=tokens["arm_1"][:-2] + "xx")) as channel:
                got["mistyped"] = await connect(channel, "s-mistyped")
            await until(lambda: all_closed(gw), "every stream closed")
            return got

    got = asyncio.run(scenario())
    code, details = got[None]
    assert code == UNAUTH and "robot role needs credentials" in details and "--role robot" in details, details
    code, details = got["bob"]
    assert code == DENIED and "viewer:bob may not act as robot" in details, details
    code, details = got["tina"]
    assert code == DENIED and "trainer:tina may not act as robot" in details, details
    assert got["mistyped"][0] == UNAUTH
    assert got["arm_1"] == (OK, "action") and got["alice"] == (OK, "action")


def test_the_sim_client_sends_its_robot_token(triton, tokens, tmp_path):
    from sim.client import SessionError, run_sessions
    from sim.mujoco import make_env

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", tokens=tmp_path / "tokens.json") as gw:
            stats = await run_sessions(gw.address, lambda i: make_env("Hopper-v5", seed=i), envs=1, steps=20,
                                       token=tokens["arm_1"])
            with pytest.raises(SessionError, match="UNAUTHENTICATED"):
                await run_sessions(gw.address, lambda i: make_env("Hopper-v5", seed=i), envs=1, steps=5)
            return stats

    stats = asyncio.run(scenario())
    assert stats.steps == 20 and not stats.errors


def test_a_viewer_certificate_cannot_open_a_session(triton, tmp_path):
    certs = make_certs(tmp_path / "certs")
    tls = {"tls_cert": certs / "server.crt", "tls_key": certs / "server.key", "tls_client_ca": certs / "ca.crt"}

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", **tls) as gw:
            got = {}
            for name in ("bob", "arm_1", "alice"):
                async with aio_channel(gw.address, Credentials(**client_files(certs, name))) as channel:
                    got[name] = await connect(channel, f"s-{name}")
            await until(lambda: all_closed(gw), "every stream closed")
            return got

    got = asyncio.run(scenario())
    code, details = got["bob"]
    assert code == DENIED and "viewer:bob may not act as robot" in details, details
    assert got["arm_1"] == (OK, "action") and got["alice"] == (OK, "action")


def test_labels_route_only_from_identities_allowed_to_route(triton, tokens, tmp_path, caplog):
    store = TokenStore(tmp_path / "tokens.json")
    arm_2 = store.add("arm_2", role="robot")
    limits = Limits(route_labels_from=("robot:arm_2",))

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", tokens=tmp_path / "tokens.json", limits=limits) as gw:
            seen: dict[str, dict] = {}
            acting = gw.rollout.acting

            def spy(policy, session_id, labels):  # what the router is asked to route by
                seen[session_id] = dict(labels)
                return acting(policy, session_id, labels)

            gw.rollout.acting = spy
            labels = {"labels": {"robot": "arm_9", "canary": "yes"}}
            for who, token in (("arm_1", tokens["arm_1"]), ("arm_2", arm_2), ("alice", tokens["alice"])):
                async with aio_channel(gw.address, Credentials(token=token)) as channel:
                    assert await connect(channel, f"s-{who}", **labels) == (OK, "action")
            await until(lambda: all_closed(gw), "every stream closed")
            return seen

    with caplog.at_level(logging.INFO, logger="tether.gateway"):
        seen = asyncio.run(scenario())
    routed = {"robot": "arm_9", "canary": "yes"}
    assert seen == {"s-arm_1": {}, "s-arm_2": routed, "s-alice": routed}, seen
    assert any("s-arm_1" in r.getMessage() and "do not route" in r.getMessage() for r in caplog.records)


def test_sessions_are_capped_per_token_identity_and_num_envs_is_bounded(triton, tokens, tmp_path):
    limits = Limits(max_sessions_per_source=1, max_envs=4)

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", tokens=tmp_path / "tokens.json", limits=limits) as gw:
            async with aio_channel(gw.address, Credentials(token=tokens["arm_1"])) as arm, \
                       aio_channel(gw.address, Credentials(token=tokens["alice"])) as alice:
                held = bridge_pb2_grpc.BridgeStub(arm).Connect()
                await held.write(bridge_pb2.ClientMessage(hello=hello("held", obs=OBS, act=ACT)))
                assert (await held.read()).WhichOneof("kind") == "welcome"
                assert gw.admission.by_source() == {"robot:arm_1": 1}
                second = await connect(arm, "second")
                other = await connect(alice, "other")            # another identity: its own cap
                too_many_envs = await connect(alice, "wide", num_envs=5)
                await held.done_writing()
                await held.read()
            await until(lambda: all_closed(gw), "every stream closed")
            return second, other, too_many_envs

    second, other, too_many_envs = asyncio.run(scenario())
    code, details = second
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "'robot:arm_1'" in details, details
    assert other == (OK, "action")
    code, details = too_many_envs
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "num_envs: 5 envs" in details and "at most 4" in details


def test_the_gates_simulator_sessions_get_through_a_token_gateway(triton, tokens, tmp_path):
    """The gateway issues its gate a robot token of its own (never written to disk), passed to `tether sim`
    in its environment; without it the same command is refused."""
    from bridge.gate import GateConfig

    summary = tmp_path / "summary.json"

    async def run(cmd, env):
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE, env=env)
        _, err = await asyncio.wait_for(proc.communicate(), 240)
        return proc.returncode, err.decode()

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", tokens=tmp_path / "tokens.json",
                                   gate=GateConfig(eval_env="Hopper-v5", eval_max_steps=20)) as gw:
            evaluator = gw.rollout.gate.evaluator
            assert evaluator.sim_env["TETHER_TOKEN"].startswith("gate.")
            assert "gate" not in json.loads((tmp_path / "tokens.json").read_text()).get("tokens", {})
            cmd = evaluator.command("tiny", 1, 2, "gate-test", summary)
            base = {k: v for k, v in os.environ.items() if k != "TETHER_TOKEN"} | {"PYTHONPATH": os.getcwd()}
            refused = await run(cmd, base)
            accepted = await run(cmd, base | evaluator.sim_env)
            return refused, accepted

    (rc_refused, err_refused), (rc, err) = asyncio.run(scenario())
    assert rc_refused != 0 and "UNAUTHENTICATED" in err_refused, err_refused[-2000:]
    assert rc == 0, err[-2000:]
    assert json.loads(summary.read_text())["episodes"] == 2
