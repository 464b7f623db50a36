"""PostgreSQL secured (tether.cluster.postgres, bridge.registry.roles): scram-sha-256 and TLS, refusals as the server
answers them, the gateways' least-privilege role running the registry and refused everything else, passwords nowhere
but their 0600 passfiles. One real PostgreSQL 15 for the module, its certificate from a lab CA made here."""

from __future__ import annotations

import argparse
import os
import pwd
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from bridge.gateway.config import add_arguments, from_arguments
from bridge.registry import Registry, RegistryError, RegistryUnavailable, State
from bridge.registry.backends import PostgresBackend, connect, shown, with_passfile
from bridge.registry.follow import EpochFollower, LeaderLock
from bridge.registry.migrations import GATEWAY_PRIVILEGES, MIGRATIONS, grant, latest
from bridge.registry.ownership import open_ownership
from bridge.registry.replicas import ReplicaVerifications
from bridge.registry.roles import read_passfile, write_passfile
from bridge.security.certs import init_certs
from bridge.security.engine_certs import issue_server
from tests.registry.helpers import add, serving
from tests.support.hosts import Lab, namespaces_possible
from tests.support.processes import command_lines
from tests.support.waiting import wait_until
from tether.cluster.postgres import PostgresServer, postgres_bin_dir

pytestmark = pytest.mark.skipif(postgres_bin_dir() is None, reason="PostgreSQL's initdb is not installed "
                                "(/usr/lib/postgresql/*/bin/initdb; Debian package postgresql)")


@pytest.fixture(scope="module")
def pg(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pgsec")
    init_certs(folder / "creds")
    crt, key = issue_server(folder / "creds", "postgres-server")
    with PostgresServer(folder / "pg", tls_cert=crt, tls_key=key, tls_ca=folder / "creds" / "ca.crt") as server:
        yield server


def _refusal(url: str, **kwargs) -> str:
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(url, connect_timeout=5, **kwargs).close()
    return str(refused.value)


def test_without_the_password_or_tls_the_server_refuses(pg, tmp_path):
    url, passfile = pg.client("gateway")
    wrong = tmp_path / "wrong.pgpass"
    write_passfile(wrong, "tether_gateway", "not-the-password")
    assert 'password authentication failed for user "tether_gateway"' in _refusal(url, passfile=str(wrong))
    # no password at all: the server asks for one (SCRAM) and libpq has none to give
    assert "no password supplied" in _refusal(url, passfile=str(tmp_path / "none"))
    # TCP without TLS, even with the right password: no pg_hba.conf line admits it
    plain = url.split("?")[0] + "?sslmode=disable"
    assert ('no pg_hba.conf entry for host "127.0.0.1", user "tether_gateway", database "tether", no encryption'
            in _refusal(plain, passfile=str(passfile)))
    # the admin over the socket with a wrong password: refused too (no trust left anywhere)
    admin_wrong = tmp_path / "admin-wrong.pgpass"
    write_passfile(admin_wrong, "tether", "not-the-password")
    assert 'password authentication failed for user "tether"' in _refusal(
        f"postgresql://tether@/tether?host={pg.socket_dir}&port={pg.port}", passfile=str(admin_wrong))
    log = pg.log_path.read_text()
    assert 'FATAL:  password authentication failed for user "tether_gateway"' in log
    assert "no encryption" in log


def test_verify_full_against_the_lab_ca_and_not_another(pg, tmp_path):
    url, passfile = pg.client("gateway")
    assert "sslmode=verify-full" in url and "sslrootcert=" in url and "passfile" not in url
    with psycopg.connect(url, passfile=str(passfile)) as conn:
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)
        assert conn.execute("SELECT current_user").fetchone() == ("tether_gateway",)
    init_certs(tmp_path / "other")
    other = url.replace(re.search(r"sslrootcert=([^&]+)", url)[1], str(tmp_path / "other" / "ca.crt"))
    assert "certificate verify failed" in _refusal(other, passfile=str(passfile))


