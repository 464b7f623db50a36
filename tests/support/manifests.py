"""deploy/kubernetes read as data, for tests/test_deploy*.py: its documents, workloads, Secrets and what the pods
take from them.

    find("StatefulSet", "tether-gateway")     # the one document of that kind and name
    container(workload), containers(workload)  # its main container; init containers + containers
    generated()["tether-trainer"]             # kustomization.yaml's Secret: {key: source file}
    secret_refs(workload)                     # {Secret: keys its pods take (volumes, env)}
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.33.0"   # a version kubernetes-validate ships schemas for (offline)
WORKLOAD_KINDS = ("StatefulSet", "Deployment", "Job")


def _docs() -> list[dict]:
    docs = [d for p in sorted(DEPLOY.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    assert docs, f"no manifests under {DEPLOY}"
    return docs


DOCS = _docs()
(KUSTOMIZATION,) = [d for d in DOCS if d["kind"] == "Kustomization"]
WORKLOADS = [d for d in DOCS if d["kind"] in WORKLOAD_KINDS]


def find(kind: str, name: str) -> dict:
    found = [d for d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"want one {kind} {name}, found {len(found)}"
    return found[0]


def component(doc: dict) -> str:
    return doc["metadata"]["labels"]["app.kubernetes.io/component"]


def pod(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def containers(workload: dict) -> list[dict]:
    spec = pod(workload)
    return spec.get("initContainers", []) + spec["containers"]


def container(workload: dict) -> dict:
    (main,) = pod(workload)["containers"]
    return main


def service_port(name: str, port_name: str) -> int:
    return next(p["port"] for p in find("Service", name)["spec"]["ports"] if p["name"] == port_name)


def flags(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def load_deploy_script(name: str):
    spec = importlib.util.spec_from_file_location(f"deploy_{name}", ROOT / "deploy" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def generated() -> dict[str, dict[str, str]]:
    """kustomization.yaml's Secrets: name -> {key: source file under deploy/kubernetes}."""
    out = {}
    for g in KUSTOMIZATION["secretGenerator"]:
        out[g["name"]] = dict(f.split("=", 1) for f in g["files"])
    return out


def secret_refs(workload: dict) -> dict[str, set[str]]:
    """Every Secret a workload's pods use -> the keys they take from it (volumes, env)."""
    refs: dict[str, set[str]] = {}
    for v in pod(workload).get("volumes", []):
        sources = [v] if "secret" in v else [s for s in v.get("projected", {}).get("sources", []) if "secret" in s]
        for s in sources:
            items = s["secret"].get("items")
            assert items, f"{workload['metadata']['name']}: secret volume {s['secret']} must list its items"
            refs.setdefault(s["secret"]["secretName" if "secretName" in s["secret"] else "name"], set()).update(
                i["key"] for i in items)
    for c in containers(workload):
        assert not any("secretRef" in e for e in c.get("envFrom", [])), "envFrom a Secret takes every key"
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs.setdefault(ref["name"], set()).add(ref["key"])
    return refs


def mount(workload: dict, secret: str) -> str:
    volume = next(v["name"] for v in pod(workload)["volumes"] if v.get("secret", {}).get("secretName") == secret)
    return next(m["mountPath"] for c in containers(workload) for m in c.get("volumeMounts", [])
                if m["name"] == volume)


def credential_files(workload: dict) -> set[str]:
    """The files a tether-image pod's init container copies from its Secret into its in-memory credentials folder."""
    spec = pod(workload)
    (init,) = spec["initContainers"]
    assert init["command"] == ["sh", "-c", "install -m 0400 /secrets/* /run/tether/"]
    (secret,) = [v["secret"] for v in spec["volumes"] if "secret" in v]
    return {f"/run/tether/{i['path']}" for i in secret["items"]}
