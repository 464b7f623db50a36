"""NATS JetStream secured (tether.cluster.nats.NatsSecurity) with real nats-server processes on loopback: TLS,
no anonymous users, one bcrypt-hashed user per role with least privilege. Each refusal is asserted by what
the server answers. Then poisoned messages, published with a credential that may publish (the gateway's):
an undecodable body, hostile msg ids (`²`, `1e3`), another session's step id sent ahead of that session. The
trainer source and the archiver count them and go on, the session's Hello still works (`prepare`), and
nothing a client was told is durable is lost or replaced."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl
import time
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bridge.experience.jetstream import (
    MAX_MSG_BYTES,
    MSG_ID,
    STREAM,
    ExperienceStreamError,
    NatsAuth,
    connect,
    subject_of,
)
from bridge.security.tokens import write_private
from protos import experience_pb2
from protos.codec import encode
from tests.support.waiting import until
from tether.cluster.nats import ROLES, NatsCluster, NatsSecurity, nats_server_binary

pytestmark = pytest.mark.skipif(nats_server_binary() is None,
                                reason="nats-server not installed (apt-get install nats-server)")


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject, issuer, public_key, signer, *, ca: bool, extensions=()) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
         .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
         .not_valid_after(now + dt.timedelta(days=2))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
    for ext in extensions:
        b = b.add_extension(ext, critical=False)
    return b.sign(signer, hashes.SHA256())


def _pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_lab(folder: Path, hosts: tuple[str, ...] = ("127.0.0.1",)) -> NatsSecurity:
    """A lab CA, a nats-server certificate for `hosts` (serverAuth and clientAuth: routes are mutual TLS) and a
    random password file per role, in the layout of `tether cluster certs` (NatsSecurity.from_folder)."""
    import secrets

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _cert(_name("test lab CA"), _name("test lab CA"), ca_key.public_key(), ca_key, ca=True)
    sans = [x509.IPAddress(ipaddress.ip_address(h)) for h in hosts] + [x509.DNSName("localhost")]
    server = _cert(_name("nats"), ca.subject, key.public_key(), ca_key, ca=False, extensions=[
        x509.SubjectAlternativeName(sans),
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])])
    write_private(folder / "ca.crt", ca.public_bytes(serialization.Encoding.PEM))
    write_private(folder / "nats-server.crt", server.public_bytes(serialization.Encoding.PEM))
    write_private(folder / "nats-server.key", _pem(key))
    for role in ROLES:
        write_private(folder / "nats" / f"{role}.password", secrets.token_urlsafe(24).encode() + b"\n")
    return NatsSecurity.from_folder(folder)


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> NatsSecurity:
    return make_lab(tmp_path_factory.mktemp("lab"), hosts=("127.0.0.1", "127.0.0.2"))


def _transition(session: str, step: int, value: float) -> experience_pb2.Transition:
    return experience_pb2.Transition(session=session, step=step, policy="tiny",
                                     observation=[encode("observation", np.full(11, value, np.float32))],
                                     action=[encode("action", np.zeros(3, np.float32))])


async def _answered(errors: list, text: str) -> str:
    """The server's asynchronous answer (an -ERR the client's error callback got) containing `text` (nats-py
    lowercases the -ERR line)."""
    text = text.lower()
    await until(lambda: any(text in str(e).lower() for e in errors),
                what=f"the server to answer {text!r} (got {errors})", timeout=10)
    return next(str(e) for e in errors if text in str(e).lower())


def test_refusals_and_least_privilege(lab, tmp_path):
    """Client and route ports on 127.0.0.2 (the monitor on 127.0.0.1), TLS routes between three servers. Refused,
    each by the server's own answer: no credentials, a wrong password, plaintext; the gateway's credentials
    cannot create a consumer or read another role's inbox; the trainer's cannot publish experience, create the
    stream or touch the archiver's consumer. Allowed: gateway publishes, trainer and archiver consume."""
    with NatsCluster(tmp_path / "nats", servers=3, hosts=["127.0.0.2"] * 3, security=lab) as cluster:
        varz = cluster.monitor(0, "varz")
        assert (varz["host"], varz["http_host"], varz["tls_required"]) == ("127.0.0.2", "127.0.0.1", True), varz
        assert all(u.startswith("tls://127.0.0.2:") for u in cluster.urls)
        for i in range(3):
            assert (cluster.directory / cluster.name(i) / "nats.conf").stat().st_mode & 0o777 == 0o600
            config = (cluster.directory / cluster.name(i) / "nats.conf").read_text()
            assert not any(lab.auth(r).password() in config for r in ROLES)  # bcrypt hashes only
        _plaintext_refused(cluster)
        asyncio.run(_refusals(cluster, lab, tmp_path))