def test_the_gateway_role_runs_the_registry(pg):
    with Registry(pg.url) as registry:
        assert registry.where == shown(pg.url) and "tether_gateway@" in registry.where
        if not registry.versions("hopper"):
            serving(registry)
        top = max(r.version for r in registry.versions("hopper"))
        add(registry, top + 1)
        registry.record_gate("hopper", top + 1, [{"name": "integrity", "passed": True, "figures": {}, "detail": ""}])
        registry.move("hopper", top + 1, State.GATED, who="gate", why="passed")
        registry.move("hopper", top + 1, State.LIVE, who="operator:ada", why="promote")       # promote
        assert registry.rollout("hopper").live == top + 1
        registry.pin("hopper", "session=s1", top + 1, who="operator:ada", why="hold")
        registry.pin("hopper", "session=s1", None, who="operator:ada", why="unhold")
        record, changed = registry.estop("robot=arm_1", who="operator:ada", why="person in the cell")  # e-stop
        assert changed and [r.id for r in registry.standing_estops()] == [record.id]
        assert registry.release("robot=arm_1", who="operator:ada", why="clear")[1]
        assert registry.events("hopper")[-1].kind == "pin"
        rows = ReplicaVerifications.beside(registry)
        try:
            rows.record("hopper", top + 1, "127.0.0.1:8001", "ok")
            assert rows.latest("hopper", top + 1)["127.0.0.1:8001"].ok
        finally:
            rows.close()
    owners = open_ownership(pg.url)                                          # session claims
    try:
        first = owners.claim(f"robot-{top}", owner="gw-a")
        assert owners.claim(f"robot-{top}", owner="gw-b").epoch == first.epoch + 1
        assert owners.stale({(f"robot-{top}", first.epoch)}) == {(f"robot-{top}", first.epoch)}
    finally:
        owners.close()
    leader = LeaderLock(pg.url, retry_s=0.05).start(wait_s=5)                # advisory lock: the leader
    seen = []
    follower = EpochFollower(pg.url, on_change=seen.append, poll_s=5.0).start()   # LISTEN/NOTIFY
    try:
        assert leader.held
        with Registry(pg.url) as registry:
            registry.record_event(kind="note", who="operator:ada", why="wake the follower")
            epoch = registry.epoch()
        wait_until(lambda: epoch in seen, what="the follower to see the NOTIFYed epoch")
    finally:
        follower.stop()
        leader.stop()


FORBIDDEN = {
    "CREATE TABLE x (a int)": "permission denied for schema public",
    "CREATE TEMP TABLE y (a int)": 'permission denied to create temporary tables in database "tether"',
    "CREATE FUNCTION f() RETURNS int AS 'SELECT 1' LANGUAGE sql": "permission denied for schema public",
    "CREATE SCHEMA s": 'permission denied for database tether',
    "DROP TABLE versions": "must be owner of table versions",
    "ALTER TABLE estops ADD COLUMN x int": "must be owner of table estops",
    "COPY (SELECT 1) TO PROGRAM 'id'": "must be superuser or have privileges of the pg_execute_server_program role",
    "SELECT rolpassword FROM pg_authid": "permission denied for table pg_authid",
    "SELECT pg_read_file('/etc/passwd')": "permission denied for function pg_read_file",
    "DELETE FROM events": "permission denied for table events",                  # the audit log: append only
    "UPDATE replica_verifications SET result = 'ok'": "permission denied for table replica_verifications",
    "ALTER ROLE tether_gateway SUPERUSER": "must be superuser to alter superuser roles",
    "CREATE ROLE intruder": "permission denied to create role",
}


@pytest.mark.parametrize("statement", FORBIDDEN)
def test_the_gateway_role_is_refused_what_it_does_not_need(pg, statement):
    with psycopg.connect(pg.url, autocommit=True) as conn, pytest.raises(psycopg.Error) as refused:
        conn.execute(statement)
    assert FORBIDDEN[statement] in str(refused.value)


