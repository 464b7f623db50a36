"""tether.stack.Stack secured (TLS + tokens): its own clients get through with the credentials it hands
out (sims in process, `tether sim` with its flags, a policy import), a plaintext client and a client
without a token do not; closing it leaves none of its processes, nor does its owner's SIGKILL."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import grpc
import pytest

from inference_server.server import group_members
from sim.client import ClientTls, SessionError, run_sessions
from sim.mujoco import make_env
from tether.stack import Stack
from tether.testing import run_sims

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]  # torch.jit.*


def scripted_policy(path, env_id: str):
    """A TorchScript policy for `env_id`'s specs, saved with its tether.json."""
    import torch

    from inference_server.artifact import specs_to_json

    env = make_env(env_id)
    obs, act = env.observation_spec(), env.action_spec()
    env.close()
    torch.manual_seed(0)
    module = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(obs[0].shape[0], act[0].shape[0]), torch.nn.Tanh()))
    torch.jit.save(module, str(path), _extra_files={"tether.json": specs_to_json(obs, act)})
    return path


def test_a_secured_stack_serves_its_own_credentials_and_refuses_others(tmp_path):
    env = "InvertedPendulum-v5"
    with Stack(tmp_path, envs=[env], secure=True) as stack:
        pids = stack.pids
        result = asyncio.run(run_sims(stack, env, episodes=2, envs=2))
        assert result.episodes == 2 and not result.errors and result.policy == "invertedpendulum_v5"
        flags = stack.client_flags()
        assert flags[:2] == ["--gateway", stack.gateway] and "--tls-ca" in flags and "--token" in flags
        cli = subprocess.run([sys.executable, "-m", "tether", "sim", *flags, "--env", env, "--episodes", "2",
                              "--policy", "invertedpendulum_v5"], capture_output=True, text=True, timeout=120)
        assert cli.returncode == 0, cli.stderr[-2000:]
        assert json.loads(cli.stdout)["episodes"] == 2

        def refused(**kw) -> grpc.StatusCode:
            with pytest.raises(SessionError) as info:
                asyncio.run(run_sessions(stack.gateway, lambda i: make_env(env), envs=1, steps=5,
                                         connect_timeout=5, **kw))
            return info.value.code

        with pytest.raises(ConnectionError):  # plaintext to a TLS port never connects
            asyncio.run(run_sessions(stack.gateway, lambda i: make_env(env), envs=1, steps=5, connect_timeout=3))
        assert refused(tls=ClientTls(ca=stack.ca)) == grpc.StatusCode.UNAUTHENTICATED      # TLS, no token
        assert refused(tls=ClientTls(ca=stack.ca), token="ci.wrong") == grpc.StatusCode.UNAUTHENTICATED

        version = stack.import_policy(scripted_policy(tmp_path / "mine.pt", env), name="mine")  # over TLS + token
        mine = asyncio.run(run_sims(stack, env, episodes=1, policy="mine"))
        assert version == 1 and mine.policy_versions == {1: mine.steps} and not mine.errors
    assert not [pid for pid in pids.values() if group_members(pid)], "a process of the stack outlived close()"


CHILD = """
import json, sys, time
from tether.stack import Stack
stack = Stack(sys.argv[1]).start()       # bare: Triton without models, a gateway without a policy
print(json.dumps(stack.pids), flush=True)
time.sleep(600)
"""


def test_a_sigkilled_owner_leaves_no_stack_behind(tmp_path):
    """The owner cannot clean up after SIGKILL: the kernel sends Triton and the gateway SIGTERM (PDEATHSIG)."""
    owner = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(owner.stdout.readline() or "{}")
        assert set(pids) == {"triton", "gateway"}, f"the stack did not start (exit {owner.poll()})"
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 60  # Triton's exit timeout is 1 s, the gateway drains: bounded, not timed
    while (left := [pid for pid in pids.values() if group_members(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes outlived their SIGKILLed owner by 60 s: {left}"