def _plaintext_refused(cluster: NatsCluster) -> None:
    """A client that does not start TLS: the server's INFO demands it, and a plaintext CONNECT gets the connection
    closed (no +OK, no PONG) with the handshake error in the server's log."""
    import socket

    host, port = cluster.urls[0].removeprefix("tls://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        info = s.recv(65536)
        assert info.startswith(b"INFO ") and b'"tls_required":true' in info and b'"auth_required":true' in info
        s.sendall(b'CONNECT {"verbose":true,"user":"gateway","pass":"guess"}\r\nPING\r\n')
        answer = b""
        while chunk := s.recv(65536):  # EOF: the server closed it
            answer += chunk
    assert b"+OK" not in answer and b"PONG" not in answer, answer
    assert "TLS handshake error" in cluster.log_path(0).read_text()


async def _refusals(cluster: NatsCluster, lab: NatsSecurity, tmp_path: Path) -> None:
    from nats.js.api import ConsumerConfig, StreamConfig

    from bridge.experience.archive import Archiver
    from bridge.experience.jetstream_log import JetStreamLog
    from trainer.nats_source import JetStreamSource

    with pytest.raises(ExperienceStreamError, match="Authorization Violation"):
        await connect(cluster.urls, name="anonymous", auth=NatsAuth(ca=lab.ca))
    wrong = tmp_path / "wrong.password"
    write_private(wrong, b"not-the-password\n")
    with pytest.raises(ExperienceStreamError, match="Authorization Violation") as refused:
        await connect(cluster.urls, name="guess", auth=NatsAuth(user="gateway", password_file=wrong, ca=lab.ca))
    assert "not-the-password" not in str(refused.value)
    with pytest.raises(ExperienceStreamError, match="CERTIFICATE_VERIFY_FAILED"):  # a server it cannot verify
        await connect(cluster.urls, name="no-ca", auth=NatsAuth(user="gateway", password_file=lab.passwords[
            "gateway"], ca=Path(ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt")))

    errors: list[Exception] = []
    gw = await connect(cluster.urls, name="gateway", auth=lab.auth("gateway"), on_error=errors.append)
    tr = await connect(cluster.urls, name="trainer", auth=lab.auth("trainer"), on_error=errors.append)
    try:
        assert gw.max_payload == MAX_MSG_BYTES
        info = await gw.jetstream().stream_info(STREAM)  # made by the admin at start
        assert (info.config.max_msg_size, info.config.num_replicas) == (MAX_MSG_BYTES, 3)
        with pytest.raises(Exception):  # noqa: B017, PT011 - the refusal itself is the server's -ERR below
            await gw.jetstream(timeout=1.0).add_consumer(STREAM, ConsumerConfig(durable_name="gateway-reads"))
        await _answered(errors, 'Permissions Violation for Publish to "$JS.API.CONSUMER.DURABLE.CREATE.'
                                'TETHER_EXPERIENCE.gateway-reads"')
        await gw.subscribe("_INBOX.trainer.>")
        await _answered(errors, 'Permissions Violation for Subscription to "_INBOX.trainer.>"')
        await tr.publish(subject_of("robot-x"), b"injected")
        await _answered(errors, 'Permissions Violation for Publish to "tether.experience.robot-x"')
        with pytest.raises(Exception):  # noqa: B017, PT011
            await tr.jetstream(timeout=1.0).add_stream(StreamConfig(name="MINE", subjects=["mine.>"]))
        await _answered(errors, 'Permissions Violation for Publish to "$JS.API.STREAM.CREATE.MINE"')
        with pytest.raises(Exception):  # noqa: B017, PT011
            await tr.jetstream(timeout=1.0).consumer_info(STREAM, "tether-archive")
        await _answered(errors, 'Permissions Violation for Publish to "$JS.API.CONSUMER.INFO.TETHER_EXPERIENCE.'
                                'tether-archive"')
    finally:
        await gw.close()
        await tr.close()

    async with JetStreamLog(cluster.url, auth=lab.auth("gateway")) as log:  # what each role may do, it can
        await asyncio.gather(*(log.append(_transition(f"robot-{i % 2}", i // 2, i)) for i in range(20)))
        assert log.stats.durable == 20 and log.stats.foreign_duplicates == 0
    source = await asyncio.to_thread(JetStreamSource, cluster.url, durable="trainer-r0", auth=lab.auth("trainer"))
    try:
        got = []
        while len(got) < 20:
            got += await asyncio.to_thread(source.poll, timeout=5.0)
        assert sorted(t.offset for t in got) == list(range(20)) and source.poisoned == 0
        assert await asyncio.to_thread(source.commit) == 20
    finally:
        await asyncio.to_thread(source.close)
    archiver = Archiver(cluster.url, tmp_path / "archive", auth=lab.auth("archiver"))
    assert await archiver.run(until_caught_up=True) == 20


def test_poisoned_messages_are_counted_and_passed_over(triton, lab, tmp_path):
    """With the gateway's credential (it may publish): an undecodable body under msg id `robot-a:²`, a good body
    under `robot-a:1e3`, a message on robot-a's subject carrying robot-b's future msg id, and a forged future
    step `robot-a:16`. A gateway resuming robot-a says Hello (the last message of its subject is the `²` one:
    not trusted, counted); the stream's duplicate PubAcks for robot-b's step 2 and robot-a's step 16 are
    not durability (counted; sent again until the duplicate window passed), so the clients' real steps are
    all in the stream; the trainer source and the archiver count the three poisoned messages and go on."""
    with NatsCluster(tmp_path / "nats", servers=1, security=lab) as cluster:
        cluster.create_stream(duplicate_window_s=WINDOW_S)
        asyncio.run(_poisoned(triton, cluster, lab, tmp_path))


WINDOW_S = 3.0  # the stream's duplicate window here: a forged msg id blocks the real step at most this long


async def _steps(s, start: int, value, until) -> int:
    """Steps `s` from `start` (observation `value(step)`) until `until(s)` holds after a reply; the next step."""
    from protos import bridge_pb2

    step, deadline = start, time.monotonic() + 60
    while True:
        obs = bridge_pb2.Observation(step=step, step_type=bridge_pb2.FIRST if step == 0 else bridge_pb2.MID,
                                     episode=0, reward=1.0, t_sent_ns=time.time_ns(),
                                     tensors=[encode("observation", np.full(11, value(step), np.float32))])
        reply = await s.step(obs)
        assert reply.WhichOneof("kind") == "action", reply
        step += 1
        if until(s):
            return step
        assert time.monotonic() < deadline, f"{s.id}: not there after 60 s of steps (durable {s.durable_through})"
        await asyncio.sleep(0.02)


async def _poisoned(triton, cluster: NatsCluster, lab: NatsSecurity, tmp_path: Path) -> None:
    from bridge.client import Session
    from bridge.experience import read_transitions
    from bridge.experience.archive import Archiver
    from protos.codec import decode
    from tests.conftest import ACT, OBS
    from tests.gateway.helpers import hello
    from tests.support.gateways import running_gateway
    from trainer.nats_source import JetStreamSource

    config = dict(policy=triton.policy, experience_url=cluster.url, nats_user="gateway",
                  nats_password_file=lab.passwords["gateway"], nats_ca=lab.ca)
    a_value, b_value = (lambda k: 1000.0 + k), (lambda k: 2000.0 + k)
    async with running_gateway(triton.url, **config) as gateway:
        async with Session(gateway.address, hello("robot-a", obs=OBS, act=ACT), reply_timeout_s=30.0) as s:
            sent = await _steps(s, 0, a_value, lambda s: s.durable_through >= 9)

    attacker = await connect(cluster.urls, name="attacker", auth=lab.auth("gateway"))
    js = attacker.jetstream(timeout=5.0)

    async def publish(session_subject: str, data: bytes, msg_id: str) -> None:
        ack = await js.publish(subject_of(session_subject), data, headers={MSG_ID: msg_id})
        assert not ack.duplicate

    try:
        await publish("robot-a", _transition("robot-a", 5, 555.0).SerializeToString(), "robot-a:1e3")
        await publish("robot-a", b"\xff\xff\xff\xff", "robot-a:\u00b2")  # "²".isdigit() is True; int("²") fails
        async with running_gateway(triton.url, **config) as gateway:  # another gateway: robot-a resumes there
            stream_log = gateway.experience
            async with Session(gateway.address, hello("robot-a", obs=OBS, act=ACT), reply_timeout_s=30.0) as a:
                assert a.welcome.logging and stream_log.stats.untrusted == 1  # Hello read the `²` message, ignored it
                # the last step sent to the first gateway again (its transition needs the next observation)
                at = await _steps(a, sent - 1, a_value, lambda a: a.durable_through >= sent + 2)
                forged = at + 4  # a step robot-a has not sent yet, and robot-b's step 2
                await publish("robot-a", _transition("robot-a", forged, 777.0).SerializeToString(), f"robot-a:{forged}")
                await publish("robot-a", _transition("robot-b", 2, 777.0).SerializeToString(), "robot-b:2")
                async with Session(gateway.address, hello("robot-b", obs=OBS, act=ACT), reply_timeout_s=30.0) as b:
                    await asyncio.gather(_steps(a, at, a_value, lambda a: a.durable_through >= forged + 10),
                                         _steps(b, 0, b_value, lambda b: b.durable_through >= 10))
                    told = {"robot-a": a.durable_through, "robot-b": b.durable_through}
            stats = stream_log.stats
            exposition = gateway.figures.metrics.exposition().decode()  # what /metrics serves
            exported = dict(line.rsplit(" ", 1) for line in exposition.splitlines()
                            if line.startswith("tether_stream_"))
            assert float(exported["tether_stream_foreign_duplicates_total"]) >= max(2, stats.foreign_duplicates)
            assert float(exported["tether_stream_untrusted_total"]) == 1.0
    finally:
        await attacker.close()

    source = await asyncio.to_thread(JetStreamSource, cluster.url, durable="trainer-r0", auth=lab.auth("trainer"))
    try:
        info_nc = await connect(cluster.urls, name="info", auth=lab.auth("trainer"))
        last = (await info_nc.jetstream().stream_info(STREAM)).state.last_seq
        await info_nc.close()
        while source.next_offset < last:  # received (next_offset), then everything received taken (polled)
            await asyncio.to_thread(source.poll, timeout=1.0)
        while await asyncio.to_thread(source.poll, timeout=0.5):
            pass
        assert source.poisoned == 3, source.poisoned  # robot-b's id on robot-a's subject, `1e3`, `²`
        assert await asyncio.to_thread(source.commit) == last
    finally:
        await asyncio.to_thread(source.close)

    archiver = Archiver(cluster.url, tmp_path / "archive", auth=lab.auth("archiver"))
    written = await archiver.run(until_caught_up=True)
    assert archiver.poisoned == 3 and written == last - 3, (archiver.poisoned, written, last)
    values: dict[tuple[str, int], list[float]] = {}
    for t in read_transitions(tmp_path / "archive"):
        values.setdefault((t.session, t.step), []).append(float(decode(t.observation[0])[0]))
    for session, value in (("robot-a", a_value), ("robot-b", b_value)):
        for k in range(told[session] - 1):  # every step a client was told is durable: its own observation
            assert value(k) in values.get((session, k), []), (session, k, values.get((session, k)))
    assert values[("robot-a", forged)] == [777.0, a_value(forged)]  # the forgery is data; the real step is there
    assert stats.foreign_duplicates >= 2 and stats.fenced == 0, stats  # the gateway saw both forged ids
