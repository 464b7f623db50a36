"""The rendezvous store listens on exactly the address it is given, and the run id comes from a file.

torch's `TCPStore(host, ...)` listens on every interface whatever `host` says (the control test below
shows it); `trainer.rendezvous` binds the socket itself and hands it to the store. Refusals are the
kernel's answer (ECONNREFUSED at once), never a timeout. The run id: `python -m trainer.rendezvous
--new-id-file` writes one (0600), `tether train --rdzv-id-file` reads it and gives it to torchrun through
its environment; a real one-node elastic run meets at the store under that id, and no process's command
line ever holds it.
"""

from __future__ import annotations

import errno
import json
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from bridge.common.processes import spawn, stop_group
from tests.support.processes import command_lines
from tests.trainer.test_torchrun import scripted_log
from trainer.rendezvous import READY, read_run_id, serve

ROOT = Path(__file__).resolve().parents[2]
HOST, OTHER = "127.0.0.2", "127.0.0.1"


def _connect(host: str, port: int) -> None:
    """Open and close a TCP connection; raises what the kernel answers (ConnectionRefusedError)."""
    with socket.create_connection((host, port), timeout=5):
        pass


def _refused(host: str, port: int) -> float:
    """Assert host:port refuses a connection (ECONNREFUSED, not a timeout); the seconds it took."""
    started = time.monotonic()
    with pytest.raises(ConnectionRefusedError) as info:
        _connect(host, port)
    assert info.value.errno == errno.ECONNREFUSED
    return time.monotonic() - started


def _listening(port: int) -> set[str]:
    """The local addresses (dotted IPv4, or "::" forms as hex) with a LISTEN socket on `port` (/proc/net/tcp*)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]) if len(address) == 8 else address)
    return found


def _client(host: str, port: int) -> TCPStore:
    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=10))


def test_torchs_own_store_listens_on_every_interface_whatever_host_it_is_given():
    """The control: what the fix changes (if torch ever honours `host`, this test says so)."""
    store = TCPStore(HOST, 0, is_master=True, multi_tenant=False, wait_for_workers=False,
                     timeout=timedelta(seconds=10))
    try:
        assert HOST not in _listening(store.port)  # a wildcard socket
        _connect(OTHER, store.port)  # accepted on an address it was not given
    finally:
        del store


def test_the_store_is_reachable_on_its_address_and_refused_on_another():
    store = serve(HOST, 0)
    try:
        assert _listening(store.port) == {HOST}
        client = _client(HOST, store.port)
        client.set("torch.rendezvous.x", "written")
        assert store.get("torch.rendezvous.x") == b"written"
        took = _refused(OTHER, store.port)  # the same port on another loopback address
        assert took < 1.0
        del client
    finally:
        del store


def test_the_rendezvous_process_binds_its_host_and_ends_on_sigterm():
    proc = spawn([sys.executable, "-m", "trainer.rendezvous", "--host", HOST, "--port", "0"], cwd=ROOT,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"{READY}{HOST}:"), (line, proc.stderr.read() if proc.poll() is not None else "")
        port = int(line.rsplit(":", 1)[1])
        assert _listening(port) == {HOST}
        _refused(OTHER, port)
        client = _client(HOST, port)
        client.set("k", "v")
        assert client.get("k") == b"v"
        del client
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        _refused(HOST, port)  # gone with its process
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_taken_address_is_refused_naming_it():
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "trainer.rendezvous", "--host", HOST, "--port", str(port)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"rendezvous cannot listen on {HOST}:{port}" in proc.stderr and "Address already in use" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_new_id_file_is_private_random_and_read_back(tmp_path):
    ids = []
    for name in ("a.id", "b.id"):
        path = tmp_path / name
        subprocess.run([sys.executable, "-m", "trainer.rendezvous", "--new-id-file", str(path)], cwd=ROOT,
                       check=True, capture_output=True, timeout=120)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        ids.append(read_run_id(path))
    assert ids[0] != ids[1] and all(re.fullmatch(r"[A-Za-z0-9_-]{32}", i) for i in ids)
    (tmp_path / "bad.id").write_text("guessable\n")
    with pytest.raises(ValueError, match=r"bad\.id.*16-128 characters.*it holds 9 characters") as info:
        read_run_id(tmp_path / "bad.id")
    assert "guessable" not in str(info.value)  # the content is not echoed
    with pytest.raises(ValueError, match="missing.id"):
        read_run_id(tmp_path / "missing.id")


def test_tether_train_takes_rdzv_id_or_rdzv_id_file_not_both(tmp_path):
    (tmp_path / "run.id").write_text("x" * 32)
    proc = subprocess.run([sys.executable, "-m", "trainer.main", "--rdzv-endpoint", f"{HOST}:29400",
                           "--rdzv-id", "mine", "--rdzv-id-file", str(tmp_path / "run.id"), "--algo", "bc"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "give --rdzv-id 'mine' or --rdzv-id-file" in proc.stderr


@pytest.mark.slow
def test_an_elastic_run_meets_under_the_id_from_the_file_and_no_command_line_holds_it(tmp_path):
    scripted_log(tmp_path / "log", n=300)
    id_file = tmp_path / "rendezvous.id"
    subprocess.run([sys.executable, "-m", "trainer.rendezvous", "--new-id-file", str(id_file)], cwd=ROOT,
                   check=True, capture_output=True, timeout=120)
    run_id = read_run_id(id_file)
    store = serve(HOST, 0)
    log = tmp_path / "train.log"
    try:
        with open(log, "w") as out:
            proc = spawn(
                [sys.executable, "-m", "trainer.main", "--nnodes", "1:2", "--rdzv-endpoint", f"{HOST}:{store.port}",
                 "--rdzv-id-file", str(id_file), "--rdzv-external", "--nproc", "1", "--max-restarts", "0",
                 "--algo", "bc", "--arch", "mlp", "--experience-dir", str(tmp_path / "log"), "--steps", "20",
                 "--batch", "32", "--status-every", "0", "--seed", "0"],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=out, text=True)
        seen = 0
        try:
            while proc.poll() is None:  # every process's command line, while the run lasts
                lines = command_lines()
                assert not [c for c in lines if run_id in c], "the run id is on a command line"
                seen += sum("torch.distributed.run" in c for c in lines)
                time.sleep(0.1)
            stdout = proc.stdout.read()
        finally:
            stop_group(proc)
        assert proc.returncode == 0, log.read_text()[-3000:]
        assert seen > 0  # the scan did see torchrun running
        summary = json.loads(stdout.strip().splitlines()[-1])
        assert summary["world_size"] == 1 and summary["steps"] == 20
        keys = _client(HOST, store.port).list_keys()
        assert f"torch.rendezvous.{run_id}" in keys, keys  # the rendezvous met under the id from the file
    finally:
        del store
