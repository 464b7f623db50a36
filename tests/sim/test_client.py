"""sim.client against a small but real grpc.aio Bridge servicer over loopback."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import defaultdict

import grpc
import numpy as np
import pytest

from bridge.common.errors import CommandError
from protos.codec import check_all, decode_all, encode, specs_from_proto
from protos.tether.v1 import bridge_pb2, bridge_pb2_grpc
from sim.cli import main
from sim.client import SessionError, SimStats, run_sessions
from sim.env import StepType
from sim.mujoco import make_env
from sim.toy import PointMass


class FakeBridge(bridge_pb2_grpc.BridgeServicer):
    """Zeros (or `action_value`) actions with version 1, EpisodeEnd for LAST, a StepError at
    `error_step`; records what every session sent and whether it was valid."""

    def __init__(self, *, error_step: int | None = None, action_value: float = 0.0,
                 bad_action_step: int | None = None, reject: bool = False, silent: bool = False):
        self.error_step, self.action_value, self.bad_action_step = error_step, action_value, bad_action_step
        self.reject, self.silent = reject, silent
        self.hellos: dict[str, bridge_pb2.Hello] = {}
        self.observations: dict[str, list[bridge_pb2.Observation]] = defaultdict(list)
        self.problems: list[str] = []
        self.ended_cleanly: set[str] = set()

    async def Connect(self, request_iterator, context):
        messages = request_iterator.__aiter__()
        hello = (await messages.__anext__()).hello
        if self.reject:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "observation_spec: not for this policy")
        sid = hello.session_id
        self.hellos[sid] = hello
        obs_spec, act_spec = specs_from_proto(hello.observation_spec), specs_from_proto(hello.action_spec)
        yield bridge_pb2.ServerMessage(welcome=bridge_pb2.Welcome(session_id=sid, policy="mlp",
                                                                  policy_version=1, deadline_ms=50))
        async for message in messages:
            obs, t_recv = message.observation, time.time_ns()
            self.observations[sid].append(obs)
            try:
                check_all(obs_spec, obs.tensors)
                if obs.step_type != bridge_pb2.FIRST:
                    check_all(act_spec, obs.applied_action)
            except ValueError as e:
                self.problems.append(f"{sid} step {obs.step}: {e}")
            if self.silent:
                await asyncio.sleep(3600)
            if obs.step_type == bridge_pb2.LAST:
                yield bridge_pb2.ServerMessage(episode_end=bridge_pb2.EpisodeEnd(step=obs.step))
            elif obs.step == self.error_step:
                yield bridge_pb2.ServerMessage(error=bridge_pb2.StepError(
                    step=obs.step, code=bridge_pb2.StepError.DEADLINE_EXCEEDED, message="too slow"))
            else:
                spec = act_spec[0]
                shape = spec.shape + (2,) if obs.step == self.bad_action_step else spec.shape
                action = encode(spec.name, np.full(shape, self.action_value, spec.dtype))
                yield bridge_pb2.ServerMessage(action=bridge_pb2.Action(
                    step=obs.step, tensors=[action], policy="mlp", policy_version=1,
                    timing=bridge_pb2.Timing(t_sent_ns=obs.t_sent_ns, gateway_recv_ns=t_recv,
                                             gateway_send_ns=time.time_ns())))
        self.ended_cleanly.add(sid)


@pytest.fixture
def gateway():
    """Start a FakeBridge(**kw) on a free loopback port in a background event loop."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers = []

    def start(**kw) -> tuple[FakeBridge, str]:
        async def serve():
            server = grpc.aio.server()
            bridge = FakeBridge(**kw)
            bridge_pb2_grpc.add_BridgeServicer_to_server(bridge, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            servers.append(server)
            return bridge, f"127.0.0.1:{port}"
        return asyncio.run_coroutine_threadsafe(serve(), loop).result(10)

    yield start
    for server in servers:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def point_masses(max_episode_steps: int = 20):
    return lambda i: PointMass(seed=i, max_episode_steps=max_episode_steps)


def run(target, make, **kw) -> SimStats:
    return asyncio.run(run_sessions(target, make, **kw))


def test_sessions_follow_the_protocol(gateway):
    bridge, target = gateway(error_step=5)
    stats = run(target, point_masses(), envs=3, steps=150)
    assert stats.steps == 150 and stats.sessions == 3
    assert stats.errors == {"DEADLINE_EXCEEDED": 3}
    assert stats.policy_versions == {1: 147} and len(stats.rtt_ns) == 147
    assert stats.episodes >= 6 and len(stats.returns) == stats.episodes
    assert bridge.problems == []
    assert bridge.ended_cleanly == set(bridge.hellos) and len(bridge.hellos) == 3
    for sid, observations in bridge.observations.items():
        assert bridge.hellos[sid].source == "toy:PointMass"
        assert [o.step for o in observations] == list(range(len(observations)))
        types = [StepType(o.step_type) for o in observations]
        assert types[0] is StepType.FIRST and types[-1] is StepType.LAST
        for before, after in zip(types, types[1:], strict=False):
            assert (after is StepType.FIRST) == (before is StepType.LAST)
        assert all(o.t_sent_ns > 0 for o in observations)
        assert all(bool(o.applied_action) == (o.step_type != bridge_pb2.FIRST) for o in observations)
    summary = stats.summary()
    assert summary["steps"] == 150 and summary["sessions"] == 3 and summary["steps_per_s"] > 0
    assert summary["rtt_ms"]["p50"] <= summary["rtt_ms"]["p99"]
    assert summary["errors"] == {"DEADLINE_EXCEEDED": 3}


def test_applied_action_reports_the_clipped_value(gateway):
    bridge, target = gateway(action_value=5.0)
    run(target, point_masses(), envs=1, steps=5)
    (observations,) = bridge.observations.values()
    applied = [decode_all(o.applied_action)["action"].tolist() for o in observations[1:]]
    assert applied == [[1.0]] * 5


def test_steps_budget_ends_with_a_truncated_last(gateway):
    bridge, target = gateway()
    stats = run(target, point_masses(max_episode_steps=100), envs=1, steps=7)
    (observations,) = bridge.observations.values()
    assert len(observations) == 8 and stats.steps == 7 and stats.episodes == 1
    assert observations[-1].step_type == bridge_pb2.LAST and not observations[-1].terminated
    assert observations[-1].reward != 0.0


def test_seconds_budget_and_progress(gateway):
    _, target = gateway()
    seen = []
    t0 = time.monotonic()
    stats = run(target, point_masses(), envs=2, seconds=0.4, on_progress=lambda s: seen.append(s.steps),
                progress_every=0.1)
    assert 0.4 <= time.monotonic() - t0 < 5
    assert stats.steps > 0 and 0.4 <= stats.elapsed_s < 5 and len(seen) >= 2


def test_mujoco_envs_over_the_wire(gateway):
    bridge, target = gateway()
    stats = run(target, lambda i: make_env("Hopper-v5", seed=i, max_episode_steps=30), envs=2, steps=100)
    assert stats.steps == 100 and bridge.problems == []
    assert {h.source for h in bridge.hellos.values()} == {"mujoco:Hopper-v5"}
    assert [s.low for s in specs_from_proto(next(iter(bridge.hellos.values())).action_spec)] == [(-1.0,) * 3]


def test_unreachable_gateway_is_a_connection_error_not_a_hang():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}"):
        run(f"127.0.0.1:{port}", point_masses(), envs=1, steps=5, connect_timeout=0.3)
    assert time.monotonic() - t0 < 5


