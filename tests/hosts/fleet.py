"""The fleet's roles placed on lab hosts (tests/support/hosts.py), each engine started with the lab's
credentials (`tether cluster certs`), each process inside its own host's network namespace.

    with Lab() as lab, Placed(lab, tmp_path) as fleet:
        triton = fleet.triton(lab.host("triton"))              # "198.18.0.1:PORT", restricted by the secret
        gw = fleet.gateway(lab.host("gw0"), triton)            # TLS + tokens; "198.18.0.2:50051"
        fleet.stop()                                           # every process, the last started first

Processes print a ready line (`tests.hosts.roles`, `tether gateway`, `python -m trainer.rendezvous`);
starting one waits for that line, and a process that exits first fails the test with its log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from bridge.common.processes import stop_group
from bridge.security.lab import LabCredentials
from tests.support.hosts import Host, Lab

ROOT = Path(__file__).resolve().parents[2]
GATEWAY_PORT = 50051


class Placed:
    """Starts roles on hosts; `stop()` stops them in reverse order (SIGTERM, then SIGKILL)."""

    def __init__(self, lab: Lab, tmp: Path, *, hosts_in_certs: list[str] | None = None):
        self.lab, self.tmp = lab, tmp
        hosts = hosts_in_certs or [f"198.18.{k}.{i}" for k in range(4) for i in range(1, 12)]
        self.creds = LabCredentials.create(tmp / "credentials", hosts=hosts)
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []

    def __enter__(self) -> Placed:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self, name: str, host: Host, cmd: list[str], *, ready: str, timeout: float = 120.0,
              env: dict | None = None) -> tuple[subprocess.Popen, str]:
        """Run `cmd` in `host`; return (process, the rest of its first stdout line starting with `ready`)."""
        log = self.tmp / f"{name}.log"
        proc = host.popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=open(log, "a"), text=True,  # noqa: SIM115
                          start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        self.procs.append((name, proc, log))
        got: list[str] = []
        seen = threading.Event()

        def pump():
            for line in proc.stdout:
                if not got and line.startswith(ready):
                    got.append(line[len(ready):].strip())
                    seen.set()
            seen.set()
        threading.Thread(target=pump, daemon=True).start()
        if not seen.wait(timeout) or not got:
            raise AssertionError(f"{name} on {host.name}: no '{ready}' line within {timeout:g} s (exit "
                                 f"{proc.poll()}); log:\n{log.read_text()[-3000:]}")
        return proc, got[0]

    def role(self, role: str, host: Host, *extra: str, network: str = "lab") -> str:
        """An engine of tests.hosts.roles on `host`; its address."""
        _, address = self.start(role, host, [sys.executable, "-m", "tests.hosts.roles", role, "--dir",
                                             str(self.tmp / role), "--host", host.address(network), "--creds",
                                             str(self.creds.folder), *extra], ready="ready ")
        return address

    def triton(self, host: Host) -> str:
        return self.role("triton", host)

    def gateway(self, host: Host, triton: str, *extra: str, name: str = "") -> str:
        name = name or host.name
        crt, key = self.creds.server_pair("gateway")
        cmd = [sys.executable, "-m", "tether", "gateway", "--triton", triton, "--policy", "tiny",
               "--host", host.address(), "--port", str(GATEWAY_PORT), "--gateway-id", name,
               "--experience-dir", str(self.tmp / f"{name}-experience"), "--deadline-ms", "2000",
               "--tls-cert", str(crt), "--tls-key", str(key), "--tokens", str(self.creds.tokens_file),
               "--triton-secret-file", str(self.creds.triton_secret_file), "--no-anonymous-viewers", *extra]
        self.start(name, host, cmd, ready="gateway listening on")
        return f"{host.address()}:{GATEWAY_PORT}"

    def rendezvous(self, host: Host, *, network: str = "trainers") -> str:
        _, address = self.start("rendezvous", host, [sys.executable, "-m", "trainer.rendezvous", "--host",
                                                     host.address(network), "--port", "29400"],
                                ready="rendezvous listening on ")
        return address

    def stop(self) -> None:
        for _, proc, _ in reversed(self.procs):
            stop_group(proc, grace_s=30)
        self.procs.clear()

    def outsider(self, host: Host, **targets: str) -> dict:
        """Run tests.hosts.outsider in `host` against `targets` (triton=, gateway=, postgres=, ...)."""
        import json

        args = [f"--{k}={v}" for k, v in targets.items() if v]
        done = host.run([sys.executable, "-m", "tests.hosts.outsider", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=180, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])
