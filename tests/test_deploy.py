"""deploy/kubernetes agrees with the Kubernetes schemas, with the CLI and with `tether cluster up`, and holds the
fleet's trust boundaries, so the manifests cannot drift silently:

- every manifest validates against the Kubernetes API schemas (kubernetes-validate, offline, strict);
- the container args parse with the real parsers (a flag the CLI lacks is named) and carry every flag that
  `tether cluster up` gives the same role;
- the NetworkPolicies admit exactly the topology's edges: every (from, to, port) they allow is computed and
  compared with the edge list in `_expected`, behind a default deny of both directions;
- every pod runs unprivileged; each role gets its own Secret, trainers never a private key; no secret is on
  a command line.

The Secrets built from `tether cluster certs`' folder and the engines run with them: tests/test_deploy_engines.py.
"""

from __future__ import annotations

import argparse
import itertools
import re
import urllib.parse
from pathlib import Path

import pytest
import yaml

from tests.support import manifests as k8s
from tether.cluster.up import GATEWAY_PORT, RENDEZVOUS_PORT, ClusterSpec, Running, gateway_args, roles, trainer_args


def _missing(parsers: list[argparse.ArgumentParser], args: list[str]) -> list[str]:
    """The flags in `args` that none of `parsers` has (flags being added elsewhere are named, not a usage error)."""
    known = {o for p in parsers for a in p._actions for o in a.option_strings}
    return sorted(k8s.flags(args) - known)


def _check_flags(where: str, prog: str, parsers: list[argparse.ArgumentParser], args: list[str]) -> None:
    missing = _missing(parsers, args)
    assert not missing, f"{where} uses flags that `{prog}` does not have: {', '.join(missing)}"


class _Fake:
    def __init__(self, address: str):
        self.address = address

    def pids(self) -> list[int]:
        return []

    def stop(self) -> None:
        pass


def _up(spec: ClusterSpec) -> dict[str, Running]:
    up: dict[str, Running] = {"postgres": _Fake("postgresql://tether@127.0.0.1:5432/tether"),
                              "nats": _Fake("nats://127.0.0.1:4222"), "rendezvous": _Fake("127.0.0.1:29400")}
    up |= {f"triton-{i}": _Fake(f"127.0.0.1:{8001 + i}") for i in range(spec.tritons)}
    up |= {f"gateway-{i}": _Fake(f"127.0.0.1:{50051 + i}") for i in range(spec.gateways)}
    return up


SPEC = ClusterSpec(run_dir=Path("/tmp/x"))


# deploy/ spells these settings of `tether cluster up` another way: the id from a file, not the command line
SAME_SETTING = {"--rdzv-id": "--rdzv-id-file"}


def _carries(deploy_args: list[str], cluster_args: list[str]) -> set[str]:
    """The flags `tether cluster up` gives a role that the manifest's args lack."""
    have = k8s.flags(deploy_args)
    return {f for f in k8s.flags(cluster_args) if f not in have and SAME_SETTING.get(f) not in have}


# -- the Kubernetes schemas --------------------------------------------------------------------------------------------

def test_every_manifest_validates_against_the_kubernetes_schemas():
    import kubernetes_validate

    for doc in k8s.DOCS:
        if doc["kind"] == "Kustomization":
            continue
        try:
            kubernetes_validate.validate(doc, k8s.K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
    # the validator is not vacuous: a misspelled field of a security context fails it
    bad = yaml.safe_load(yaml.safe_dump(k8s.find("Deployment", "tether-rendezvous")))
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalaton"] = False
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, k8s.K8S_VERSION, strict=True)


def test_the_kustomization_lists_every_manifest():
    assert sorted(k8s.KUSTOMIZATION["resources"]) == sorted(p.name for p in k8s.DEPLOY.glob("*.yaml")
                                                        if p.name != "kustomization.yaml")


# -- roles, and agreement with `tether cluster up` and the CLI ---------------------------------------------------------