def test_the_gateway_role_is_no_owner_and_has_exactly_its_privileges(pg):
    with psycopg.connect(pg.admin_url) as conn:
        role = conn.execute("SELECT rolsuper, rolcreatedb, rolcreaterole, rolinherit, rolreplication, rolbypassrls, "
                            "rolcanlogin FROM pg_roles WHERE rolname = 'tether_gateway'").fetchone()
        assert role == (False, False, False, False, False, False, True)
        assert conn.execute("SELECT pg_has_role('tether_gateway', oid, 'MEMBER') FROM pg_roles "
                            "WHERE rolname = 'pg_execute_server_program'").fetchone() == (False,)
        owners = dict(conn.execute("SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'public'"))
        assert set(owners) == set(GATEWAY_PRIVILEGES) and set(owners.values()) == {"tether"}
        for table, allowed in GATEWAY_PRIVILEGES.items():
            asked = "SELECT has_table_privilege('tether_gateway', %s, %s)"
            granted = {p for p in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
                       if conn.execute(asked, (table, p)).fetchone()[0]}
            assert granted == set(allowed.split(", ")), table
        verifiers = dict(conn.execute("SELECT rolname, rolpassword FROM pg_authid WHERE rolname LIKE 'tether%'"))
        assert all(v.startswith("SCRAM-SHA-256$4096:") for v in verifiers.values()) and len(verifiers) == 2


def test_a_gateway_refuses_a_schema_older_than_its_code_it_may_not_migrate(pg):
    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS older")
        conn.execute("CREATE DATABASE older")
    admin = pg.admin_url.replace("/tether?", "/older?")
    backend = PostgresBackend(admin)
    try:  # as an older Tether left it: migrations 1..3, granted
        backend.begin()
        for migration in MIGRATIONS[:3]:
            for statement in migration.sql("postgresql"):
                backend.execute(statement)
        backend.set_schema_version(3)
        grant(backend)
        backend.commit()
    finally:
        backend.close()
    with pytest.raises(RegistryError, match=rf"has schema 3, older than this code's {latest()}, and this role may not "
                       r"change it: migrate it as the registry's admin first"):
        Registry(pg.url.replace("/tether?", "/older?"))
    with psycopg.connect(admin) as conn:   # and nothing changed
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (3,)


def test_passwords_appear_in_no_argv_log_or_message(pg, tmp_path):
    passwords = [read_passfile(pg.passfiles[role])[1] for role in ("admin", "gateway")]
    assert all(oct(pg.passfiles[role].stat().st_mode & 0o777) == "0o600" for role in ("admin", "gateway"))
    gateway = passwords[1]
    messages = []
    with_password = f"postgresql://tether_gateway:{gateway}@127.0.0.1:{pg.port}/tether?sslmode=disable"
    with pytest.raises(RegistryError) as refused:
        with_passfile(with_password, None)
    messages.append(str(refused.value))
    with pytest.raises(RegistryUnavailable) as unreachable:
        connect(with_password)
    messages.append(str(unreachable.value))
    assert all("tether_gateway:***@" in m for m in messages), messages
    messages += [repr(pg), pg.url, pg.admin_url, shown(with_password), pg.log_path.read_text()]
    argv = command_lines()
    assert any(f"-p {pg.port}" in a for a in argv)   # the server's own argv is among them
    for secret in passwords:
        assert not any(secret in text for text in messages + argv)
    assert "PGPASSWORD" not in os.environ


