"""tether.stack.Stack secured (TLS + tokens): its own clients get through with the credentials it hands
out (sims in process, `tether sim` with its flags, a policy import), a plaintext client and a client
without a token do not; closing it leaves none of its processes, nor does its owner's SIGKILL, nor a
pytest run's end by SIGTERM or SIGKILL (Triton checked by its process group in /proc)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from bridge.common.processes import group_members, spawn, stop_group
from sim.client import ClientTls, SessionError, run_sessions
from sim.mujoco import make_env
from tests.support.waiting import wait_until
from tether.stack import Stack
from tether.testing import run_sims

ROOT = Path(__file__).resolve().parents[1]

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
    # Triton's exit timeout is 1 s, the gateway drains: bounded, not timed
    wait_until(lambda: not [pid for pid in pids.values() if group_members(pid)], timeout=60, period=0.1,
               what="the SIGKILLed owner's Triton and gateway gone")


SAMPLE_CONFTEST = """
import os
from pathlib import Path

import pytest
from inference_server import TritonServer

@pytest.fixture(scope="session")
def triton(tmp_path_factory):  # a session's own Triton, as tests/conftest.py has, not the plugin's stack
    server = TritonServer(tmp_path_factory.mktemp("models"))
    server.start()
    yield server
    server.stop()
    Path(os.environ["SAMPLE_OUT"], "stopped").write_text("torn down")
"""

SAMPLE_TEST = """
import os, time
from pathlib import Path

def test_blocks(triton):
    Path(os.environ["SAMPLE_OUT"], "triton.pid").write_text(str(triton.pid))
    time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_pytest_run_ended_by_a_signal_leaves_no_triton_behind(tmp_path, sig):
    """SIGTERM (a cancelled CI job) ends the run as Ctrl-C does: the plugin (tether.testing) makes pytest tear the
    session's fixtures down, so Triton is gone when pytest exits. SIGKILL: the kernel sends tritonserver SIGTERM."""
    sample, out = tmp_path / "sample", tmp_path / "out"
    sample.mkdir()
    out.mkdir()
    (sample / "pytest.ini").write_text("[pytest]\n")
    (sample / "conftest.py").write_text(SAMPLE_CONFTEST)
    (sample / "test_sample.py").write_text(SAMPLE_TEST)
    env = {**os.environ, "SAMPLE_OUT": str(out), "PYTHONPATH": str(ROOT)}
    with open(tmp_path / "pytest.log", "w") as log:
        run = spawn([sys.executable, "-m", "pytest", "-q", "-p", "tether.testing", "-p", "no:cacheprovider"],
                    cwd=sample, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        pid_file = out / "triton.pid"
        wait_until(lambda: pid_file.exists() or run.poll() is not None, timeout=300, period=0.1,
                   what="the sample's Triton started")
        assert run.poll() is None, (tmp_path / "pytest.log").read_text()[-3000:]
        triton = int(pid_file.read_text())
        assert group_members(triton), "the sample's Triton is not running"
        run.send_signal(sig)
        code = run.wait(timeout=120)
    finally:
        stop_group(run)
    report = (tmp_path / "pytest.log").read_text()
    if sig == signal.SIGTERM:
        assert code == pytest.ExitCode.INTERRUPTED and "Terminated: signal 15" in report, report[-3000:]
        assert (out / "stopped").exists(), "the session's fixtures were not torn down"
        assert not group_members(triton), "Triton outlived the SIGTERMed run"
    else:
        assert code == -signal.SIGKILL
        wait_until(lambda: not group_members(triton), timeout=60, period=0.1, what="the SIGKILLed run's Triton gone")
