"""The session's Triton (tests/support/triton.py) outlives a crash: killed, it is started again on its ports, serving
what the repository holds, and the next test that asks for it says so in a warning."""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from inference_server import PolicyClient
from tests.support.waiting import wait_until


def _act(url: str, policy: str) -> np.ndarray:
    async def ask():
        client = PolicyClient(url, timeout_s=30)
        try:
            return (await client.infer(policy, 1, {"observation": np.ones((1, 11), np.float32)}, ["action"]))["action"]
        finally:
            await client.close()

    return asyncio.run(ask())


def test_a_killed_session_triton_is_started_again_on_its_ports(triton):
    url, before = triton.url, _act(triton.url, triton.policy)
    triton.add_policy("crashed-module", seed=4)  # a module's own model, loaded when the server died
    os.kill(triton.server.pid, signal.SIGKILL)  # as the python backend's SIGSEGV ends it
    wait_until(lambda: triton.server.exited() is not None, "the session's Triton gone", timeout=30)
    with pytest.warns(UserWarning, match=r"the session's Triton exited with -9 and was restarted on the same ports"):
        triton.settle()
    assert triton.url == url and triton.server.exited() is None
    np.testing.assert_array_equal(_act(url, triton.policy), before)
    assert _act(url, "crashed-module").shape == (1, 3)
