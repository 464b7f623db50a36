"""The c10d rendezvous store of an elastic trainer, as a process of its own.

torchrun's c10d rendezvous keeps its state in a `TCPStore`. By default the agent on the
endpoint's host serves it, and that node then cannot die without taking the rendezvous with it.
Run the store here instead (the `rendezvous` role of `tether cluster up` and `deploy/`) and give
every node `--rdzv-external`: then any trainer node may die and come back.

    python -m trainer.rendezvous --new-id-file runs/rendezvous.id   # a random run id, 0600 (once per run)
    python -m trainer.rendezvous --host 198.18.0.5 --port 29400
    # prints "rendezvous listening on 198.18.0.5:29400", serves until SIGTERM / SIGINT
    tether train --nnodes 1:2 --rdzv-endpoint 198.18.0.5:29400 --rdzv-id-file runs/rendezvous.id \\
        --rdzv-external ...   # on each node

The store listens on exactly `--host` (torch's own `TCPStore(host, ...)` listens on every
interface whatever host it is given): the socket is bound here and handed to the store. The store
has no authentication and torch's dynamic rendezvous unpickles the state it reads from it, so
whoever can connect can run code on every trainer node: keep it on the trainers' own network
(docs/security.md). The run id is not a credential (the store lists its keys to anyone); it keeps
runs apart and out of command lines. `--port 0` takes a free port (the printed line says which).

    >>> store = serve("127.0.0.1", 0)
    >>> store.set("k", "v"); store.get("k")
    b'v'
    >>> serve("127.0.0.1", store.port)
    Traceback (most recent call last):
    ...
    OSError: [Errno 98] rendezvous cannot listen on 127.0.0.1:...: Address already in use
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import signal
import socket
import sys
import threading
from datetime import timedelta
from pathlib import Path

from bridge.common.files import read_ascii

__all__ = ["RUN_ID", "listen", "main", "new_run_id", "parser", "read_run_id", "serve"]

READY = "rendezvous listening on "
RUN_ID = re.compile(r"[A-Za-z0-9_-]{16,128}")  # what --rdzv-id-file may hold


def listen(host: str, port: int, *, backlog: int = 512) -> socket.socket:
    """A TCP socket bound to exactly host:port (0: a free port) and listening; OSError naming the address."""
    if not 0 <= port < 65536:
        raise ValueError(f"rendezvous port {port} is not in [0, 65535]")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise ValueError(f"rendezvous host {host!r} does not resolve: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart within TIME_WAIT
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"rendezvous cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def serve(host: str, port: int):
    """A c10d `TCPStore` server listening on exactly host:port (0: a free port); keep the returned store alive."""
    from torch.distributed import TCPStore

    sock = listen(host, port)
    bound = sock.getsockname()[1]
    fd = sock.detach()  # the store owns the descriptor from here (and closes it when it goes)
    try:
        return TCPStore(host, bound, is_master=True, multi_tenant=True, wait_for_workers=False,
                        timeout=timedelta(seconds=60), master_listen_fd=fd, use_libuv=True)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def new_run_id() -> str:
    """32 random url-safe characters."""
    return secrets.token_urlsafe(24)


def read_run_id(path: Path | str) -> str:
    """The run id in the file `path` (stripped); ValueError naming the file, never its content."""
    text = read_ascii(path, what="rendezvous id")
    if not RUN_ID.fullmatch(text):
        raise ValueError(f"the rendezvous id file {str(path)!r} must hold 16-128 characters of A-Z a-z 0-9 - _ "
                         f"(it holds {len(text)} characters)")
    return text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.rendezvous",
                                description="Serve the c10d rendezvous store of an elastic `tether train`.")
    p.add_argument("--host", default="127.0.0.1", help="the one address to listen on (the pod's or the trainer "
                   "network's address; 0.0.0.0 listens on every interface)")
    p.add_argument("--port", type=int, default=29400, help="port (0: a free one)")
    p.add_argument("--new-id-file", type=Path, metavar="PATH", help="write a new random run id to PATH (mode 0600) "
                   "for `tether train --rdzv-id-file`, and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.new_id_file is not None:
        from bridge.security.tokens import write_private

        write_private(args.new_id_file, (new_run_id() + "\n").encode())
        print(f"rendezvous id written to {args.new_id_file}", flush=True)
        return 0
    try:
        store = serve(args.host, args.port)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"python -m trainer.rendezvous: {exc}") from None
    print(f"{READY}{args.host}:{store.port}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
