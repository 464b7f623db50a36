"""Hosts, not ports: Linux network namespaces joined by veth pairs on a bridge, made and removed by a test.

    with Lab() as lab:                                   # needs root (CI and sessions are)
        db = lab.host("db")                              # its own namespace, 198.18.0.1 on the "lab" network
        gw = lab.host("gateway", networks=("lab", "trainers"))
        outsider = lab.host("outsider")                  # on the same network, holding no credential
        proc = db.popen(["postgres", ...])               # a process inside db's namespace
        gw.address()                                     # "198.18.0.2"; gw.address("trainers") -> "198.18.1.1"
        lab.partition(db)                                # db's links taken down: packets to and from it vanish
        lab.heal(db)                                     # and brought back

Each network is a bridge inside a namespace of its own (the "switch"), so nothing is attached to the
machine's own namespace: no packet of a lab reaches eth0, and the machine cannot reach a lab host either.
Addresses come from 198.18.0.0/15 (RFC 2544's range for test networks): network k is 198.18.k.0/24.
Every host has its own loopback up, so a server can keep its monitor port on 127.0.0.1 of its host.
Namespaces left by a killed test run (named after a pid that is gone) are removed by the next Lab.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Host", "Lab", "LabError", "namespaces_possible"]

_PREFIX = "tlab"
_NAME = re.compile(r"[a-z][a-z0-9]{0,11}")
_NETWORKS = ("lab", "trainers", "robots", "db")  # network k of this tuple is 198.18.k.0/24


class LabError(RuntimeError):
    """A namespace, link or address could not be made; the message carries the `ip` command and its output."""


def namespaces_possible() -> str:
    """"" where this process can make network namespaces, else why not (a skip reason)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    probe = f"{_PREFIX}-{os.getpid()}-probe"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"`ip netns add` failed: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


@dataclass
class Host:
    """One machine of the lab: a network namespace with an address on each network it joined."""

    name: str
    netns: str
    addresses: dict[str, str] = field(default_factory=dict)  # network -> IPv4 address

    def address(self, network: str = "lab") -> str:
        try:
            return self.addresses[network]
        except KeyError:
            raise LabError(f"host {self.name} is not on network {network!r} (on {sorted(self.addresses)})") from None

    def command(self, cmd: Sequence[str]) -> list[str]:
        """`cmd` as run inside this host (`ip netns exec` execs it: the Popen's pid is the command's)."""
        return ["ip", "netns", "exec", self.netns, *cmd]

    def popen(self, cmd: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(cmd), **kwargs)

    def run(self, cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(cmd), **kwargs)


class Lab:
    """A test's hosts and networks; `close()` (or leaving the `with`) deletes every namespace it made."""

    def __init__(self):
        why = namespaces_possible()
        if why:
            raise LabError(why)
        _reap_stale()
        self._tag = f"{_PREFIX}-{os.getpid()}-{id(self) & 0xFFFF:x}"
        self.hosts: dict[str, Host] = {}
        self._switches: dict[str, str] = {}   # network -> the switch namespace holding its bridge
        self._ports: dict[str, list[tuple[str, str]]] = {}  # host -> [(switch namespace, switch end of its veth)]

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def host(self, name: str, *, networks: Sequence[str] = ("lab",)) -> Host:
        """A new host on `networks` (each from "lab", "trainers", "robots", "db"), addresses in join order."""
        if not _NAME.fullmatch(name) or name in self.hosts:
            raise LabError(f"host name must be new and match {_NAME.pattern}, got {name!r}")
        host = Host(name, f"{self._tag}-{name}")
        _ip("netns", "add", host.netns)
        self.hosts[name] = host
        _ip("-n", host.netns, "link", "set", "lo", "up")
        for network in networks:
            self._join(host, network)
        return host

    def _join(self, host: Host, network: str) -> None:
        if network not in _NETWORKS:
            raise LabError(f"unknown network {network!r}; one of {', '.join(_NETWORKS)}")
        switch = self._switch(network)
        index = sum(network in h.addresses for h in self.hosts.values()) + 1
        inside, port = f"{network}0", f"h{list(self.hosts).index(host.name)}"
        _ip("link", "add", "name", inside, "netns", host.netns, "type", "veth", "peer", "name", port,
            "netns", switch)
        _ip("-n", switch, "link", "set", port, "master", "br0", "up")
        address = f"198.18.{_NETWORKS.index(network)}.{index}"
        _ip("-n", host.netns, "addr", "add", f"{address}/24", "dev", inside)
        _ip("-n", host.netns, "link", "set", inside, "up")
        host.addresses[network] = address
        self._ports.setdefault(host.name, []).append((switch, port))

    def _switch(self, network: str) -> str:
        if network not in self._switches:
            switch = f"{self._tag}-sw-{network}"
            _ip("netns", "add", switch)
            self._switches[network] = switch
            _ip("-n", switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", switch, "link", "set", "br0", "up")
        return self._switches[network]

    def partition(self, host: Host) -> None:
        """Take every link of `host` down at the switch: its packets are dropped, no connection is reset."""
        for switch, port in self._ports.get(host.name, ()):
            _ip("-n", switch, "link", "set", port, "down")

    def heal(self, host: Host) -> None:
        for switch, port in self._ports.get(host.name, ()):
            _ip("-n", switch, "link", "set", port, "up")

    def close(self) -> None:
        """Kill what still runs in the lab's hosts, then delete every namespace (their veths go with them)."""
        for host in self.hosts.values():
            _kill_namespace(host.netns)
        for netns in [h.netns for h in self.hosts.values()] + list(self._switches.values()):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        self.hosts.clear()
        self._switches.clear()
        self._ports.clear()


def _kill_namespace(netns: str) -> None:
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    for pid in done.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)


def _reap_stale() -> None:
    """Delete lab namespaces whose creating process is gone (a test run killed before its teardown)."""
    run_dir = Path("/run/netns")
    if not run_dir.is_dir():
        return
    for entry in run_dir.iterdir():
        parts = entry.name.split("-")
        if len(parts) < 3 or parts[0] != _PREFIX or not parts[1].isdigit():
            continue
        if not Path(f"/proc/{parts[1]}").exists():
            _kill_namespace(entry.name)
            subprocess.run(["ip", "netns", "del", entry.name], capture_output=True)
