"""Server certificates for the fleet's other engines (PostgreSQL, NATS, Triton), signed by a lab CA
(bridge.security.certs):

    init_certs(Path("creds"))                                            # the CA (and the gateways' server.crt)
    crt, key = issue_server(Path("creds"), "postgres-server", hosts=["198.18.0.3", "db.lab"])
    # creds/postgres-server.crt (0644), creds/postgres-server.key (0600): `ssl_cert_file` / `ssl_key_file`

Each names 127.0.0.1, ::1, localhost and `hosts` (IP addresses or DNS names), so a client checking
`sslmode=verify-full` (or a TLS client verifying host names) finds the address it dialled in it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bridge.security.certs import LEAF_DAYS, CertError, _cert, _key, _load_ca, _san, _write_pair

__all__ = ["issue_server"]

_STEM = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def issue_server(folder: Path, stem: str, hosts: Iterable[str] = (), *, client_auth: bool = False,
                 org: str = "Tether lab") -> tuple[Path, Path]:
    """STEM.crt and STEM.key in `folder`: a server certificate for 127.0.0.1, ::1, localhost and `hosts`, signed by
    the CA in `folder` (CertError when there is none, or `stem` would replace the CA or the gateways' pair).
    `client_auth`: usable as a client certificate too (e.g. NATS servers dialling each other's cluster routes)."""
    folder = Path(folder)
    if not _STEM.fullmatch(stem or "") or stem in ("ca", "server"):
        raise CertError(f"certificate name {stem!r} must be 1..63 of a-z 0-9 - (not 'ca' or 'server')")
    names = list(dict.fromkeys(_san(h) for h in ("127.0.0.1", "::1", "localhost", *hosts)))
    ca, ca_key = _load_ca(folder)
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"tether-{stem}")])
    cert = _cert(subject, ca.subject, key.public_key(), ca_key, days=LEAF_DAYS, ca=False, extensions=[
        x509.SubjectAlternativeName(names),
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, *[ExtendedKeyUsageOID.CLIENT_AUTH] * client_auth]),
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())])
    return _write_pair(folder, stem, cert, key)
