"""`tether eval --baseline`: the paired comparison on the same seeds catches a controller ~11% worse on every
seed and passes an identical one (bitwise equal returns). This is `make test`'s smoke test of `tether eval`
of a small policy against its baseline, run as CI runs it: a subprocess with its embedded Triton + gateway."""

from __future__ import annotations

import json

import pytest

from tests.evaluation.policies import linear_policy
from tests.evaluation.test_eval import failures, tether_eval

# real processes: a loaded 2-core machine stretches them
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow,
              pytest.mark.requires_triton, pytest.mark.timeout(900)]


def test_the_paired_comparison_catches_a_10_percent_regression_and_not_an_identical_policy(tmp_path):
    good = linear_policy(tmp_path / "good.pt", "PointMass")
    worse = linear_policy(tmp_path / "worse.pt", "PointMass", scale=0.86)
    same = linear_policy(tmp_path / "same.pt", "PointMass")
    common = ["--baseline", good, "--env", "PointMass", "--episodes", 10, "--envs", 5, "--max-regression", "5%"]
    run = tether_eval(worse, *common, "--summary", tmp_path / "worse.json", "--junit", tmp_path / "worse.xml")
    assert run.returncode == 1, run.stdout + run.stderr
    paired = json.loads((tmp_path / "worse.json").read_text())["envs"][0]["paired"]
    assert -0.14 < paired["relative"] < -0.08, paired                  # ~11% lower ...
    assert all(d < 0 for d in paired["differences"]) and paired["ci95"][1] < 0  # ... on every seed
    assert list(failures(tmp_path / "worse.xml")) == ["PointMass.regression"]

    run = tether_eval(same, *common, "--summary", tmp_path / "same.json", "--junit", tmp_path / "same.xml")
    assert run.returncode == 0, run.stdout + run.stderr
    paired = json.loads((tmp_path / "same.json").read_text())["envs"][0]["paired"]
    assert paired["differences"] == [0.0] * 10 and failures(tmp_path / "same.xml") == {}
