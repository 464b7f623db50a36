"""deploy/kubernetes with real credentials and real engines: the Secrets kustomize builds from a `tether cluster
certs` folder (completed by deploy/credentials.py), the NATS config they complete accepted by the real nats-server
and its roles able to do their jobs and nothing more, and the admin Job's script preparing a real TLS PostgreSQL and
the stream. Servers run on free loopback ports in temp dirs (the NATS routes, which name pods, are left out).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from bridge.common.processes import free_port
from tests.support import manifests as k8s

NATS_HOSTS = [f"tether-nats-{i}.tether-nats" for i in range(3)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """A `tether cluster certs` folder completed by deploy/credentials.py, where kustomization.yaml expects it."""
    from bridge.security.lab import LabCredentials

    folder = tmp_path_factory.mktemp("deploy") / "credentials"
    LabCredentials.create(folder, hosts=NATS_HOSTS)
    written = k8s.load_deploy_script("credentials").make(folder)
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in written)
    return folder


def test_every_secret_is_built_from_the_lab_folder(lab):
    for name, files in k8s.generated().items():
        for key, source in files.items():
            assert source.startswith("credentials/"), f"{name}.{key}: {source} is not in the credentials folder"
            assert (lab / source.removeprefix("credentials/")).is_file(), f"{name}.{key}: {source} is not made"
    users = (lab / "nats" / "users.conf").read_text()
    for role in ("admin", "gateway", "trainer", "archiver"):
        assert (lab / "nats" / f"{role}.password").read_text().strip() not in users  # hashed, never in clear
    assert re.search(r'route_password: "\$2a\$11\$', users)


def test_kustomize_builds_one_secret_per_role_from_the_lab_folder(lab, tmp_path):
    """`kubectl kustomize` (offline) of the manifests beside a lab folder: every Secret is generated with exactly its
    keys, every reference points at a generated (hash-suffixed) name, and the whole output validates."""
    import kubernetes_validate

    tool = shutil.which("kubectl")
    if tool is None:
        pytest.skip("kubectl is not installed: `kubectl kustomize` untested (the other tests read the manifests)")
    build = tmp_path / "kubernetes"
    shutil.copytree(k8s.DEPLOY, build, ignore=shutil.ignore_patterns("credentials"))
    shutil.copytree(lab, build / "credentials")
    done = subprocess.run([tool, "kustomize", str(build)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    names = {}
    for name, files in k8s.generated().items():
        (built,) = [s for s in secrets if s.rsplit("-", 1)[0] == name]
        assert set(secrets[built]["data"]) == set(files), built
        names[built] = name
    assert len(secrets) == len(names)
    workloads = [d for d in docs if d["kind"] in k8s.WORKLOAD_KINDS]
    assert len(workloads) == len(k8s.WORKLOADS)
    for w in workloads:
        assert set(k8s.secret_refs(w)) <= set(names), f"{w['metadata']['name']}: {set(k8s.secret_refs(w)) - set(names)}"
    for d in docs:
        kubernetes_validate.validate(d, k8s.K8S_VERSION, strict=True)


def _nats_files(lab: Path, root: Path, conf: str, *, routes: bool = True) -> Path:
    """nats.yaml's config and Secret laid out as in the pod (/etc/nats/{config,auth}) under `root` (without
    `routes`: users.conf without the routes' variables, which nats-server refuses when no cluster block uses them)."""
    auth = root / "auth"
    auth.mkdir(parents=True)
    (root / "config").mkdir()
    for key, source in k8s.generated()["tether-nats"].items():
        text = (lab / source.removeprefix("credentials/")).read_bytes()
        if key == "users.conf" and not routes:
            text = b"".join(line for line in text.splitlines(keepends=True) if not line.startswith(b"route_"))
        (auth / key).write_bytes(text)
    path = root / "config" / "nats.conf"
    path.write_text(conf.replace("/etc/nats/auth/", f"{auth}/").replace("/data/jetstream", str(root / "store")))
    return path


