"""`tether gateway`: the gateway process from the command line, until SIGINT/SIGTERM.

    tether gateway --triton 127.0.0.1:8001 --policy hopper_v5 --model-repository runs/models \
        --experience-dir runs/experience --console-port 8080

Flags: `bridge.gateway.config.add_arguments` (plus `--log-format`); exit status 0 after a signal,
1 with the reason on stderr when it cannot start (Triton not ready, a refused bind, a bad reward file).
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from bridge.gateway.config import GatewayConfig, add_arguments, from_arguments

__all__ = ["main", "parse_args", "parser", "serve"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether gateway", description="Serve tether.v1.Bridge in front of Triton.")
    add_arguments(p)
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="json: one JSON object a line, with the session and policy version")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parser().parse_args(argv)


async def serve(config: GatewayConfig) -> None:
    """Run a gateway until SIGINT/SIGTERM. SIGTERM drains first (`Gateway.drain`: NOT_SERVING, no new session,
    the streams end UNAVAILABLE so clients move to another gateway at once); then the log is flushed."""
    from bridge.gateway.server import Gateway

    gateway = Gateway(config)
    await gateway.start()
    print(f"gateway listening on {gateway.address}", flush=True)
    if gateway.console is not None:
        print(f"console on {gateway.console.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    got: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda sig=sig: (got.append(sig), stop.set()))
    await stop.wait()
    if got and got[0] == signal.SIGTERM:
        await gateway.drain(config.drain_grace_s)
    await gateway.stop()


def main(argv: list[str] | None = None) -> int:
    from bridge.common.logs import configure_logging
    from bridge.rewards import RewardConfigError
    from bridge.security.tls import InsecureBind
    from bridge.security.tokens import TokenError

    a = parse_args(argv)
    configure_logging(a.log_format)
    config = from_arguments(a)
    try:
        asyncio.run(serve(config))
    except RewardConfigError as exc:
        raise SystemExit(f"tether gateway: {exc}") from None
    except (InsecureBind, TokenError, FileNotFoundError) as exc:  # bridge.security: a refusal, not a traceback
        raise SystemExit(f"tether gateway: {exc}") from None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
