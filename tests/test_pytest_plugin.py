"""The pytest plugin `tether.testing` in a sample project, run as a separate pytest (pytester): the
stack starts once for the session, sims run through it, a failing test gets the gateway's log, and
when the run ends (normally, or by SIGTERM as a cancelled CI job) no process the stack started is left."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bridge.common.processes import group_members
from tests.support.processes import command_lines, reaped
from tests.support.waiting import wait_until
from tether.stack import Stack, StackError
from tether.testing import absent

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

DOCS = ROOT / "docs" / "testing.md"

# beside the docs' sample (conftest.py, test_policy.py): a failing test, a skipped one, and the pids
CHECKS = """
import json, os
import pytest

def test_records_the_stacks_processes(tether_stack):
    with open(os.environ["SAMPLE_PIDS"], "w") as f:
        json.dump(tether_stack.pids, f)

def test_fails_on_purpose(tether_sim):
    assert tether_sim("InvertedPendulum-v5", episodes=1).mean_return > 1e9, "deliberately failing"

@pytest.mark.requires_binary("no-such-binary-for-tether")
def test_needs_an_absent_binary():
    pass
"""


def docs_sample(name: str) -> str:
    """The Python block of docs/testing.md whose first line is `# NAME`."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    found = [b for b in blocks if b.startswith(f"# {name}\n")]
    assert len(found) == 1, f"docs/testing.md has {len(found)} blocks starting '# {name}'"
    return found[0]


HANGS = """
import json, os, time

def test_hangs_until_terminated(tether_stack):
    with open(os.environ["SAMPLE_PIDS"], "w") as f:
        json.dump(tether_stack.pids, f)
    time.sleep(300)
"""


def _sample(pytester: pytest.Pytester, conftest: str, **tests: str) -> None:
    pytester.makeini("[pytest]\naddopts = -p tether.testing -p no:cacheprovider\n")
    pytester.makeconftest(conftest)
    pytester.makepyfile(**tests)


def _left(pids: dict[str, int]) -> dict[str, list[int]]:
    """Live processes of each started process's group (each leads its own)."""
    return {role: members for role, pid in pids.items() if (members := group_members(pid))}


@pytest.mark.slow
def test_a_sample_project_gets_the_stack_its_sims_and_a_teardown_that_leaves_nothing(pytester, tmp_path,
                                                                                       monkeypatch):
    pids_file = tmp_path / "pids.json"
    monkeypatch.setenv("SAMPLE_PIDS", str(pids_file))
    _sample(pytester, docs_sample("conftest.py"), test_policy=docs_sample("test_policy.py"), test_checks=CHECKS)
    result = pytester.runpytest_subprocess("-ra", timeout=480)  # bounded: a loaded machine starts Triton slowly
    gpu = absent("requires_gpu") is None  # the docs' GPU test skips without one
    result.assert_outcomes(passed=2 + gpu, failed=1, skipped=2 - gpu)
    out = result.stdout.str()
    assert "deliberately failing" in out and "tether gateway log" in out  # the failure carries the gateway's log
    assert "requires_binary: executable not on PATH: no-such-binary-for-tether" in out
    pids = json.loads(pids_file.read_text())
    assert set(pids) == {"triton", "gateway"}
    assert not _left(pids), f"processes outlived the sample run: {_left(pids)}"


@pytest.mark.slow
def test_sigterm_to_the_run_still_tears_the_stack_down(pytester, tmp_path):
    """A cancelled CI job sends SIGTERM: the plugin turns it into an interrupted run whose teardown runs."""
    pids_file = tmp_path / "pids.json"
    _sample(pytester, "", test_sample=HANGS)  # a bare stack: Triton without models, a gateway without a policy
    with reaped(subprocess.Popen([sys.executable, "-m", "pytest", "-q"], cwd=pytester.path, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True,
                                 env={**os.environ, "SAMPLE_PIDS": str(pids_file)})) as proc:
        wait_until(lambda: pids_file.exists() and pids_file.read_text() or proc.poll() is not None,
                   "the sample's stack starting", timeout=300, period=0.1)
        assert proc.poll() is None, proc.stdout.read()
        pids = json.loads(pids_file.read_text())
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    assert "KeyboardInterrupt" in out or "Terminated" in out, out[-2000:]
    assert not _left(pids), f"processes outlived the terminated run: {_left(pids)}"


@pytest.mark.slow
def test_a_stack_that_fails_to_start_stops_what_it_started(tmp_path):
    stack = Stack(tmp_path, gateway_args=["--max-batch", "0"])
    with pytest.raises(StackError, match="gateway did not start") as info:
        stack.start()
    assert "max" in str(info.value).lower()  # the gateway's own refusal, from its log
    assert stack.pids == {} or not _left(stack.pids)
    assert not [line for line in command_lines() if str(tmp_path) in line], "a process of the failed stack is left"


def test_markers_name_what_is_absent():
    assert absent("requires_binary", "sh") is None
    assert absent("requires_binary", "no-such-a", "sh", "no-such-b") == "executable not on PATH: no-such-a, no-such-b"
    assert absent("requires_mujoco") is None and absent("requires_triton") is None  # installed here
    with pytest.raises(ValueError, match="unknown marker 'requires_nothing'"):
        absent("requires_nothing")


def test_the_plugin_is_registered_under_its_module_name():
    """`-p tether.testing` and the pytest11 entry point name the same plugin, so both together load it once."""
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert entry == {"tether.testing": "tether.testing"}
