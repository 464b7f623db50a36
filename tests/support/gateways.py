"""Gateways for tests, started the product's way (bridge.app.GatewayApp, tether.stack.GatewayProcess), on the
session's Triton unless the test needs one of its own (tests/support/triton.py):

    async with running_gateway(triton.url, policy="tiny") as gw:     # in this event loop: gw.address, gw.rollout...
        ...
    with gateway_process(triton.url, tmp_path / "gateway.log", "--experience-dir", log_dir, port=port) as gw:
        os.kill(gw.pid, signal.SIGKILL)                                # a `tether gateway` process: to kill, restart
    with gateway_process(triton.url, log, *triton.publishing_args(tmp_path), policy="") as gw:
        import_policy_file(gw.address, path, name="mine")              # publishing into the session's repository
    gateways = [start_gateway(triton.url, log, port=port) for ...]     # started; gw.proc (its Popen), gw.stop()
    a, b = start_gateways(triton.url, tmp_path)                        # two, each logging experience-0, -1
    async with token_gateway(triton.url, tmp_path, "arm_1") as (gw, tokens):   # robots need tokens["arm_1"]

Each gets a per-step deadline of 2 s unless told one: a test asserts behaviour, a loaded 2-core machine stalls, and
the gateway's own 100 ms is a robot's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from bridge.app import GatewayApp
from bridge.gateway.config import GatewayConfig
from bridge.security.tokens import TokenStore
from tether.stack import GatewayProcess

__all__ = ["DEADLINE_MS", "gateway_process", "running_gateway", "start_gateway", "start_gateways", "token_gateway"]

DEADLINE_MS = 2000


@contextlib.asynccontextmanager
async def running_gateway(triton_url: str, **config) -> AsyncIterator[GatewayApp]:
    """A gateway (with its console) in this event loop, `config` being GatewayConfig's fields; stopped on exit."""
    config.setdefault("deadline_ms", DEADLINE_MS)
    gateway = GatewayApp(GatewayConfig(triton_url=triton_url, **config))
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop(grace=0.1)


@contextlib.asynccontextmanager
async def token_gateway(triton_url: str, folder: Path, *robots: str, **config
                        ) -> AsyncIterator[tuple[GatewayApp, dict[str, str]]]:
    """`running_gateway` (policy "tiny" unless told) checking tokens (folder/tokens.json) where each of `robots`
    holds a robot's: (the gateway, {robot: its token})."""
    store = TokenStore(folder / "tokens.json")
    tokens = {robot: store.add(robot, role="robot") for robot in robots}
    config.setdefault("policy", "tiny")
    async with running_gateway(triton_url, tokens=folder / "tokens.json", **config) as gateway:
        yield gateway, tokens


def gateway_process(triton_url: str, log_path: Path, *args: object, policy: str = "tiny", port: int = 0,
                    env: Mapping[str, str] | None = None, timeout: float = 60.0, grace_s: float = 10.0
                    ) -> GatewayProcess:
    """`tether gateway --triton URL --policy POLICY --port PORT ARGS...` (not started: `with` it, or start()),
    its output appended to `log_path`; `env`: variables added to ours; `grace_s`: how long stop() waits for the
    gateway to drain after SIGTERM before SIGKILL."""
    gateway = GatewayProcess(triton_url=triton_url, policy=policy, log_path=log_path, port=port, timeout=timeout,
                             extra_args=("--deadline-ms", str(DEADLINE_MS), *map(str, args)))
    gateway.env = None if env is None else {**os.environ, **env}
    gateway.grace_s = grace_s
    return gateway


def start_gateway(triton_url: str, log_path: Path, *args: object, **kw) -> GatewayProcess:
    """`gateway_process(...)`, started: it listens (tether.stack.StackError with its log's end when it does not)."""
    gateway = gateway_process(triton_url, log_path, *args, **kw)
    gateway.start()
    return gateway


def start_gateways(triton_url: str, folder: Path, count: int = 2) -> list[GatewayProcess]:
    """`count` gateways started (`start_gateway`), gateway i logging to folder/gateway-i.log and its experience to
    folder/experience-i."""
    return [start_gateway(triton_url, folder / f"gateway-{i}.log", "--experience-dir", folder / f"experience-{i}")
            for i in range(count)]