def test_the_manifests_hold_every_role_of_tether_cluster_up():
    kinds = {re.sub(r"-\d+$", "", r.name) for r in roles(SPEC)}
    components = {k8s.component(d) for d in k8s.WORKLOADS}
    # deploy/'s admin Job does what `tether cluster up` does inside its postgres and nats roles
    assert components - {"admin"} == kinds == {"postgres", "nats", "triton", "gateway", "rendezvous", "trainer"}
    for d in k8s.WORKLOADS:
        assert d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == k8s.component(d)


def test_nats_is_a_three_server_jetstream_cluster_behind_a_headless_service_with_a_loopback_monitor():
    from bridge.experience.jetstream import MAX_MSG_BYTES

    nats = k8s.find("StatefulSet", "tether-nats")
    assert nats["spec"]["replicas"] == SPEC.nats_servers == k8s.load_deploy_script("credentials").NATS_SERVERS == 3
    service = k8s.find("Service", "tether-nats")
    assert service["spec"]["clusterIP"] == "None"
    conf = k8s.find("ConfigMap", "tether-nats")["data"]["nats.conf"]
    assert "jetstream" in conf and "port: 4222" in conf and "port: 6222" in conf
    assert "routes: [$route_0, $route_1, $route_2]" in conf  # users.conf's nats-route://route:...@tether-nats-N
    assert f"max_payload: {MAX_MSG_BYTES}" in conf
    # the monitor: loopback only, in no Service and no container port
    assert re.search(r'^\s*http: "127\.0\.0\.1:8222"$', conf, re.M) and "http_port" not in conf
    ports = {p["port"] for p in service["spec"]["ports"]} | {p["containerPort"] for p in k8s.container(nats)["ports"]}
    assert ports == {4222, 6222}
    probe = k8s.container(nats)["readinessProbe"]["exec"]["command"]
    assert any(a.startswith("http://127.0.0.1:8222/") for a in probe)
    # TLS on the client port and on the routes; users from the Secret, no anonymous access
    assert conf.count("cert_file: /etc/nats/auth/tls.crt") == 2 and "include ../auth/users.conf" in conf
    assert "no_auth_user" not in conf and "password: $route_password" in conf


def test_the_gateway_args_parse_and_carry_what_cluster_up_gives_a_gateway():
    from bridge.gateway.config import add_arguments

    gateways = k8s.find("StatefulSet", "tether-gateway")
    assert k8s.find("Service", "tether-gateway")["spec"]["clusterIP"] == "None"  # client-side load balancing
    container = k8s.container(gateways)
    assert container["command"] == ["tether", "gateway"]
    args = container["args"]
    p = argparse.ArgumentParser()
    add_arguments(p)
    _check_flags("deploy/kubernetes/gateway.yaml", "tether gateway", [p], args)
    parsed = p.parse_args(args)
    assert not _carries(args, gateway_args(SPEC, 0, _up(SPEC))), "flags of `tether cluster up`'s gateways missing"
    assert parsed.port == GATEWAY_PORT == k8s.service_port("tether-gateway", "grpc") == container["ports"][0][
        "containerPort"]
    tritons = parsed.triton.split(",")
    assert len(tritons) == k8s.find("StatefulSet", "tether-triton")["spec"]["replicas"]
    assert tritons == [f"tether-triton-{i}.tether-triton:{k8s.service_port('tether-triton', 'grpc')}"
                       for i in range(len(tritons))]
    files = k8s.credential_files(gateways)
    registry = urllib.parse.urlsplit(parsed.registry)
    query = dict(urllib.parse.parse_qsl(registry.query))
    assert (registry.scheme, registry.username, registry.password, registry.hostname, registry.port,
            registry.path) == ("postgresql", "tether_gateway", None, "tether-postgres",
                               k8s.service_port("tether-postgres", "postgres"), "/tether")
    assert query["sslmode"] == "verify-full" and query["sslrootcert"] in files
    nats_port = k8s.service_port("tether-nats", "client")
    assert parsed.experience.split(",") == [f"tls://tether-nats-{i}.tether-nats:{nats_port}" for i in range(3)]
    assert parsed.nats_user == "gateway"
    for path in (parsed.nats_password_file, parsed.nats_ca, parsed.registry_passfile, parsed.triton_secret_file,
                 parsed.tls_cert, parsed.tls_key, parsed.tokens):
        assert str(path) in files, f"{path} is not one of the gateway's credential files {sorted(files)}"
    assert parsed.gateway_id == "$(POD_NAME)"  # stable StatefulSet names: ownership and fencing
    assert parsed.host == "0.0.0.0"  # not loopback: TLS (above) and tokens


