"""The gateway process as `tether gateway` runs it: the gateway (bridge.gateway) with the operator's side
(bridge.console: tether.v1.Fleet, the HTTP console) composed on top. The one place that knows both.

    app = GatewayApp(GatewayConfig(triton_url="127.0.0.1:8001", policy="hopper", console_port=0))
    await app.start()              # the gateway, then the console; app.address, app.console.url
    app.fleet.status()             # what operators see (bridge.console.fleet.Fleet)
    await app.stop()

    tether gateway --triton 127.0.0.1:8001 --policy hopper_v5 --console-port 8080   # main(): until SIGINT/SIGTERM

Exit status of `main`: 0 after a signal, 1 with the reason on stderr when it cannot start (Triton not ready, a
refused bind, a bad reward file). Flags: `bridge.gateway.cli.parser`.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc

from bridge.console.fleet import Fleet
from bridge.console.fleet_service import FleetService
from bridge.console.server import Console
from bridge.gateway.cli import parse_args
from bridge.gateway.config import GatewayConfig, from_arguments
from bridge.gateway.server import Gateway
from bridge.security.hosts import check_console_bind
from bridge.security.tls import check_exposure, http_ssl_context
from protos import fleet_pb2_grpc

__all__ = ["GatewayApp", "main", "serve"]

log = logging.getLogger("tether.gateway")


class GatewayApp(Gateway):
    """A Gateway plus `fleet` (what operators see and do: displays the gateway's figures and e-stops, forwards
    e-stops and releases), tether.v1.Fleet on the same gRPC server, and `console` (HTTP) when
    `config.console_port` is set."""

    def __init__(self, config: GatewayConfig):
        super().__init__(config)
        self.fleet = Fleet(self)
        self.console: Console | None = None

    def add_services(self, server: grpc.aio.Server) -> None:
        super().add_services(server)
        fleet_pb2_grpc.add_FleetServicer_to_server(FleetService(self), server)

    async def start(self) -> None:
        c = self.config
        if c.console_port is not None:  # refused before anything starts: HTTPS with the gateway's certificate,
            check_exposure(c.console_host, tls=c.tls_cert is not None, insecure=c.insecure, what="console")
            check_console_bind(c.console_host, self.auth)  # ExposedConsole: off loopback, credentials needed
        await super().start()
        if c.console_port is not None:
            tls = self.tls_files()
            self.console = Console(self, host=c.console_host, port=c.console_port,
                                   allowed_hosts=c.console_allowed_hosts,
                                   ssl_context=http_ssl_context(tls) if tls else None)
            await self.console.start()
            self.fleet.console_url = self.console.url
            log.info("console on %s", self.console.url)

    async def stop(self, grace: float = 1.0) -> None:
        if self.console is not None:
            await self.console.stop()
        await super().stop(grace)


async def serve(config: GatewayConfig) -> None:
    """Run a gateway until SIGINT/SIGTERM. SIGTERM drains first (`Gateway.drain`: NOT_SERVING, no new session,
    the streams end UNAVAILABLE so clients move to another gateway at once); then the log is flushed."""
    app = GatewayApp(config)
    await app.start()
    print(f"gateway listening on {app.address}", flush=True)
    if app.console is not None:
        print(f"console on {app.console.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    got: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda sig=sig: (got.append(sig), stop.set()))
    await stop.wait()
    if got and got[0] == signal.SIGTERM:
        await app.drain(config.drain_grace_s)
    await app.stop()


def main(argv: list[str] | None = None) -> int:
    from bridge.common.errors import CommandError
    from bridge.common.logs import configure_logging
    from bridge.rewards import RewardConfigError
    from bridge.security.tls import InsecureBind
    from bridge.security.tokens import TokenError

    a = parse_args(argv)
    configure_logging(a.log_format)
    config = from_arguments(a)
    try:
        asyncio.run(serve(config))
    except (RewardConfigError, InsecureBind, TokenError, FileNotFoundError) as exc:  # a refusal, not a traceback
        raise CommandError(exc) from None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