def _nats_server() -> str:
    from tether.cluster.nats import nats_server_binary

    binary = nats_server_binary()
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("nats-server is missing (make setup installs it)")
        pytest.skip("nats-server is not installed")
    return binary


def _pod_env(i: int) -> dict[str, str]:
    name = f"tether-nats-{i}"
    return dict(os.environ, POD_NAME=name, CLIENT_ADVERTISE=f"{name}.tether-nats:4222",
                CLUSTER_ADVERTISE=f"{name}.tether-nats:6222")


def test_nats_server_accepts_the_config_the_secret_completes(lab, tmp_path):
    binary = _nats_server()
    conf = k8s.find("ConfigMap", "tether-nats")["data"]["nats.conf"]
    path = _nats_files(lab, tmp_path / "good", conf)
    checked = subprocess.run([binary, "-c", str(path), "-t"], env=_pod_env(0), capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the include is what defines the routes and users: without it the server names what is missing
    bare = _nats_files(lab, tmp_path / "bare", conf.replace("include ../auth/users.conf", ""))
    refused = subprocess.run([binary, "-c", str(bare), "-t"], env=_pod_env(0), capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode != 0 and "route_password" in refused.stdout + refused.stderr


def _without_block(conf: str, name: str) -> str:
    start = conf.index(f"{name} {{")
    depth, i = 0, start
    while True:
        depth += {"{": 1, "}": -1}.get(conf[i], 0)
        i += 1
        if depth == 0 and conf[i - 1] == "}":
            return conf[:start] + conf[i:]


@contextlib.contextmanager
def _deploy_nats(lab: Path, tmp_path: Path):
    """One nats-server with nats.yaml's config on a free loopback port (the cluster block left out: its routes name
    pods); yields its client URL once /healthz answers."""
    binary = _nats_server()
    port, http = free_port(), free_port()
    conf = _without_block(k8s.find("ConfigMap", "tether-nats")["data"]["nats.conf"], "cluster")
    conf = conf.replace("port: 4222", f'listen: "127.0.0.1:{port}"').replace("127.0.0.1:8222", f"127.0.0.1:{http}")
    path = _nats_files(lab, tmp_path / "nats", conf, routes=False)
    env = _pod_env(0) | {"CLIENT_ADVERTISE": f"127.0.0.1:{port}"}
    log_path = tmp_path / "nats-server.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen([binary, "-c", str(path)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, log_path.read_text()
            with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{http}/healthz",
                                                                       timeout=1) as r:
                if r.status == 200:
                    break
            assert time.monotonic() < deadline, "nats-server not healthy after 30 s"
            time.sleep(0.05)
        yield f"tls://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


def test_the_roles_of_the_nats_config_on_a_real_server(lab, tmp_path):
    """The admin makes the stream, a gateway publishes, a trainer consumes what it published; a trainer's publish
    and a client without a user are refused, each by the server's answer."""
    from nats.js.api import AckPolicy, ConsumerConfig

    from bridge.experience import jetstream as js_
    from bridge.experience.jetstream import NatsAuth, connect, headers_of, subject_of

    def auth(role: str) -> NatsAuth:
        return NatsAuth(user=role, password_file=lab / "nats" / f"{role}.password", ca=lab / "ca.crt")

    async def scenario(servers: list[str]) -> None:
        admin = await connect(servers, name="admin", auth=auth("admin"))
        await js_.ensure_stream(admin.jetstream(), replicas=1, timeout_s=10)
        gateway = await connect(servers, name="gateway", auth=auth("gateway"))
        ack = await gateway.jetstream().publish(subject_of("robot-1"), b"transition", headers=headers_of(
            "robot-1", 0, 0))
        assert ack.stream == js_.STREAM and ack.seq == 1
        refusals: list[str] = []
        trainer = await connect(servers, name="trainer", auth=auth("trainer"),
                                on_error=lambda exc: refusals.append(str(exc)))
        sub = await trainer.jetstream().pull_subscribe("", durable="tether-trainer-0", stream=js_.STREAM, config=(
            ConsumerConfig(durable_name="tether-trainer-0", ack_policy=AckPolicy.EXPLICIT)))
        (msg,) = await sub.fetch(1, timeout=10)
        assert msg.data == b"transition"
        await msg.ack()
        await trainer.publish(subject_of("robot-1"), b"forged")
        await trainer.flush()
        until = time.monotonic() + 10
        while not any("permissions violation for publish" in r.lower() for r in refusals):
            assert time.monotonic() < until, f"no refusal of the trainer's publish; errors: {refusals}"
            await asyncio.sleep(0.02)
        with pytest.raises(js_.ExperienceStreamError, match="Authorization Violation"):   # TLS, but no user
            await connect(servers, name="outsider", auth=NatsAuth(ca=lab / "ca.crt"), connect_timeout_s=5)
        for nc in (admin, gateway, trainer):
            await nc.close()

    with _deploy_nats(lab, tmp_path) as url:
        asyncio.run(asyncio.wait_for(scenario([url]), 120))   # a hang fails here, with the server stopped


def test_the_admin_job_prepares_a_real_registry_and_stream(lab, tmp_path):
    """deploy/prepare.py with the admin Job's own args (hosts pointed at loopback, /run/tether/* at the files the
    Secret is made of) against a TLS PostgreSQL and nats.yaml's nats-server: the gateway role can then log in over
    verify-full TLS and use the registry, the stream exists; nothing secret in the script's output."""
    import psycopg

    from bridge.registry.backends import with_passfile
    from tether.cluster.postgres import PostgresServer, postgres_bin_dir

    if postgres_bin_dir() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("PostgreSQL is missing (make setup installs it)")
        pytest.skip("PostgreSQL is not installed")
    job = k8s.find("Job", "tether-prepare")
    generated = k8s.generated()["tether-admin"]
    (secret,) = [v["secret"] for v in k8s.pod(job)["volumes"] if "secret" in v]
    files = {f"/run/tether/{i['path']}": str(lab / generated[i["key"]].removeprefix("credentials/"))
             for i in secret["items"]}
    # the server's folder outside pytest's: a pytest session starting meanwhile (another run on this machine) resets
    # /tmp/pytest-of-USER to 0700, which empties the ACL mask that lets the `postgres` user through it
    pg_dir = Path(tempfile.mkdtemp(prefix="tether-deploy-pg-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, pg_dir, ignore_errors=True)
        pg = stack.enter_context(PostgresServer(
            pg_dir / "pg", tls_cert=lab / "postgres-server.crt", tls_key=lab / "postgres-server.key",
            tls_ca=lab / "ca.crt", admin_passfile=lab / "postgres" / "admin.pgpass",
            gateway_passfile=lab / "postgres" / "gateway.pgpass"))
        nats_url = stack.enter_context(_deploy_nats(lab, tmp_path))
        args = []
        for arg in k8s.container(job)["args"]:
            for path, source in files.items():
                arg = arg.replace(path, source)
            arg = arg.replace("tether-postgres:5432", f"127.0.0.1:{pg.port}").replace("--replicas=3", "--replicas=1")
            if arg.startswith("--experience="):
                arg = f"--experience={nats_url}"
            args.append(arg)
        done = subprocess.run([sys.executable, str(k8s.ROOT / "deploy" / "prepare.py"), *args], capture_output=True,
                              text=True, timeout=180, cwd=k8s.ROOT)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "the stream is in place" in done.stdout
        for role in ("admin", "gateway"):
            password = (lab / "postgres" / f"{role}.pgpass").read_text().strip().rsplit(":", 1)[1]
            assert password not in done.stdout + done.stderr
        gateway_url = with_passfile(f"postgresql://tether_gateway@127.0.0.1:{pg.port}/tether?sslmode=verify-full&"
                                    f"sslrootcert={lab / 'ca.crt'}", lab / "postgres" / "gateway.pgpass")
        with psycopg.connect(gateway_url) as conn:
            assert conn.info.pgconn.ssl_in_use
            assert conn.execute("SELECT count(*) FROM schema_version").fetchone()[0] >= 1
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("CREATE TABLE mine (x int)")