def test_the_trainer_args_parse_and_carry_what_cluster_up_gives_a_trainer_node():
    from trainer.main import _launcher, nnodes_range
    from trainer.rendezvous import parser as rendezvous_parser
    from trainer.worker import parser as worker_parser

    job = k8s.find("Job", "tether-trainer")
    container = k8s.container(job)
    assert container["command"] == ["tether", "train"]
    args = container["args"]
    _check_flags("deploy/kubernetes/trainer.yaml", "tether train", [_launcher(), worker_parser()], args)
    launcher, rest = _launcher().parse_known_args(args)
    worker = worker_parser().parse_args(rest)
    assert not _carries(args, trainer_args(SPEC, _up(SPEC))), "flags of `tether cluster up`'s trainers missing"
    low, high = nnodes_range(launcher.nnodes)
    assert low == 1 and high == job["spec"]["parallelism"] == job["spec"]["completions"]
    assert launcher.rdzv_external and launcher.rdzv_endpoint == f"tether-rendezvous:{RENDEZVOUS_PORT}"
    assert "--rdzv-id" not in k8s.flags(args) and str(launcher.rdzv_id_file) in k8s.credential_files(job)
    assert k8s.service_port("tether-rendezvous", "c10d") == RENDEZVOUS_PORT
    store = k8s.container(k8s.find("Deployment", "tether-rendezvous"))
    assert store["command"] == ["python", "-m", "trainer.rendezvous"]
    _check_flags("deploy/kubernetes/trainer.yaml", "python -m trainer.rendezvous", [rendezvous_parser()], store["args"])
    served = rendezvous_parser().parse_args(store["args"])
    assert served.port == RENDEZVOUS_PORT and served.host == "$(POD_IP)"  # its pod IP, never 0.0.0.0
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in store["env"]
    nats_port = k8s.service_port("tether-nats", "client")
    assert worker.experience.split(",") == [f"tls://tether-nats-{i}.tether-nats:{nats_port}" for i in range(3)]
    assert worker.nats_user == "trainer"
    files = k8s.credential_files(job)
    assert {str(worker.nats_password_file), str(worker.nats_ca), str(launcher.tls_ca)} <= files
    assert worker.checkpoint_dir and worker.stop_file.startswith(worker.checkpoint_dir)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in k8s.pod(job)["volumes"]}
    claim = volumes[mounts[worker.checkpoint_dir]]["persistentVolumeClaim"]["claimName"]
    assert k8s.find("PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteMany"]  # every node reads it


def test_the_admin_job_prepares_the_registry_and_the_stream_as_the_admins():
    job = k8s.find("Job", "tether-prepare")
    container = k8s.container(job)
    assert container["command"] == ["python", "/opt/tether/deploy/prepare.py"]
    prepare = k8s.load_deploy_script("prepare")
    _check_flags("deploy/kubernetes/admin.yaml", "deploy/prepare.py", [prepare.parser()], container["args"])
    a = prepare.parser().parse_args(container["args"])
    registry = urllib.parse.urlsplit(a.registry)
    assert registry.username == "tether" and registry.password is None and "sslmode=verify-full" in registry.query
    assert a.nats_user == "admin" and a.replicas == k8s.find("StatefulSet", "tether-nats")["spec"]["replicas"]
    files = k8s.credential_files(job)
    assert {str(a.registry_passfile), str(a.gateway_passfile), str(a.nats_password_file), str(a.nats_ca)} <= files


