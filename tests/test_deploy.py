"""deploy/kubernetes agrees with the CLI and with `tether cluster up`'s roles, so the manifests cannot drift
silently: the same roles, the container args parse with the real parsers and carry every flag that
`tether cluster up` gives the same role, and the ports and names the args point at are the Services'."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from tether.cluster.up import GATEWAY_PORT, RENDEZVOUS_PORT, ClusterSpec, Running, gateway_args, roles, trainer_args

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "kubernetes"


def _docs() -> list[dict]:
    docs = [d for p in sorted(DEPLOY.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    assert docs, f"no manifests under {DEPLOY}"
    return docs


DOCS = _docs()


def _find(kind: str, name: str) -> dict:
    found = [d for d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"want one {kind} {name}, found {len(found)}"
    return found[0]


def _container(workload: dict) -> dict:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


def _service_port(name: str, port_name: str) -> int:
    return next(p["port"] for p in _find("Service", name)["spec"]["ports"] if p["name"] == port_name)


def _flags(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def _value(args: list[str], flag: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"{flag}="))


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


def test_the_manifests_hold_every_role_of_tether_cluster_up():
    kinds = {re.sub(r"-\d+$", "", r.name) for r in roles(SPEC)}
    components = {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in DOCS
                  if d["kind"] in ("StatefulSet", "Deployment", "Job")}
    assert components == kinds == {"postgres", "nats", "triton", "gateway", "rendezvous", "trainer"}
    for d in DOCS:
        if d["kind"] in ("StatefulSet", "Deployment", "Job"):
            labels = d["spec"]["template"]["metadata"]["labels"]
            assert labels["app.kubernetes.io/component"] == d["metadata"]["labels"]["app.kubernetes.io/component"]


def test_nats_is_a_three_server_jetstream_cluster_behind_a_headless_service():
    nats = _find("StatefulSet", "tether-nats")
    assert nats["spec"]["replicas"] == SPEC.nats_servers == 3
    assert _find("Service", "tether-nats")["spec"]["clusterIP"] == "None"
    conf = _find("ConfigMap", "tether-nats")["data"]["nats.conf"]
    assert "jetstream" in conf and "port: 4222" in conf and "port: 6222" in conf
    assert all(f"tether-nats-{i}.tether-nats:6222" in conf for i in range(3))


def test_the_gateway_args_parse_and_carry_what_cluster_up_gives_a_gateway():
    from bridge.gateway.config import add_arguments

    gateways = _find("StatefulSet", "tether-gateway")
    assert _find("Service", "tether-gateway")["spec"]["clusterIP"] == "None"  # client-side load balancing
    container = _container(gateways)
    assert container["command"] == ["tether", "gateway"]
    args = container["args"]
    p = argparse.ArgumentParser()
    add_arguments(p)
    parsed = p.parse_args(args)  # every flag is one the gateway has (a renamed flag fails here)
    assert _flags(gateway_args(SPEC, 0, _up(SPEC))) <= _flags(args)
    assert parsed.port == GATEWAY_PORT == _service_port("tether-gateway", "grpc") == container["ports"][0][
        "containerPort"]
    tritons = parsed.triton.split(",")
    assert len(tritons) == _find("StatefulSet", "tether-triton")["spec"]["replicas"]
    assert tritons == [f"tether-triton-{i}.tether-triton:{_service_port('tether-triton', 'grpc')}"
                       for i in range(len(tritons))]
    assert parsed.registry.startswith("postgresql://") and parsed.registry.endswith(
        f"@tether-postgres:{_service_port('tether-postgres', 'postgres')}/tether")
    nats_port = _service_port("tether-nats", "client")
    assert parsed.experience.split(",") == [f"nats://tether-nats-{i}.tether-nats:{nats_port}" for i in range(3)]
    assert parsed.gateway_id == "$(POD_NAME)"  # stable StatefulSet names: ownership and fencing
    assert parsed.tls_cert and parsed.host == "0.0.0.0"  # not loopback: TLS


def test_the_trainer_args_parse_and_carry_what_cluster_up_gives_a_trainer_node():
    from trainer.main import _launcher, nnodes_range
    from trainer.rendezvous import parser as rendezvous_parser
    from trainer.worker import parser as worker_parser

    job = _find("Job", "tether-trainer")
    container = _container(job)
    assert container["command"] == ["tether", "train"]
    launcher, rest = _launcher().parse_known_args(container["args"])
    worker_parser().parse_args(rest)
    assert _flags(trainer_args(SPEC, _up(SPEC))) <= _flags(container["args"])
    low, high = nnodes_range(launcher.nnodes)
    assert low == 1 and high == job["spec"]["parallelism"] == job["spec"]["completions"]
    assert launcher.rdzv_external and launcher.rdzv_endpoint == f"tether-rendezvous:{RENDEZVOUS_PORT}"
    assert _service_port("tether-rendezvous", "c10d") == RENDEZVOUS_PORT
    store = _container(_find("Deployment", "tether-rendezvous"))
    assert store["command"] == ["python", "-m", "trainer.rendezvous"]
    assert rendezvous_parser().parse_args(store["args"]).port == RENDEZVOUS_PORT
    worker = worker_parser().parse_args(rest)
    nats_port = _service_port("tether-nats", "client")
    assert worker.experience.split(",") == [f"nats://tether-nats-{i}.tether-nats:{nats_port}" for i in range(3)]
    assert worker.checkpoint_dir and worker.stop_file.startswith(worker.checkpoint_dir)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    claim = volumes[mounts[worker.checkpoint_dir]]["persistentVolumeClaim"]["claimName"]
    assert _find("PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteMany"]  # every node reads it


@pytest.mark.parametrize("name", ["tether-triton", "tether-gateway"])
def test_the_model_repository_is_one_volume_shared_by_the_replicas_and_the_gateways(name):
    workload = _find("StatefulSet", name)
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    mount = next(m for m in _container(workload)["volumeMounts"] if m["mountPath"] == "/models")
    assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == "tether-models"
    assert _find("PersistentVolumeClaim", "tether-models")["spec"]["accessModes"] == ["ReadWriteMany"]


def test_the_kustomization_lists_every_manifest():
    (kustomization,) = [d for d in DOCS if d["kind"] == "Kustomization"]
    assert sorted(kustomization["resources"]) == sorted(p.name for p in DEPLOY.glob("*.yaml")
                                                        if p.name != "kustomization.yaml")