def test_rejected_session_is_a_session_error(gateway):
    _, target = gateway(reject=True)
    with pytest.raises(SessionError, match="INVALID_ARGUMENT.*observation_spec"):
        run(target, point_masses(), envs=2, steps=10, connect_timeout=2)


def test_silent_gateway_times_out(gateway):
    _, target = gateway(silent=True)
    with pytest.raises(TimeoutError, match="no reply to step 0"):
        run(target, point_masses(), envs=1, steps=10, reply_timeout=0.3)


def test_bad_action_from_the_gateway_is_counted_and_the_last_action_applied(gateway):
    bridge, target = gateway(bad_action_step=3)
    stats = run(target, point_masses(max_episode_steps=100), envs=1, steps=6)
    assert stats.errors == {"INVALID_ACTION": 1} and stats.steps == 6 and bridge.problems == []


def test_budget_is_required():
    with pytest.raises(ValueError, match="budget"):
        run("127.0.0.1:1", point_masses(), envs=1)


def test_main_prints_status_lines_and_a_summary(gateway, capsys):
    _, target = gateway()
    rc = main(["--gateway", target, "--env", "PointMass", "--envs", "2", "--steps", "60",
               "--status-every", "0.01", "--seed", "0"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["steps"] == 60 and summary["sessions"] == 2
    assert "sessions 2" in err.splitlines()[-1]


def test_main_reports_an_unreachable_gateway():
    with pytest.raises(CommandError, match="127.0.0.1:9"):  # `tether sim` prints it and exits 1
        main(["--gateway", "127.0.0.1:9", "--env", "PointMass", "--steps", "5", "--connect-timeout", "0.2"])


def test_main_reports_an_unknown_env(gateway, capsys):
    _, target = gateway()
    with pytest.raises(SystemExit) as exit_info:
        main(["--gateway", target, "--env", "NoSuchEnv-v0", "--steps", "5"])
    assert exit_info.value.code == 2 and "NoSuchEnv-v0" in capsys.readouterr().err
