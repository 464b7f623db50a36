"""The namespace lab itself (tests/support/hosts.py): hosts reach each other on their network and nothing
else; a partition drops a host's packets and a heal brings them back; nothing is left behind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.hosts import Lab, namespaces_possible

pytestmark = pytest.mark.skipif(bool(namespaces_possible()), reason=namespaces_possible() or "-")

# A one-shot TCP echo server inside a host: prints "ready" once listening, echoes one line, exits.
ECHO = ("import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        "s.bind((sys.argv[1], 7000)); s.listen(); print('ready', flush=True); "
        "[(c.sendall(c.recv(64)), c.close()) for c in (s.accept()[0] for _ in range(int(sys.argv[2])))]")
# A client inside a host: prints the echoed bytes, or the error's class name.
CLIENT = ("import socket,sys\ntry:\n s=socket.create_connection((sys.argv[1], 7000), timeout=float(sys.argv[2]))\n"
          " s.sendall(b'hi'); print(s.recv(64).decode())\nexcept OSError as e: print(type(e).__name__, e.errno)")


def _echo(host, address: str, connections: int) -> subprocess.Popen:
    proc = host.popen([sys.executable, "-c", ECHO, address, str(connections)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _call(host, address: str, timeout: float = 5.0) -> str:
    done = host.run([sys.executable, "-c", CLIENT, address, str(timeout)], capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or done.stderr.strip()


def test_hosts_reach_each_other_only_on_their_networks_and_a_partition_drops_packets_until_healed():
    before = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.count("\n")
    with Lab() as lab:
        server = lab.host("server", networks=("lab", "trainers"))
        peer = lab.host("peer", networks=("trainers",))
        outsider = lab.host("outsider")
        assert server.address() == "198.18.0.1" and server.address("trainers") == "198.18.1.1"
        assert peer.address("trainers") == "198.18.1.2" and outsider.address() == "198.18.0.2"
        echo = _echo(server, server.address("trainers"), connections=2)
        assert _call(peer, server.address("trainers")) == "hi"
        # the outsider has no route to the trainers' network: refused at once by its own kernel
        assert _call(outsider, server.address("trainers")).startswith("OSError 101")  # ENETUNREACH
        # and the server bound only its trainers' address: on the lab network nothing listens
        assert _call(outsider, server.address("lab")).startswith("ConnectionRefusedError")
        lab.partition(server)
        assert _call(peer, server.address("trainers"), timeout=1.0).startswith("TimeoutError")
        lab.heal(server)
        assert _call(peer, server.address("trainers")) == "hi"
        echo.wait(10)
        # the machine itself is not on any lab network (no address of it here; we never send to one from here)
        assert "198.18." not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        names = [h.netns for h in lab.hosts.values()]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names), listed
    assert subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.count("\n") == before
