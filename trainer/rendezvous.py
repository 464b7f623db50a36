"""The c10d rendezvous store of an elastic trainer, as a process of its own.

torchrun's c10d rendezvous keeps its state in a `TCPStore`. By default the agent on the
endpoint's host serves it, and that node then cannot die without taking the rendezvous with it.
Run the store here instead (the `rendezvous` role of `tether cluster up` and `deploy/`) and give
every node `--rdzv-external`: then any trainer node may die and come back.

    python -m trainer.rendezvous --host 127.0.0.1 --port 29400
    # prints "rendezvous listening on 127.0.0.1:29400", serves until SIGTERM / SIGINT
    tether train --nnodes 1:2 --rdzv-endpoint 127.0.0.1:29400 --rdzv-external ...   # on each node

`--port 0` takes a free port (the printed line says which).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from datetime import timedelta

__all__ = ["main", "parser", "serve"]

READY = "rendezvous listening on "


def serve(host: str, port: int):
    """A c10d `TCPStore` server on host:port (0: a free port); keep the returned store alive."""
    from torch.distributed import TCPStore

    if not 0 <= port < 65536:
        raise ValueError(f"rendezvous port {port} is not in [0, 65535]")
    return TCPStore(host, port, is_master=True, multi_tenant=True, wait_for_workers=False,
                    timeout=timedelta(seconds=60))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.rendezvous",
                                description="Serve the c10d rendezvous store of an elastic `tether train`.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 in a pod)")
    p.add_argument("--port", type=int, default=29400, help="port (0: a free one)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    store = serve(args.host, args.port)
    print(f"{READY}{args.host}:{store.port}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
