"""The gateway over TLS with client certificates (mTLS), against a real Triton: a client without the
right certificate is refused, with it the loop runs; the certificate is the source a per-source cap
counts; plaintext off loopback refuses to start unless --insecure, which then warns loudly."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys

import grpc
import pytest

from bridge.app import GatewayApp
from bridge.client import Credentials, aio_channel
from bridge.gateway.config import GatewayConfig
from bridge.gateway.session.limits import Limits
from bridge.security.tls import InsecureBind
from tests.conftest import ACT, OBS
from tests.gateway.helpers import hello
from tests.security.helpers import client_files, make_certs, non_loopback_ip, step_loop
from tests.support.gateways import running_gateway


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def mtls(certs) -> dict:
    return {"tls_cert": certs / "server.crt", "tls_key": certs / "server.key", "tls_client_ca": certs / "ca.crt"}


def test_mtls_refuses_clients_without_the_right_certificate_and_runs_the_loop_with_it(triton, certs, tmp_path):
    other = make_certs(tmp_path / "other")

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", **mtls(certs)) as gw:
            async with aio_channel(gw.address, Credentials(**client_files(certs, "arm_1"))) as channel:
                replies = await step_loop(channel, hello("arm-1", obs=OBS, act=ACT), steps=5)
            assert replies[0].welcome.session_id == "arm-1"
            assert [r.WhichOneof("kind") for r in replies[1:]] == ["action"] * 5
            refused = {"plaintext": grpc.aio.insecure_channel(gw.address),
                       "TLS without a client certificate": aio_channel(gw.address, Credentials(ca=certs / "ca.crt")),
                       "a certificate from another CA": aio_channel(gw.address, Credentials(
                           ca=certs / "ca.crt", cert=other / "arm_1.crt", key=other / "arm_1.key"))}
            for what, channel in refused.items():
                async with channel:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await step_loop(channel, hello(f"x-{len(what)}", obs=OBS, act=ACT), steps=1)
                    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, what
            for _ in range(400):  # arm-1's stream is closing (bounded wait); none of the refused ever opened one
                if not gw.sessions:
                    break
                await asyncio.sleep(0.05)
            assert not gw.sessions and len(gw.admission) == 0

    asyncio.run(scenario())


def test_the_certificate_identity_is_the_source_a_cap_counts(triton, certs):
    limits = Limits(max_sessions_per_source=2)

    async def hold(channel, session_id, held: asyncio.Event, release: asyncio.Event):
        from protos import bridge_pb2, bridge_pb2_grpc

        call = bridge_pb2_grpc.BridgeStub(channel).Connect()
        await call.write(bridge_pb2.ClientMessage(hello=hello(session_id, obs=OBS, act=ACT)))
        reply = await call.read()
        held.set()
        await release.wait()
        await call.done_writing()
        return reply

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", limits=limits, **mtls(certs)) as gw:
            async with aio_channel(gw.address, Credentials(**client_files(certs, "arm_1"))) as arm1, \
                       aio_channel(gw.address, Credentials(**client_files(certs, "arm_2"))) as arm2:
                release = asyncio.Event()
                held = [asyncio.Event(), asyncio.Event()]
                tasks = [asyncio.create_task(hold(arm1, f"a{i}", held[i], release)) for i in range(2)]
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in held)), 60)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await step_loop(arm1, hello("a2", obs=OBS, act=ACT), steps=1)
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "'robot:arm_1'" in err.value.details()
                assert gw.admission.by_source() == {"robot:arm_1": 2}
                replies = await step_loop(arm2, hello("b0", obs=OBS, act=ACT), steps=2)  # another robot: admitted
                assert replies[-1].WhichOneof("kind") == "action"
                release.set()
                await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_plaintext_off_loopback_refuses_to_start():
    for host in ("0.0.0.0", "::", "gateway.example"):
        gw = GatewayApp(GatewayConfig(triton_url="127.0.0.1:1", host=host))
        with pytest.raises(InsecureBind, match="--insecure"):
            asyncio.run(gw.start())   # refused before anything else: Triton is not even asked


def test_the_cli_refuses_too(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-m", "tether", "gateway", "--triton", "127.0.0.1:1", "--host", "0.0.0.0",
                          "--port", "0"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode != 0
    assert "refusing to serve the gateway without TLS on '0.0.0.0'" in out.stderr


def test_insecure_starts_off_loopback_and_warns(triton, caplog):
    ip = non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address to bind")

    async def scenario():
        with caplog.at_level(logging.WARNING, logger="tether.security"):
            async with running_gateway(triton.url, policy="tiny", host=ip, insecure=True) as gw:
                assert gw.address.startswith(f"{ip}:")
                async with grpc.aio.insecure_channel(gw.address) as channel:
                    replies = await step_loop(channel, hello("lan", obs=OBS, act=ACT), steps=3)
                assert replies[-1].WhichOneof("kind") == "action"
                assert not gw.auth.open_access      # exposed: operator actions still need credentials

    asyncio.run(scenario())
    assert any("INSECURE" in r.getMessage() and "PLAINTEXT" in r.getMessage() for r in caplog.records)


def test_the_sim_client_over_mtls(triton, certs):
    from sim.client import ClientTls, run_sessions
    from sim.mujoco import make_env

    tls = ClientTls(ca=certs / "ca.crt", cert=certs / "arm_2.crt", key=certs / "arm_2.key")

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", **mtls(certs)) as gw:
            stats = await run_sessions(gw.address, lambda i: make_env("Hopper-v5", seed=i), envs=2, steps=60, tls=tls)
            with pytest.raises(ConnectionError, match="not reachable"):  # plaintext to a TLS gateway
                await run_sessions(gw.address, lambda i: make_env("Hopper-v5", seed=i), envs=1, steps=5,
                                   connect_timeout=2)
            return stats

    stats = asyncio.run(scenario())
    assert stats.sessions == 2 and stats.steps == 60 and not stats.errors


def test_the_gates_simulator_sessions_get_through_mtls(triton, certs, tmp_path):
    """The gate's evaluation runs `tether sim` against the gateway: under mTLS, with the gate's TLS
    flags (run here as the evaluator would, without a gate run's pins: the live version acts)."""
    from bridge.gate import GateConfig

    tls = {**mtls(certs), "gate_tls_cert": certs / "arm_2.crt", "gate_tls_key": certs / "arm_2.key"}
    summary = tmp_path / "summary.json"

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", gate=GateConfig(eval_env="Hopper-v5",
                                                                              eval_max_steps=20), **tls) as gw:
            cmd = gw.rollout.gate.evaluator.command("tiny", 1, 2, "gate-test", summary)
            assert cmd[cmd.index("--tls-ca") + 1] == str(certs / "ca.crt") and "--tls-cert" in cmd
            proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE,
                                                        env={**os.environ, "PYTHONPATH": os.getcwd()})
            out, err = await asyncio.wait_for(proc.communicate(), 240)
            assert proc.returncode == 0, err.decode()[-2000:]

    asyncio.run(scenario())
    result = json.loads(summary.read_text())
    assert result["episodes"] == 2 and len(result["returns"]) == 2
