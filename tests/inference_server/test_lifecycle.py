"""Starting and stopping tritonserver: clean stops, fast and explicit failures; the client's
failures against servers that are not there (or do not answer) are quick InferenceErrors."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from inference_server import InferenceError, ModelRepository, PolicyClient, TritonServer, TritonStartError
from inference_server import server as server_module

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def repository(tmp_path_factory, mlp, specs) -> ModelRepository:
    repo = ModelRepository(tmp_path_factory.mktemp("repository"))
    repo.write_version("policy", 1, mlp(1), *specs)
    return repo


def alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
        status = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False
    return status[status.rindex(")") + 2] != "Z"


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        if stat and int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def test_stop_leaves_no_process_behind(repository, tmp_path):
    log = tmp_path / "triton.log"
    server = TritonServer(repository.root, models=["policy"], log_path=log)
    server.start()
    pid = server.pid
    stubs = children(pid)
    assert alive(pid) and stubs, "a loaded python-backend model runs in a stub process"
    shm_prefix = server._shm_prefix
    assert list(Path("/dev/shm").glob(f"{shm_prefix}*")), "the python backend's shared memory, named by us"
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 10
    assert not alive(pid) and not any(alive(stub) for stub in stubs)
    assert server.pid is None and not list(Path("/dev/shm").glob(f"{shm_prefix}*"))
    server.stop()  # idempotent
    assert "successfully loaded 'policy'" in log.read_text()  # a log path we chose is kept

    with server:  # restarts on the same ports, as a context manager
        assert server.pid != pid and alive(server.pid)
        restarted, stubs = server.pid, children(server.pid)
        assert asyncio.run(_infer(server.grpc_url, 1))["action"].shape == (1, 2)
    assert not alive(restarted) and not any(alive(stub) for stub in stubs)
    assert not list(Path("/dev/shm").glob(f"{server._shm_prefix}*"))


async def _infer(url: str, version: int, *, timeout_s: float = 5.0) -> dict[str, np.ndarray]:
    client = PolicyClient(url, timeout_s=timeout_s)
    try:
        return await client.infer("policy", version, {"obs": np.zeros((1, 3), np.float32)}, ["action"])
    finally:
        await client.close()


def test_bad_repository_path_fails_at_once(tmp_path):
    started = time.monotonic()
    with pytest.raises(TritonStartError, match=f"model repository {tmp_path / 'missing'} is not a folder"):
        TritonServer(tmp_path / "missing").start()
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("kind", ["grpc", "http"])
def test_occupied_port_fails_quickly_with_the_log(repository, kind):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = TritonServer(repository.root, **{f"{kind}_port": port})
        started = time.monotonic()
        in_use = rf"(?s)exited with code \d+ .*'127.0.0.1:{port}' already in use"
        with pytest.raises(TritonStartError, match=in_use):
            server.start(timeout=30)
    assert time.monotonic() - started < 10
    assert server.pid is None


def test_unknown_model_fails_quickly_naming_it(repository):
    with pytest.raises(TritonStartError, match="failed to poll model 'nope'"):
        TritonServer(repository.root, models=["nope"]).start(timeout=30)


def test_not_ready_in_time_stops_the_process(repository, tmp_path):
    server = TritonServer(repository.root, models=["policy"], log_path=tmp_path / "t.log")
    late = rf"not ready on http://127.0.0.1:\d+ after 0.01 s .*log {tmp_path}"
    with pytest.raises(TritonStartError, match=late):
        server.start(timeout=0.01)
    assert server.pid is None


def test_missing_binary(monkeypatch, tmp_path):
    monkeypatch.setattr(server_module, "pytriton_root", lambda: tmp_path)
    missing = f"tritonserver binary not found .* at {tmp_path}/bin/tritonserver"
    with pytest.raises(TritonStartError, match=missing):
        TritonServer(tmp_path).start()


def test_unreachable_url_fails_fast():
    url = f"127.0.0.1:{server_module.free_port()}"
    started = time.monotonic()
    expected = re.escape(f"{url} model 'policy' version 3 failed (UNAVAILABLE)")
    with pytest.raises(InferenceError, match=expected) as info:
        asyncio.run(_infer(url, 3, timeout_s=2.0))
    assert info.value.code == "UNAVAILABLE" and info.value.url == url
    assert time.monotonic() - started < 2

    async def wait():
        client = PolicyClient(url)
        try:
            await client.wait_ready(timeout=0.3)
        finally:
            await client.close()

    with pytest.raises(InferenceError, match=f"Triton on {url} not ready after 0.3 s"):
        asyncio.run(wait())


def test_silent_server_times_out():
    """A peer that accepts the connection and never answers: DEADLINE_EXCEEDED, not a hang."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(InferenceError, match="DEADLINE_EXCEEDED") as info:
            asyncio.run(_infer(url, 1, timeout_s=0.5))
    assert time.monotonic() - started < 3
    assert info.value.code == "DEADLINE_EXCEEDED" and "'policy' version 1" in str(info.value)
