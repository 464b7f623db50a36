"""`tether eval --gateway` against an existing secured gateway (TLS + tokens, `tether.stack.Stack(secure=True)`):
a policy the gateway serves is evaluated with a robot token; a file is imported with an operator token as a
policy of its own (`eval_<sha256[:12]>`, so no robot acts with it) and compared with the served one on the
same seeds; without a token the gateway refuses and the eval exits 2 saying why."""

from __future__ import annotations

import json

import pytest

from tests.evaluation.policies import linear_policy
from tests.evaluation.test_eval import failures, tether_eval
from tether.policy_cli import read_policy_file
from tether.stack import Stack

# real processes: a loaded 2-core machine stretches them
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow,
              pytest.mark.requires_triton, pytest.mark.timeout(900)]

EPISODES = ["--env", "PointMass", "--episodes", "6", "--envs", "3"]


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("secured")
    good = read_policy_file(linear_policy(folder / "good.pt", "PointMass"))
    stack = Stack(folder / "stack", models=["pointmass"], secure=True, gateway_args=["--deadline-ms", "10000"])
    stack.repository.write_artifact("pointmass", 1, good.format, good.data, good.inputs, good.outputs)
    with stack:
        yield stack, folder


def test_a_served_policy_is_evaluated_over_tls_with_a_robot_token(secured):
    stack, folder = secured
    run = tether_eval("pointmass:1", *EPISODES, "--gateway", stack.gateway, "--tls-ca", stack.ca,
                      "--token", stack.robot_token, "--min-return", -20, "--summary", folder / "served.json")
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads((folder / "served.json").read_text())
    candidate = result["envs"][0]["candidate"]
    assert candidate["policy"] == "pointmass:v1" and candidate["policy_versions"] == {"1": 1200}
    assert result["config"]["gateway"] == stack.gateway and result["versions"]["triton"].startswith("external")


def test_a_file_is_imported_with_an_operator_token_and_compared_on_the_same_seeds(secured):
    stack, folder = secured
    worse = linear_policy(folder / "worse.pt", "PointMass", scale=0.86)
    run = tether_eval(worse, "--baseline", "pointmass:1", *EPISODES, "--max-regression", "5%",
                      "--gateway", stack.gateway, "--tls-ca", stack.ca, "--token", stack.token,
                      "--summary", folder / "imported.json", "--junit", folder / "imported.xml")
    assert run.returncode == 1, run.stdout + run.stderr
    result = json.loads((folder / "imported.json").read_text())
    assert result["envs"][0]["candidate"]["policy"].startswith("eval_")
    assert all(d < 0 for d in result["envs"][0]["paired"]["differences"])
    assert list(failures(folder / "imported.xml")) == ["PointMass.regression"]


def test_without_a_token_the_gateway_refuses_and_the_eval_exits_2(secured):
    stack, _ = secured
    run = tether_eval("pointmass", *EPISODES, "--gateway", stack.gateway, "--tls-ca", stack.ca, "--token", "",
                      timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "UNAUTHENTICATED" in run.stderr and "Traceback" not in run.stderr


def test_the_same_version_from_the_model_repository_in_an_embedded_stack_gives_bitwise_the_same_returns(secured):
    stack, folder = secured
    served = folder / "served.json"
    if not served.exists():  # when run alone
        test_a_served_policy_is_evaluated_over_tls_with_a_robot_token(secured)
    run = tether_eval("pointmass:1", *EPISODES, "--model-repository", stack.repository.root,
                      "--summary", folder / "embedded.json")
    assert run.returncode == 0, run.stdout + run.stderr
    embedded = json.loads((folder / "embedded.json").read_text())
    over_tls = json.loads(served.read_text())
    keys = ("seeds", "returns", "lengths", "jerk", "bound_violations")
    assert {k: embedded["envs"][0]["candidate"][k] for k in keys} == {k: over_tls["envs"][0]["candidate"][k]
                                                                       for k in keys}
    sha = embedded["policies"]["candidate"]["sha256"]
    assert sha == __import__("hashlib").sha256(read_policy_file(folder / "good.pt").data).hexdigest()
