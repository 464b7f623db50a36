"""What a host on the lab network with no credential gets from each engine: one JSON line of answers.

    python -m tests.hosts.outsider --triton H:P --gateway H:P --ca ca.crt --postgres H:P --nats tls://H:P \
        --rendezvous H:P
    # {"triton_infer": "...", "triton_load": "...", "gateway_session": "...", "postgres": "...", ...}

Every probe returns the engine's own answer (its error text, or "ALLOWED: ..." if it did what was asked),
so the test asserts what each engine said, never that something timed out. Probes are bounded: one try
each, a short connect timeout. Run inside the outsider host (`Host.popen`), never from the machine itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import numpy as np


def _answer(probe) -> str:
    try:
        return f"ALLOWED: {probe()}"
    except Exception as exc:  # noqa: BLE001 - the engine's refusal is the result
        return f"{type(exc).__name__}: {exc}"[:600]


def triton_infer(address: str) -> str:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(address)
    data = grpcclient.InferInput("observation", [1, 11], "FP32")
    data.set_data_from_numpy(np.zeros((1, 11), np.float32))
    return str(client.infer("tiny", [data], client_timeout=5.0).as_numpy("action"))


def triton_load(address: str) -> str:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(address)
    client.load_model("tiny", client_timeout=5.0)
    return "loaded"


def triton_index(address: str) -> str:
    import tritonclient.grpc as grpcclient

    return str(grpcclient.InferenceServerClient(address).get_model_repository_index(client_timeout=5.0))


def gateway_session(address: str, ca: str | None, token: str | None) -> str:
    from bridge.client import Credentials, Session
    from tests.fleet.clients import hello, observation

    async def run() -> str:
        creds = Credentials(ca=ca, token=token)
        async with Session([address], hello("outsider-0", "outsider"), credentials=creds, connect_timeout_s=5.0,
                           reply_timeout_s=5.0) as s:
            reply = await s.step(observation(0, np.random.default_rng(0)))
            return f"step answered by {s.welcome.gateway_id}: {reply.WhichOneof('kind')}"
    return asyncio.run(run())


def plaintext(address: str) -> str:
    """A plaintext HTTP/2 (gRPC) preface to a TLS port: what comes back (a TLS alert record starts 0x15)."""
    import socket

    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(9))
        reply = s.recv(64)
    return f"reply {reply[:7].hex()}" if reply else "closed without a reply"


def postgres(address: str, sslmode: str) -> str:
    """Log in as the admin with a guessed password (over TLS, or in plaintext with sslmode=disable)."""
    import psycopg

    host, port = address.rsplit(":", 1)
    psycopg.connect(host=host, port=int(port), user="tether", password="guess", dbname="tether", connect_timeout=5,
                    sslmode=sslmode).close()
    return "connected as tether"


def nats(url: str, ca: str | None, action: str) -> str:
    import ssl

    import nats as natspy

    async def run() -> str:
        tls = ssl.create_default_context(cafile=ca) if ca else None
        nc = await natspy.connect(servers=[url], tls=tls, connect_timeout=5, max_reconnect_attempts=0,
                                  allow_reconnect=False)
        try:
            if action == "publish":
                ack = await nc.jetstream().publish("tether.experience.outsider", b"forged", timeout=5)
                return f"published seq {ack.seq}"
            sub = await nc.subscribe("tether.experience.>")
            await nc.flush(timeout=5)
            msg = await sub.next_msg(timeout=2)
            return f"received {msg.subject}"
        finally:
            await nc.close()
    return asyncio.run(run())


def rendezvous(address: str) -> str:
    from datetime import timedelta

    from torch.distributed import TCPStore

    host, port = address.rsplit(":", 1)
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=5), wait_for_workers=False)
    store.set("torch.rendezvous.forged", b"x")
    return "wrote a key"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.hosts.outsider")
    p.add_argument("--triton", default="")
    p.add_argument("--gateway", default="")
    p.add_argument("--ca", default=None, help="the lab CA (public): an outsider may well have it")
    p.add_argument("--token", default=None, help="a credential of another role, to show it does not suffice")
    p.add_argument("--postgres", default="")
    p.add_argument("--nats", default="")
    p.add_argument("--rendezvous", default="")
    a = p.parse_args(argv)
    out = {}
    if a.triton:
        out |= {"triton_infer": _answer(lambda: triton_infer(a.triton)),
                "triton_load": _answer(lambda: triton_load(a.triton)),
                "triton_index": _answer(lambda: triton_index(a.triton))}
    if a.gateway:
        out |= {"gateway_plaintext": _answer(lambda: plaintext(a.gateway)),
                "gateway_no_token": _answer(lambda: gateway_session(a.gateway, a.ca, None))}
        if a.token:
            out["gateway_other_role"] = _answer(lambda: gateway_session(a.gateway, a.ca, a.token))
    if a.postgres:
        out |= {"postgres_tls": _answer(lambda: postgres(a.postgres, "require")),
                "postgres_plaintext": _answer(lambda: postgres(a.postgres, "disable"))}
    if a.nats:
        out |= {"nats_publish": _answer(lambda: nats(a.nats, a.ca, "publish")),
                "nats_subscribe": _answer(lambda: nats(a.nats, a.ca, "subscribe"))}
    if a.rendezvous:
        out["rendezvous"] = _answer(lambda: rendezvous(a.rendezvous))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
