"""`tether view`: a gateway's robots live in Foxglove (the Foxglove WebSocket protocol).

    tether view --gateway 127.0.0.1:50051                     # ws://127.0.0.1:8765: Foxglove > Open connection
    tether view --gateway gw.lab:50051 --tls-ca ca.crt --token viewer-gw.SECRET \\
        --host 0.0.0.0 --port 8765 --tokens runs/view-tokens.json   # off loopback: viewers need viewer tokens

Per robot (session): cameras, state, actions (the policy's and the applied), rewards, policy version, hop latencies,
e-stop state, and a log of episodes, version changes, interventions and e-stops (bridge.experience.foxglove's
topics; its layout file is the one to import). Credentials for the gateway as every client takes them
(`--token`: a trainer or operator token where the gateway checks tokens: the Experience stream needs the trainer
role). The view binds 127.0.0.1 unless told; anywhere else it needs `--tokens FILE`, and then a viewer presents a
token with the viewer role (`Authorization: Bearer NAME.SECRET` or `?token=NAME.SECRET`). A viewer that reads too
slowly loses frames (at most `--max-queue` wait for it), counted; the stream from the gateway never waits.
Web pages other than Foxglove's own (`--allowed-origin`) and other Host names (`--allowed-host`) are refused;
`--view-tls-cert/--view-tls-key` serve wss:// (tokens then never cross the network in plaintext).
A status line every `--status-every` seconds on stderr; GET /stats gives the counts as JSON.
Exit status: 0 stopped, 1 refused or failed (the reason on stderr), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path

from bridge.common.errors import CommandError
from bridge.common.flags import gateway_flags, policy_flag

__all__ = ["main", "parser", "serve"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether view", description=__doc__.splitlines()[0])
    gateway_flags(p, token_help="a trainer (or operator) token NAME.SECRET")
    p.add_argument("--host", default="127.0.0.1", help="the view's bind address (not loopback: needs --tokens)")
    p.add_argument("--port", type=int, default=8765, help="the view's port (0 = a free port)")
    p.add_argument("--tokens", type=Path, help="viewers' tokens file (tether token add NAME --role viewer): a viewer "
                   "must present one")
    p.add_argument("--max-queue", type=int, default=64, metavar="FRAMES",
                   help="message frames that may wait for one viewer; beyond, its frames are dropped (counted)")
    p.add_argument("--status-every", type=float, default=5.0, metavar="SECONDS",
                   help="seconds between status lines (0 = none)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME[:PORT]",
                   help="a Host name the view also answers to (by another name than its bind address, or behind a "
                   "proxy); others get 421")
    p.add_argument("--allowed-origin", action="append", default=None, metavar="URL",
                   help="a web page origin that may open the view (repeatable; default https://app.foxglove.dev, "
                   "Foxglove's web app); a client sending none passes, others get 403")
    p.add_argument("--view-tls-cert", type=Path, help="serve wss:// with this certificate (tether certs init's "
                   "server.crt; with --view-tls-key)")
    p.add_argument("--view-tls-key", type=Path, help="the view certificate's private key")
    policy_flag(p, help="only this policy's transitions (default: all)")
    return p


def status_line(stats: dict) -> str:
    viewers = ", ".join(f"#{v['id']} {v['sent']} sent/{v['dropped']} dropped" for v in stats["viewers"])
    return (f"tether view: {len(stats['viewers'])} viewer(s){f' ({viewers})' if viewers else ''}, "
            f"{stats['channels']} channels, acked through {stats['acked_through']} of {stats['log_end']}, "
            f"{stats['sent']} frames sent, {stats['dropped']} dropped"
            + (f"; {stats['last_error']}" if stats["last_error"] else ""))


async def serve(a: argparse.Namespace) -> None:
    from bridge.client import Credentials
    from bridge.experience.foxglove import LAYOUT
    from bridge.security import Authorizer, TokenStore
    from bridge.security.tls import TlsFiles, http_ssl_context
    from bridge.view.feed import GatewayFeed
    from bridge.view.server import FOXGLOVE_WEB, ViewServer

    auth = Authorizer(tokens=TokenStore(a.tokens), anonymous_viewers=False) if a.tokens else Authorizer()
    tls = http_ssl_context(TlsFiles(cert=a.view_tls_cert, key=a.view_tls_key)) if a.view_tls_cert else None
    feed = None
    server = ViewServer(host=a.host, port=a.port, auth=auth, max_queue=a.max_queue, ssl_context=tls,
                        allowed_hosts=a.allowed_host, allowed_origins=a.allowed_origin or (FOXGLOVE_WEB,),
                        status=lambda: feed.status() if feed else {})
    feed = GatewayFeed(a.gateway, Credentials.from_args(a), server=server, policy=a.policy)
    await server.start()
    print(json.dumps({"url": server.url, "stats": f"http{server.url[2:]}/stats", "gateway": a.gateway,
                      "access": auth.describe(), "layout": str(LAYOUT)}), flush=True)
    running = asyncio.ensure_future(feed.run())
    try:
        while not running.done():
            await asyncio.wait([running], timeout=a.status_every or None)
            if a.status_every and not running.done():
                print(status_line(server.stats()), file=sys.stderr, flush=True)
        running.result()
    finally:
        running.cancel()
        with contextlib.suppress(BaseException):
            await running
        await server.close()


def main(argv: list[str] | None = None) -> None:
    p = parser()
    a = p.parse_args(argv)
    if a.max_queue < 1:
        p.error(f"--max-queue must be at least 1, got {a.max_queue}")
    if (a.view_tls_cert is None) != (a.view_tls_key is None):
        p.error("--view-tls-cert and --view-tls-key go together")
    from bridge.client import Credentials
    from bridge.view.server import ExposedView

    try:
        Credentials.from_args(a).check(a.gateway)
    except ValueError as exc:
        p.error(str(exc))
    try:
        import foxglove  # noqa: F401 - the schemas
        import websockets  # noqa: F401 - the server
    except ImportError as exc:
        raise CommandError(f"{exc.name} is not installed: pip install 'tether[interop]'", prog="tether view") from None
    try:
        asyncio.run(serve(a))
    except (ExposedView, OSError, ValueError) as exc:  # refused binds, ports in use, unreadable certificates
        raise CommandError(exc, prog="tether view") from None