def test_the_server_runs_with_no_capabilities_and_a_private_socket_folder(pg):
    if os.geteuid() != 0:
        pytest.skip("as root only: the server then runs as the postgres user")
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pg.pid}/status").read_text().splitlines()
                  if ":\t" in line)
    assert status["Uid"].split()[0] == str(pwd.getpwnam("postgres").pw_uid)
    assert {status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {"0" * 16}
    assert status["NoNewPrivs"].strip() == "1"
    assert pg.socket_dir.stat().st_mode & 0o777 == 0o700
    key = pg.tls_dir / "server.key"
    assert key.stat().st_mode & 0o777 == 0o600 and key.stat().st_uid == int(status["Uid"].split()[0])


# A client on a lab host: prints "ok <user> <ssl>" or the refusal on one line.
PROBE = ("import sys, psycopg\ntry:\n"
         " c = psycopg.connect(sys.argv[1], passfile=sys.argv[2], connect_timeout=5)\n"
         " print('ok', *c.execute('SELECT current_user, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()')"
         ".fetchone())\nexcept psycopg.Error as e: print(' | '.join(str(e).strip().splitlines()))")


@pytest.mark.skipif(bool(namespaces_possible()), reason=namespaces_possible() or "-")
def test_on_lab_hosts_the_gateway_host_gets_in_and_the_outsider_is_refused(tmp_path):
    with Lab() as lab:
        db, gateway, outsider = lab.host("db"), lab.host("gw"), lab.host("outsider")
        creds = tmp_path / "creds"
        init_certs(creds)
        crt, key = issue_server(creds, "postgres-server", hosts=[db.address()])
        with PostgresServer(tmp_path / "pg", listen=db.address(), prefix=db.command([]), tls_cert=crt, tls_key=key,
                            tls_ca=creds / "ca.crt") as pg:
            url, passfile = pg.client("gateway")
            assert f"@{db.address()}:{pg.port}/" in url

            def probe(host, url: str, passfile: Path) -> str:
                done = host.run([sys.executable, "-c", PROBE, url, str(passfile)], capture_output=True, text=True,
                                timeout=60)
                return done.stdout.strip() or done.stderr.strip()

            assert probe(gateway, url, passfile) == "ok tether_gateway True"
            guess = tmp_path / "guess.pgpass"
            write_passfile(guess, "tether", "tether")
            admin = url.replace("tether_gateway@", "tether@")
            assert 'password authentication failed for user "tether"' in probe(outsider, admin, guess)
            assert "no password supplied" in probe(outsider, url, tmp_path / "none")
            plain = url.split("?")[0] + "?sslmode=disable"
            assert "no encryption" in probe(outsider, plain, guess)


def test_the_gateway_takes_its_password_from_a_passfile_and_refuses_one_in_the_url(pg):
    url, passfile = pg.client("gateway")
    p = argparse.ArgumentParser()
    add_arguments(p)
    config = from_arguments(p.parse_args(["--triton", "127.0.0.1:1", "--registry", url,
                                          "--registry-passfile", str(passfile)]))
    with Registry(config.registry) as registry:   # every connection from that URL finds the passfile
        assert registry.epoch() >= 0
    password = read_passfile(passfile)[1]
    with pytest.raises(SystemExit) as refused:
        from_arguments(p.parse_args(["--triton", "127.0.0.1:1", "--registry",
                                     url.replace("tether_gateway@", f"tether_gateway:{password}@")]))
    assert "tether_gateway:***@" in str(refused.value) and "carries a password" in str(refused.value)
    assert password not in str(refused.value)
    with pytest.raises(SystemExit, match="registry passfile '/nonexistent.pgpass' is not a file"):
        from_arguments(p.parse_args(["--triton", "127.0.0.1:1", "--registry", url,
                                     "--registry-passfile", "/nonexistent.pgpass"]))


def test_the_admin_step_from_a_shell_is_idempotent(pg):
    url, passfile = pg.client("admin")
    done = subprocess.run([sys.executable, "-m", "bridge.registry.roles", "--registry", url, "--registry-passfile",
                           str(passfile), "--gateway-passfile", str(pg.passfiles["gateway"])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "schema migrated, role tether_gateway granted what a gateway uses" in done.stdout
    with Registry(pg.url) as registry:   # the gateway's password unchanged: it still logs in
        assert registry.epoch() >= 0
    denied = subprocess.run([sys.executable, "-m", "bridge.registry.roles", "--registry", pg.client("gateway")[0],
                             "--registry-passfile", str(pg.passfiles["gateway"]), "--gateway-passfile",
                             str(pg.passfiles["gateway"])], capture_output=True, text=True, timeout=120)
    assert denied.returncode == 2 and "must be superuser to alter superuser roles" in denied.stderr