def test_triton_answers_only_requests_carrying_the_secret_and_only_on_grpc():
    from inference_server.secret import CATEGORIES, KEY

    triton = k8s.find("StatefulSet", "tether-triton")
    container = k8s.container(triton)
    assert container["command"] == ["/bin/sh", "-c"]
    (script,) = container["args"]
    secret_file = f"{k8s.mount(triton, 'tether-triton')}/triton.secret"
    from_file = f'{KEY}="$(cat {secret_file})"'
    for flag in ("--grpc-restricted-protocol", "--http-restricted-api"):  # every protocol group, health included
        assert f" {flag}={','.join(CATEGORIES)}:{from_file}" in script
    assert script.startswith("exec tritonserver ") and "--http-address=127.0.0.1" in script.split()
    assert [p["port"] for p in k8s.find("Service", "tether-triton")["spec"]["ports"]] == [8001]
    probe = " ".join(container["readinessProbe"]["exec"]["command"])
    assert f'{KEY}: $(cat {secret_file})' in probe and "http://127.0.0.1:8000/v2/health/ready" in probe


def test_postgres_admits_tls_and_scram_only_and_reads_its_password_from_a_file():
    from bridge.security.lab import PG_USERS

    pg = k8s.find("StatefulSet", "tether-postgres")
    hba = k8s.find("ConfigMap", "tether-postgres")["data"]["pg_hba.conf"]
    rows = [line.split() for line in hba.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert {r[0] for r in rows} == {"local", "hostssl"}, "a `host` line would admit TCP without TLS"
    assert all(r[-1] == "scram-sha-256" for r in rows) and {r[2] for r in rows} == set(PG_USERS.values())
    assert all(r[1] == "tether" for r in rows if r[0] == "hostssl")
    container = k8s.container(pg)
    args = container["args"]
    assert args[0] == "postgres" and all(a == "-c" for a in args[1::2])
    settings = dict(a.split("=", 1) for a in args[2::2])
    secret = k8s.mount(pg, "tether-postgres")
    assert settings["ssl"] == "on" and settings["password_encryption"] == "scram-sha-256"
    assert {settings[k] for k in ("ssl_cert_file", "ssl_key_file", "ssl_ca_file")} == {
        f"{secret}/tls.crt", f"{secret}/tls.key", f"{secret}/ca.crt"}
    hba_mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "config")
    assert settings["hba_file"] == f"{hba_mount}/pg_hba.conf"
    env = {e["name"]: e for e in container["env"]}
    assert env["POSTGRES_USER"]["value"] == PG_USERS["admin"] and "POSTGRES_PASSWORD" not in env
    assert env["POSTGRES_PASSWORD_FILE"]["value"] == f"{secret}/admin.password"


@pytest.mark.parametrize("name", ["tether-triton", "tether-gateway"])
def test_the_model_repository_is_one_volume_shared_by_the_replicas_and_the_gateways(name):
    workload = k8s.find("StatefulSet", name)
    volumes = {v["name"]: v for v in k8s.pod(workload)["volumes"]}
    mount = next(m for m in k8s.container(workload)["volumeMounts"] if m["mountPath"] == "/models")
    assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == "tether-models"
    assert k8s.find("PersistentVolumeClaim", "tether-models")["spec"]["accessModes"] == ["ReadWriteMany"]


# -- the network: a default deny, and one rule per edge ----------------------------------------------------------------

OUTSIDE, DNS = "(outside)", "(kube-dns)"   # robots and anything off the namespace; the cluster's DNS
CLIENT_ROLES = ("sim", "operator", "archiver")   # pods the manifests do not run but the policies name
ANY_PORT = ("TCP", 40000)                        # a port chosen at run time (torchrun's store, gloo's pairs)


