"""`tether eval` as CI runs it: a subprocess with its own embedded Triton + gateway, judged by its exit status,
its JUnit file and its JSON. A good pendulum controller passes and reruns to identical figures (MuJoCo,
fixed seeds, the same batch every step); its sign flip fails naming env and check; usage errors exit 2.
The paired comparison against a baseline: test_eval_baseline.py; through a secured gateway:
test_eval_gateway.py."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.evaluation.policies import linear_policy

# real processes: a loaded 2-core machine stretches them
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow,
              pytest.mark.requires_triton, pytest.mark.requires_mujoco, pytest.mark.timeout(900)]

PENDULUM = ["--env", "InvertedPendulum-v5", "--max-episode-steps", "100", "--episodes", "4", "--envs", "4"]


def tether_eval(*args, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tether", "eval", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def failures(junit_path) -> dict[str, str]:
    """JUnit test case name -> its failure message, for the failed cases."""
    root = ET.parse(junit_path).getroot()
    return {case.get("name"): case.find("failure").get("message") for case in root.iter("testcase")
            if case.find("failure") is not None}


def test_a_good_policy_passes_and_reruns_to_identical_figures(tmp_path):
    good = linear_policy(tmp_path / "good.pt", "InvertedPendulum-v5")
    runs = []
    for i in range(2):
        run = tether_eval(good, *PENDULUM, "--min-return", 90, "--max-bound-violations", 0, "--summary",
                          tmp_path / f"run{i}.json", "--junit", tmp_path / f"run{i}.xml")
        assert run.returncode == 0, run.stdout + run.stderr
        runs.append(json.loads((tmp_path / f"run{i}.json").read_text()))
    assert failures(tmp_path / "run0.xml") == {}
    env = runs[0]["envs"][0]["candidate"]
    assert env["returns"] == [100.0] * 4 and env["lengths"] == [100] * 4 and env["seeds"] == [0, 1, 2, 3]
    assert env["bound_violations"] == 0 and env["latency_ms"]["p99"] > 0 and env["policy_versions"] == {"1": 400}
    figures = ("seeds", "returns", "lengths", "bound_violations", "jerk", "max_step", "return_ci95", "errors")
    assert [{k: r["envs"][0]["candidate"][k] for k in figures} for r in runs][0] == \
        {k: runs[1]["envs"][0]["candidate"][k] for k in figures}
    versions = runs[0]["versions"]
    assert versions["triton"].startswith("2.") and versions["mujoco"] and versions["gymnasium"] and versions["tether"]
    assert runs[0]["policies"]["candidate"]["sha256"] == __import__("hashlib").sha256(good.read_bytes()).hexdigest()
    assert "InvertedPendulum-v5" in runs[0]["envs"][0]["env"] and "PASS  InvertedPendulum-v5  min_return" in run.stdout


def test_a_sign_flipped_policy_fails_with_status_1_naming_env_and_check(tmp_path):
    flipped = linear_policy(tmp_path / "flipped.pt", "InvertedPendulum-v5", scale=-1.0, high=4.0)
    run = tether_eval(flipped, *PENDULUM, "--min-return", 90, "--max-bound-violations", 0,
                      "--junit", tmp_path / "eval.xml")
    assert run.returncode == 1, run.stdout + run.stderr
    failed = failures(tmp_path / "eval.xml")
    assert set(failed) == {"InvertedPendulum-v5.min_return", "InvertedPendulum-v5.bound_violations"}, failed
    message = failed["InvertedPendulum-v5.min_return"]
    assert message.startswith("InvertedPendulum-v5: check min_return failed: mean return"), message
    assert "< 90" in failed["InvertedPendulum-v5.min_return"]
    assert "actions outside the declared bounds > 0" in failed["InvertedPendulum-v5.bound_violations"]
    assert "FAIL  InvertedPendulum-v5  min_return" in run.stdout


def test_usage_errors_exit_2(tmp_path, capsys):
    from tether.evaluation.cli import main

    assert main([str(tmp_path / "missing.pt"), "--env", "PointMass"]) == 2
    assert "missing.pt" in capsys.readouterr().err
    good = linear_policy(tmp_path / "good.pt", "PointMass")
    assert main([str(good), "--max-regression", "10%"]) == 2
    assert "--max-regression needs --baseline" in capsys.readouterr().err
    assert main([str(good), "--baseline", str(good), "--max-regression", "ten"]) == 2
    assert "'ten'" in capsys.readouterr().err
    assert main(["pointmass:1"]) == 2 and "needs --model-repository" in capsys.readouterr().err
