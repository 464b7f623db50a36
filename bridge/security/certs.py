"""A local certificate authority for a lab: one CA, a server certificate, client certificates whose
subject carries the identity (CN=arm_1) and the role (OU=robot | operator | trainer | viewer).

    paths = init_certs(Path("runs/certs"), hosts=["gw.lab"], clients=[("arm_1", "robot"), ("alice", "operator")])
    issue_client(Path("runs/certs"), "arm_2", role="robot")      # later, with the same CA
    identity_from_pem(Path("runs/certs/arm_1.crt").read_bytes())  # -> Identity(name="arm_1", role="robot")

Files in the folder: ca.crt, ca.key, server.crt, server.key, NAME.crt, NAME.key (keys mode 0600,
EC P-256). The server certificate names 127.0.0.1, ::1 and localhost plus the given hosts.
"""

from __future__ import annotations

import datetime as dt
import functools
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bridge.security.tokens import write_private

CERT_ROLES = ("robot", "operator", "trainer", "viewer")
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
HOST = re.compile(r"[A-Za-z0-9.*-]{1,253}")
CA_DAYS, LEAF_DAYS = 3650, 825


class CertError(ValueError):
    """A bad name, role or host, or a CA folder that is missing or would be overwritten."""


@dataclass(frozen=True)
class Identity:
    """Who a verified certificate says its holder is: e.g. Identity("arm_1", "robot") -> "robot:arm_1"."""

    name: str
    role: str

    def __str__(self) -> str:
        return f"{self.role}:{self.name}"


def _check_client(name: str, role: str) -> None:
    if name in ("ca", "server") or not NAME.fullmatch(name or "") or name.startswith("."):
        raise CertError(f"client name must be 1-64 of A-Z a-z 0-9 . _ - (not 'ca' or 'server'), got {name!r}")
    if role not in CERT_ROLES:
        raise CertError(f"client role must be one of {', '.join(CERT_ROLES)}; got {role!r}")


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        if not HOST.fullmatch(host):
            raise CertError(f"not a host name or IP address: {host!r}") from None
        return x509.DNSName(host)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject: x509.Name, issuer: x509.Name, public_key, signer, *, days: int, ca: bool,
          extensions: Iterable[x509.ExtensionType] = ()) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
         .serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False,
                                          data_encipherment=False, key_agreement=False, encipher_only=False,
                                          decipher_only=False), critical=True)
    for ext in extensions:
        b = b.add_extension(ext, critical=False)
    return b.sign(signer, hashes.SHA256())


def _write_pair(folder: Path, stem: str, cert: x509.Certificate, key) -> tuple[Path, Path]:
    crt, pem = folder / f"{stem}.crt", folder / f"{stem}.key"
    write_private(pem, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
    write_private(crt, cert.public_bytes(serialization.Encoding.PEM))
    crt.chmod(0o644)
    return crt, pem


def _load_ca(folder: Path):
    try:
        ca = x509.load_pem_x509_certificate((folder / "ca.crt").read_bytes())
        key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise CertError(f"no CA in {folder} (run `tether certs init {folder}` first): {exc.filename}") from None
    return ca, key


def init_certs(folder: Path, *, hosts: Iterable[str] = (), clients: Iterable[tuple[str, str]] = (),
               force: bool = False, org: str = "Tether lab") -> dict[str, Path]:
    """Make a CA, a server certificate for 127.0.0.1/::1/localhost + `hosts`, and one client certificate
    per (name, role). Refuses to replace an existing CA unless `force`. Returns name -> path."""
    folder = Path(folder)
    clients = list(clients)
    for name, role in clients:
        _check_client(name, role)
    names = [_san(h) for h in ("127.0.0.1", "::1", "localhost", *hosts)]
    if (folder / "ca.key").exists() and not force:
        raise CertError(f"{folder} already holds a CA (ca.key): pass --force to replace it and every certificate")
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"{org} CA")])
    ca = _cert(ca_name, ca_name, ca_key.public_key(), ca_key, days=CA_DAYS, ca=True)
    out = dict(zip(("ca.crt", "ca.key"), _write_pair(folder, "ca", ca, ca_key), strict=True))
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                         x509.NameAttribute(NameOID.COMMON_NAME, "tether-gateway")])
    server = _cert(subject, ca.subject, key.public_key(), ca_key, days=LEAF_DAYS, ca=False, extensions=[
        x509.SubjectAlternativeName(list(dict.fromkeys(names))),
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())])
    out.update(zip(("server.crt", "server.key"), _write_pair(folder, "server", server, key), strict=True))
    for name, role in clients:
        out.update(issue_client(folder, name, role=role, org=org))
    return out


def issue_client(folder: Path, name: str, *, role: str, org: str = "Tether lab") -> dict[str, Path]:
    """A client certificate CN=name, OU=role signed by the CA in `folder`: NAME.crt and NAME.key."""
    _check_client(name, role)
    folder = Path(folder)
    ca, ca_key = _load_ca(folder)
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                         x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = _cert(subject, ca.subject, key.public_key(), ca_key, days=LEAF_DAYS, ca=False, extensions=[
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())])
    crt, pem = _write_pair(folder, name, cert, key)
    return {f"{name}.crt": crt, f"{name}.key": pem}


def _identity(cn: str | None, ou: str | None) -> Identity | None:
    if not cn or not NAME.fullmatch(cn) or ou not in CERT_ROLES:
        return None
    return Identity(cn, ou)


@functools.lru_cache(maxsize=1024)
def identity_from_pem(pem: bytes) -> Identity | None:
    """The identity in a (verified) certificate's subject, or None if it names no known role."""
    try:
        subject = x509.load_pem_x509_certificate(pem).subject
    except ValueError:
        return None

    def first(oid) -> str | None:
        attrs = subject.get_attributes_for_oid(oid)
        return str(attrs[0].value) if attrs else None

    return _identity(first(NameOID.COMMON_NAME), first(NameOID.ORGANIZATIONAL_UNIT_NAME))


def identity_from_peercert(peercert: Mapping | None) -> Identity | None:
    """The identity in `ssl.SSLSocket.getpeercert()`'s dict (empty when the peer sent no verified cert)."""
    if not peercert:
        return None
    fields: dict[str, str] = {}
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            fields.setdefault(key, value)
    return _identity(fields.get("commonName"), fields.get("organizationalUnitName"))