def _policies() -> list[dict]:
    return [d for d in k8s.DOCS if d["kind"] == "NetworkPolicy"]


def _namespace_roles() -> list[str]:
    return sorted({k8s.component(d) for d in k8s.WORKLOADS} | set(CLIENT_ROLES))


def _labels(endpoint: str) -> tuple[dict, dict | None]:
    """(pod labels, namespace labels: None for this namespace) of an endpoint."""
    if endpoint == DNS:
        return {"k8s-app": "kube-dns"}, {"kubernetes.io/metadata.name": "kube-system"}
    if endpoint == OUTSIDE:
        return {}, {"kubernetes.io/metadata.name": "elsewhere"}
    return {"app.kubernetes.io/part-of": "tether", "app.kubernetes.io/component": endpoint}, None


def _selects(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        has, value = e["key"] in labels, labels.get(e["key"])
        ok = {"In": has and value in e.get("values", []), "NotIn": not has or value not in e.get("values", []),
              "Exists": has, "DoesNotExist": not has}[e["operator"]]
        if not ok:
            return False
    return True


def _peer_matches(peer: dict, endpoint: str) -> bool:
    assert "ipBlock" not in peer, "ipBlock peers are not modelled by this test: model them before using them"
    labels, namespace = _labels(endpoint)
    if "namespaceSelector" in peer:
        if namespace is None:  # this namespace's labels are the cluster's to choose: only {} surely matches
            namespace = {}
        if not _selects(peer["namespaceSelector"], namespace):
            return False
    elif namespace is not None:
        return False  # a podSelector alone means pods of this namespace
    return _selects(peer.get("podSelector", {}), labels)


def _port_matches(rule: dict, port: tuple[str, int]) -> bool:
    if not rule.get("ports"):
        return True
    for p in rule["ports"]:
        assert isinstance(p.get("port", 0), int), f"named port {p['port']!r}: use numbers (this test compares them)"
        if p.get("protocol", "TCP") == port[0] and ("port" not in p or p["port"] <= port[1] <= p.get("endPort",
                                                                                                      p["port"])):
            return True
    return False


def _types(policy: dict) -> list[str]:
    spec = policy["spec"]
    return spec.get("policyTypes") or (["Ingress"] + (["Egress"] if "egress" in spec else []))


def _admits(direction: str, pod: str, peer: str, port: tuple[str, int]) -> bool:
    """Whether `pod`'s policies let traffic in `direction` ("Ingress": from peer; "Egress": to peer) on `port`."""
    labels, _ = _labels(pod)
    policies = [p for p in _policies() if _selects(p["spec"]["podSelector"], labels) and direction in _types(p)]
    if not policies:
        return True  # not isolated in this direction
    key, side = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    return any((not rule.get(side) or any(_peer_matches(x, peer) for x in rule[side])) and _port_matches(rule, port)
               for p in policies for rule in p["spec"].get(key, []))


def _ports() -> set[tuple[str, int]]:
    ports = {("TCP", p["port"]) for d in k8s.DOCS if d["kind"] == "Service" for p in d["spec"]["ports"]}
    ports |= {("TCP", p["containerPort"]) for w in k8s.WORKLOADS for c in k8s.containers(w) for p in c.get("ports", [])}
    return ports | {("TCP", 8000), ("TCP", 8222), ("TCP", 53), ("UDP", 53), ANY_PORT}


def _allowed() -> set[tuple[str, str, tuple[str, int]]]:
    inside = _namespace_roles()
    out = set()
    for src, dst, port in itertools.product([*inside, OUTSIDE], [*inside, OUTSIDE, DNS], _ports()):
        if src not in inside and dst not in inside:
            continue  # neither end is ours
        if (dst not in inside or _admits("Ingress", dst, src, port)) and \
                (src not in inside or _admits("Egress", src, dst, port)):
            out.add((src, dst, port))
    return out


def _expected() -> set[tuple[str, str, tuple[str, int]]]:
    tcp = [("gateway", 50051, [OUTSIDE, "sim", "operator", "trainer"]),   # robots, operators anywhere: TLS + tokens
           ("postgres", 5432, ["gateway", "admin"]),
           ("nats", 4222, ["gateway", "trainer", "archiver", "admin"]),
           ("nats", 6222, ["nats"]),
           ("triton", 8001, ["gateway"]),
           ("rendezvous", 29400, ["trainer"])]
    edges = {(src, dst, ("TCP", port)) for dst, port, sources in tcp for src in sources}
    edges |= {("trainer", "trainer", port) for port in _ports()}   # DDP between trainer nodes
    edges |= {(role, DNS, ("UDP", 53)) for role in _namespace_roles()}
    edges |= {(role, DNS, ("TCP", 53)) for role in _namespace_roles()}
    return edges


def test_a_default_deny_policy_closes_the_namespace_both_ways():
    denies = [p for p in _policies() if p["spec"]["podSelector"] == {} and set(_types(p)) == {"Ingress", "Egress"}
              and not p["spec"].get("ingress") and not p["spec"].get("egress")]
    assert [p["metadata"]["name"] for p in denies] == ["tether-default-deny"]


def test_the_network_policies_admit_exactly_the_edges_of_the_topology():
    allowed, expected = _allowed(), _expected()
    assert not allowed - expected, f"admitted beyond the topology: {sorted(allowed - expected)}"
    assert not expected - allowed, f"edges of the topology not admitted: {sorted(expected - allowed)}"
    # the model is not vacuous: without the default deny an isolated role is still closed, and the NATS monitor and
    # Triton's HTTP port are admitted to nobody at all
    assert not {e for e in allowed if (e[1], e[2]) in {("nats", ("TCP", 8222)), ("triton", ("TCP", 8000))}}
    assert _admits("Ingress", "rendezvous", "trainer", ("TCP", 29400))
    assert not _admits("Ingress", "rendezvous", "gateway", ("TCP", 29400))
    assert not _admits("Ingress", "triton", OUTSIDE, ("TCP", 8001))


# -- pods: unprivileged, their own Secrets, nothing secret on a command line -------------------------------------------

def test_every_pod_runs_unprivileged_with_a_read_only_root():
    for workload in k8s.WORKLOADS:
        name, pod = workload["metadata"]["name"], k8s.pod(workload)
        sc = pod.get("securityContext", {})
        assert sc.get("runAsNonRoot") is True and isinstance(sc.get("runAsUser"), int) and sc["runAsUser"] > 0, name
        assert pod.get("automountServiceAccountToken") is False, f"{name} needs no Kubernetes API token"
        for c in k8s.containers(workload):
            where = f"{name}/{c['name']}"
            csc = c.get("securityContext", {})
            assert csc.get("allowPrivilegeEscalation") is False, where
            assert csc.get("capabilities") == {"drop": ["ALL"]}, where
            assert csc.get("readOnlyRootFilesystem") is True, where
            assert not csc.get("privileged") and csc.get("runAsUser", sc["runAsUser"]) > 0, where
            assert csc.get("runAsNonRoot", True) is True, where
            seccomp = csc.get("seccompProfile") or sc.get("seccompProfile")
            assert seccomp == {"type": "RuntimeDefault"}, where


def test_the_tether_image_runs_as_the_user_the_pods_name():
    dockerfile = (k8s.ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r"^USER 10001:10001$", dockerfile, re.M)
    users = {k8s.pod(w)["securityContext"]["runAsUser"] for w in k8s.WORKLOADS
             if any(c["image"] == "tether:latest" for c in k8s.containers(w))}
    assert users == {10001}
    ignore = (k8s.ROOT / "deploy" / "Dockerfile.dockerignore").read_text().split()
    assert "deploy/kubernetes/credentials" in ignore  # no key enters the image


def test_each_role_has_its_own_secret_and_only_servers_hold_private_keys():
    generated = k8s.generated()
    users: dict[str, set[str]] = {}
    for w in k8s.WORKLOADS:
        for secret, keys in k8s.secret_refs(w).items():
            assert secret in generated, f"{w['metadata']['name']} uses Secret {secret}, which no generator makes"
            assert keys <= set(generated[secret]), f"{secret} lacks {keys - set(generated[secret])}"
            users.setdefault(secret, set()).add(k8s.component(w))
    assert users == {"tether-gateway": {"gateway"}, "tether-trainer": {"trainer"}, "tether-nats": {"nats"},
                     "tether-postgres": {"postgres"}, "tether-triton": {"triton"}, "tether-admin": {"admin"}}
    with_keys = {name for name, files in generated.items()
                 if any(k.endswith(".key") or src.endswith(".key") for k, src in files.items())}
    assert with_keys == {"tether-gateway", "tether-nats", "tether-postgres"}   # each its own server's key
    for w in k8s.WORKLOADS:
        if k8s.component(w) in ("trainer", "rendezvous", "admin"):
            held = set(k8s.secret_refs(w)) & with_keys
            assert not held, f"{w['metadata']['name']} mounts {held}, which hold private keys"
    assert "credentials/ca.key" not in {src for files in generated.values() for src in files.values()}


SECRET_FLAGS = {"--token", "--rdzv-id", "--password", "--nats-password", "--secret"}  # their *-file forms only


def _secrets_on_command_line(container: dict) -> list[str]:
    """What in `container`'s command line or literal env would carry a secret (empty: nothing)."""
    secret_env = {e["name"] for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
    probe = container.get("readinessProbe", {}).get("exec", {}).get("command", [])
    found = []
    for arg in [*container.get("command", []), *container.get("args", []), *probe]:
        found += [f"$({v}) from a Secret in {arg!r}" for v in secret_env if f"$({v})" in arg]
        found += [f"flag {f}" for f in k8s.flags([arg]) & SECRET_FLAGS]
        found += [f"a password in the URL {arg!r}" for _ in re.finditer(r"://[^/@\s:]+:[^/@\s]+@", arg)]
        found += [f"a literal Triton secret in {arg!r}"
                  for _ in re.finditer(r'tether-triton-key[=:]\s*(?!"?\$\(cat /)\S', arg)]
    found += [f"env {e['name']} has a literal value" for e in container.get("env", [])
              if re.search(r"PASSWORD|SECRET|TOKEN", e["name"]) and not e["name"].endswith("_FILE") and "value" in e]
    return found


def test_no_secret_is_on_a_command_line():
    for workload in k8s.WORKLOADS:
        for c in k8s.containers(workload):
            assert not _secrets_on_command_line(c), f"{workload['metadata']['name']}/{c['name']}"
    # the check is not vacuous: the manifests' old spellings are caught
    old = {"args": ["--registry=postgresql://tether:$(POSTGRES_PASSWORD)@tether-postgres:5432/tether",
                    "--rdzv-id=$(RDZV_ID)", "--grpc-restricted-protocol=health:tether-triton-key=abc"],
           "env": [{"name": "POSTGRES_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "s", "key": "password"}}},
                   {"name": "TRITON_SECRET", "value": "abc"}]}
    assert len(_secrets_on_command_line(old)) == 5


def test_a_tether_pod_gets_only_the_credential_files_its_command_names():
    for workload in k8s.WORKLOADS:
        pod = k8s.pod(workload)
        if not pod.get("initContainers"):
            continue
        args = " ".join(k8s.container(workload)["args"])
        unused = {f for f in k8s.credential_files(workload) if f not in args}
        assert not unused, f"{workload['metadata']['name']} is given {sorted(unused)} and never uses them"
