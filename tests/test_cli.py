"""The `tether` command's failures read as messages, fast, with a non-zero exit."""

import subprocess
import sys


def tether(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "tether", *args], capture_output=True, text=True, timeout=timeout)


def test_unknown_subcommand_prints_usage():
    run = tether("fly")
    assert run.returncode != 0 and "usage: tether {demo,triton,gateway,sim,edge,train,log," in run.stderr
    assert all(f",{command}" in run.stderr for command in ("status", "estop", "release"))  # tether.v1.Fleet


def test_gateway_without_triton_says_so(unused_port):
    run = tether("gateway", "--triton", f"127.0.0.1:{unused_port}", "--port", "0", "--triton-timeout", "1")
    assert run.returncode == 1
    assert f"Triton at 127.0.0.1:{unused_port} is not ready after 1 s" in run.stderr
    assert "Traceback" not in run.stderr


def test_triton_on_a_missing_repository_says_so(tmp_path):
    run = tether("triton", "--repository", str(tmp_path / "nope"), "--models", "x")
    assert run.returncode == 1 and "nope" in run.stderr and "Traceback" not in run.stderr


def test_demo_rejects_bad_flags():
    run = tether("demo", "--envs", "0")
    assert run.returncode == 2 and "--envs must be at least 1, got 0" in run.stderr
