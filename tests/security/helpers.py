"""Shared by the security tests: a real gRPC probe server that answers with `Authorizer.require`, a
lab CA made with `tether certs init`, and a session stepping through a secured channel."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import time
from pathlib import Path

import grpc
import numpy as np

from bridge.gateway.errors import GatewayError
from bridge.security import Authorizer
from bridge.security.cli import certs_main
from bridge.security.tls import TlsFiles, server_credentials
from protos import bridge_pb2, bridge_pb2_grpc
from protos.codec import encode

WHO = "/probe.Probe/Who"


def make_certs(folder: Path) -> Path:
    """`tether certs init` with a robot, an operator and a viewer."""
    certs_main(["init", str(folder), "--client", "arm_1:robot", "--client", "arm_2:robot",
                "--client", "alice:operator", "--client", "bob:viewer"])
    return folder


def client_files(certs: Path, name: str | None) -> dict:
    files = {"ca": certs / "ca.crt"}
    if name is not None:
        files.update(cert=certs / f"{name}.crt", key=certs / f"{name}.key")
    return files


@contextlib.asynccontextmanager
async def probe_server(auth: Authorizer, *, tls: TlsFiles | None = None):
    """A grpc.aio server on a free loopback port: WHO(role bytes) -> the caller's identity bytes."""

    async def who(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            return (await auth.require(context, request.decode())).encode()
        except GatewayError as exc:
            await context.abort(exc.status, str(exc))

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "probe.Probe", {"Who": grpc.unary_unary_rpc_method_handler(who)})])
    port = (server.add_secure_port("127.0.0.1:0", server_credentials(tls)) if tls
            else server.add_insecure_port("127.0.0.1:0"))
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def ask(channel: grpc.aio.Channel, role: str) -> tuple[grpc.StatusCode, str]:
    """(status, identity or error details) of one WHO call."""
    try:
        reply = await channel.unary_unary(WHO)(role.encode(), timeout=30)
        return grpc.StatusCode.OK, reply.decode()
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""


async def step_loop(channel: grpc.aio.Channel, hello: bridge_pb2.Hello, steps: int, seed: int = 0
                    ) -> list[bridge_pb2.ServerMessage]:
    """Hello, then `steps` observations; returns the replies (raises AioRpcError if refused)."""
    rng = np.random.default_rng(seed)
    call = bridge_pb2_grpc.BridgeStub(channel).Connect()
    await call.write(bridge_pb2.ClientMessage(hello=hello))
    first = await call.read()
    if first is grpc.aio.EOF:
        await call.code()
        raise grpc.aio.AioRpcError(await call.code(), None, None, await call.details())
    replies = [first]
    for i in range(steps):
        obs = bridge_pb2.Observation(step=i, t_sent_ns=time.time_ns(),
                                     step_type=bridge_pb2.FIRST if i == 0 else bridge_pb2.MID,
                                     tensors=[encode("observation", rng.standard_normal(11).astype(np.float32))])
        await call.write(bridge_pb2.ClientMessage(observation=obs))
        replies.append(await call.read())
    await call.done_writing()
    return replies


def non_loopback_ip() -> str | None:
    """This machine's address on its default route (a UDP connect sends nothing), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ipaddress.ip_address(ip).is_loopback or ip == "0.0.0.0" else ip
