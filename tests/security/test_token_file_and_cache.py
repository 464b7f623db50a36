"""The tokens file under concurrent edits and floods of bad tokens: `tether token add` processes
racing each other all land (a file lock), the file and its folder are fsynced, and verification
results (good and bad) are cached, bounded, expire, and shared by concurrent checks of one token."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bridge.gateway.errors import GatewayError
from bridge.security import Authorizer
from bridge.security.tokens import TokenStore

RACERS = 6


def test_concurrent_token_add_processes_all_land(tmp_path):
    path = tmp_path / "tokens.json"
    procs = [subprocess.Popen([sys.executable, "-m", "tether", "token", "add", f"user{i}", "--role", "viewer",
                               "--file", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(RACERS)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * RACERS, [err for _, err in outs]
    store = TokenStore(path)
    assert [e.name for e in store.entries()] == sorted(f"user{i}" for i in range(RACERS))
    for i, (out, _) in enumerate(outs):  # each printed token verifies against the one file
        assert store.verify(out.strip()).name == f"user{i}"
    assert (tmp_path / ".tokens.json.lock").exists()


def test_a_token_edit_fsyncs_the_file_and_its_folder(tmp_path, monkeypatch):
    synced: list[str] = []
    real = os.fsync

    def recording(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    path = tmp_path / "auth" / "tokens.json"
    TokenStore(path).add("alice", role="operator")
    temp = [p for p in synced if Path(p).name.startswith(".tokens.json.") and p.endswith(".tmp")]
    assert temp and synced.index(temp[0]) < synced.index(str(path.parent)), synced  # the file, then the rename


def test_bad_tokens_cost_one_scrypt_per_distinct_token_even_when_they_arrive_together(tmp_path):
    store = TokenStore(tmp_path / "tokens.json")
    good = store.add("alice", role="operator")
    bad = [f"alice.not-the-secret-{i}" for i in range(5)] + ["nobody.x"]  # an unknown name costs no scrypt
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(store.verify, bad * 20 + [good] * 20))
    assert results[:len(bad) * 20] == [None] * (len(bad) * 20)
    assert {r.name for r in results[len(bad) * 20:]} == {"alice"}
    assert store.scrypt_calls == 5 + 1


def test_the_cache_is_bounded_expires_and_empties_when_the_file_changes(tmp_path):
    store = TokenStore(tmp_path / "tokens.json", cache_entries=2, cache_ttl_s=3600)
    good = store.add("alice", role="operator")
    for token in (good, "alice.a", "alice.b"):  # three results, two kept: the oldest (good) goes
        store.verify(token)
    assert store.scrypt_calls == 3
    store.verify("alice.b")
    assert store.scrypt_calls == 3
    assert store.verify(good).name == "alice" and store.scrypt_calls == 4  # evicted: hashed again
    store.revoke("alice")  # the file changed: nothing cached survives
    assert store.verify(good) is None and store.scrypt_calls == 4  # no entry named alice: refused unhashed

    short = TokenStore(tmp_path / "other.json", cache_ttl_s=0.0)
    token = short.add("bob", role="viewer")
    short.verify(token)
    short.verify(token)
    assert short.scrypt_calls == 2  # a result past its TTL is not reused


def test_token_checks_run_on_the_authorizers_own_threads_never_the_event_loop(tmp_path):
    store = TokenStore(tmp_path / "tokens.json")
    alice = store.add("alice", role="operator")
    auth = Authorizer(tokens=store)
    threads: list[str] = []
    verify = store.verify

    def recording(token):
        threads.append(threading.current_thread().name)
        return verify(token)

    store.verify = recording

    async def scenario():
        assert await auth.check_http({"Authorization": f"Bearer {alice}"}, "operator") == "operator:alice"
        with pytest.raises(GatewayError, match="does not verify"):
            await auth.check_http({"Authorization": "Bearer alice.wrong"}, "viewer")
        return threading.current_thread().name

    loop_thread = asyncio.run(scenario())
    assert len(threads) == 2 and all(name.startswith("tether-tokens") for name in threads), threads
    assert loop_thread not in threads
