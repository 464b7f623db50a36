"""Tokens stored hashed, certificates with identities: the files `tether token` / `tether certs` make."""

from __future__ import annotations

import json
import stat

import pytest
from cryptography import x509

from bridge.security.certs import CertError, Identity, identity_from_peercert, identity_from_pem, issue_client
from bridge.security.cli import token_main
from bridge.security.tokens import TokenError, TokenStore
from tests.security.helpers import make_certs


def test_tokens_are_stored_hashed_verified_and_revocable(tmp_path):
    path = tmp_path / "tokens.json"
    store = TokenStore(path)
    token = store.add("alice", role="operator")
    name, _, secret = token.partition(".")
    assert name == "alice" and len(secret) >= 40
    text = path.read_text()
    assert secret not in text and "scrypt" in text               # only the salted hash is on disk
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert store.verify(token).role == "operator"
    assert store.verify(token).name == "alice"                    # cached: same answer
    assert store.verify(f"alice.{secret[:-1]}x") is None          # one character off
    assert store.verify(f"bob.{secret}") is None                  # someone else's name
    for junk in ("", "alice", "alice.", ".x", "a" * 10_000, "al ice.x"):
        assert store.verify(junk) is None
    other = TokenStore(path)                                      # a second reader (the gateway) sees it
    assert other.verify(token) is not None
    with pytest.raises(TokenError, match="exists already"):
        store.add("alice", role="viewer")
    store.revoke("alice")
    assert other.verify(token) is None                            # the change on disk is picked up
    with pytest.raises(TokenError, match="'nobody'"):
        store.revoke("nobody")


def test_tokens_refuse_bad_names_roles_and_files(tmp_path):
    store = TokenStore(tmp_path / "t.json")
    for bad in ("", "a b", "a.b", "x" * 65, "é"):
        with pytest.raises(TokenError, match="token name"):
            store.add(bad, role="viewer")
    with pytest.raises(TokenError, match="'root'"):
        store.add("carol", role="root")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(TokenError, match="cannot read the tokens file"):
        TokenStore(tmp_path / "broken.json")
    (tmp_path / "other.json").write_text(json.dumps({"tokens": {"x": {"role": "viewer"}}}))
    with pytest.raises(TokenError, match="malformed"):
        TokenStore(tmp_path / "other.json")


def test_token_cli_prints_the_token_once(tmp_path, capsys):
    path = tmp_path / "tokens.json"
    token_main(["add", "ci", "--role", "trainer", "--file", str(path)])
    token = capsys.readouterr().out.strip()
    assert TokenStore(path).verify(token).role == "trainer"
    token_main(["list", "--file", str(path)])
    listed = capsys.readouterr().out
    assert "ci" in listed and "trainer" in listed and token.partition(".")[2] not in listed
    with pytest.raises(SystemExit, match="exists already"):
        token_main(["add", "ci", "--role", "trainer", "--file", str(path)])


def test_certs_carry_identities_and_the_server_names(tmp_path):
    certs = make_certs(tmp_path / "certs")
    for name in ("ca.key", "server.key", "arm_1.key", "alice.key"):
        assert stat.S_IMODE((certs / name).stat().st_mode) == 0o600
    assert identity_from_pem((certs / "arm_1.crt").read_bytes()) == Identity("arm_1", "robot")
    assert str(identity_from_pem((certs / "alice.crt").read_bytes())) == "operator:alice"
    assert identity_from_pem((certs / "server.crt").read_bytes()) is None     # no role in its subject
    server = x509.load_pem_x509_certificate((certs / "server.crt").read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} >= {"127.0.0.1", "::1"}
    with pytest.raises(SystemExit, match="already holds a CA"):
        make_certs(certs)
    with pytest.raises(CertError, match="'admin'"):
        issue_client(certs, "eve", role="admin")
    with pytest.raises(CertError, match="client name"):
        issue_client(certs, "../eve", role="robot")
    with pytest.raises(CertError, match="no CA"):
        issue_client(tmp_path / "empty", "eve", role="robot")


def test_identity_from_an_ssl_peercert_dict():
    peer = {"subject": ((("organizationName", "Tether lab"),), (("organizationalUnitName", "operator"),),
                        (("commonName", "alice"),))}
    assert identity_from_peercert(peer) == Identity("alice", "operator")
    assert identity_from_peercert({}) is None and identity_from_peercert(None) is None
    bad = {"subject": ((("organizationalUnitName", "root"),), (("commonName", "alice"),))}
    assert identity_from_peercert(bad) is None
