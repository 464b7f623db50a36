"""`tether cluster certs`: every engine's credentials in one folder, private files private, each secret its own."""

from __future__ import annotations

import ipaddress
import subprocess
import sys

import pytest
from cryptography import x509

from bridge.security.certs import CertError
from bridge.security.lab import ENGINES, NATS_ROLES, TOKEN_ROLES, LabCredentials
from bridge.security.tokens import TokenStore


def test_cluster_certs_writes_every_credential_private_and_distinct(tmp_path):
    folder = tmp_path / "creds"
    done = subprocess.run([sys.executable, "-m", "tether", "cluster", "certs", str(folder), "--host", "198.18.0.7",
                           "--host", "nats.lab"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    creds = LabCredentials(folder)
    for path in folder.rglob("*"):
        mode = path.stat().st_mode & 0o777
        if path.is_dir():
            assert mode == 0o700 or path == folder, (path, oct(mode))
        elif path.suffix == ".crt":
            assert mode == 0o644, (path, oct(mode))
        else:
            assert mode == 0o600, (path, oct(mode))
    ca = x509.load_pem_x509_certificate(creds.ca.read_bytes())
    for engine in (*ENGINES, "gateway"):
        crt, key = creds.server_pair(engine)
        cert = x509.load_pem_x509_certificate(crt.read_bytes())
        cert.verify_directly_issued_by(ca)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert ipaddress.ip_address("198.18.0.7") in names.get_values_for_type(x509.IPAddress), engine
        assert key.exists()
    secrets = [creds.nats_password(r) for r in NATS_ROLES] + [creds.pg_password(r) for r in ("admin", "gateway")]
    secrets += [creds.triton_secret_file.read_text(), creds.rendezvous_id_file.read_text()]
    assert len(set(secrets)) == len(secrets) and all(len(s) >= 32 for s in secrets)
    assert creds.pgpass("gateway").read_text().startswith("*:*:*:tether_gateway:")
    store = TokenStore(creds.tokens_file)
    for name, role in TOKEN_ROLES.items():
        entry = store.verify(creds.token(name))
        assert (entry.name, entry.role) == (name, role)
    for secret in secrets:   # nothing secret is printed
        assert secret not in done.stdout + done.stderr
    with pytest.raises(CertError, match="already holds a CA"):
        LabCredentials.create(folder)
    with pytest.raises(CertError, match="unknown NATS role 'robot'"):
        creds.nats_password_file("robot")
