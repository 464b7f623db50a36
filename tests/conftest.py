"""Shared fixtures: one real tritonserver per test session (`triton`: tests/support/triton.py), serving a tiny MLP
policy and, for a module at a time, the module's own models."""

from __future__ import annotations

import numpy as np
import pytest

from bridge.common.processes import free_port
from inference_server import ModelRepository, TritonServer
from protos.codec import Spec
from tests.support.triton import ServedTriton
from trainer.policy import MLPPolicy

OBS = (Spec("observation", np.float32, (11,)),)
ACT = (Spec("action", np.float32, (3,), low=(-1.0,), high=(1.0,)),)
_SERVED = pytest.StashKey[ServedTriton]()


@pytest.fixture(scope="session")
def triton(tmp_path_factory, pytestconfig) -> ServedTriton:
    repo = ModelRepository(tmp_path_factory.mktemp("models"))
    module = MLPPolicy(OBS[0], ACT[0], seed=0).eval()
    repo.write_version("tiny", 1, module, OBS, ACT)
    server = TritonServer(repo.root, models=["tiny"], log_path=repo.root.parent / "triton.log")
    server.start()
    pytestconfig.stash[_SERVED] = served = ServedTriton(server, repo, "tiny", module, OBS, ACT)
    yield served
    del pytestconfig.stash[_SERVED]
    server.stop()


@pytest.fixture(scope="module", autouse=True)
def _session_triton_reset(pytestconfig):
    """After each module the session's Triton serves `tiny` alone again (ServedTriton.reset); starts nothing."""
    yield
    served = pytestconfig.stash.get(_SERVED, None)
    if served is not None:
        served.reset()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A test that asks for the session's Triton gets it ready (ServedTriton.settle: unloads done)."""
    served = item.config.stash.get(_SERVED, None)
    if served is not None and "triton" in item.fixturenames:
        served.settle()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    """A test that leaves this worker real-time is an error: every process the worker starts later would inherit
    SCHED_FIFO (SVT-AV1 did this as root, bridge.experience.video); the worker is put back first."""
    import os

    if hasattr(os, "sched_getscheduler") and os.sched_getscheduler(0) in (os.SCHED_FIFO, os.SCHED_RR):
        policy = os.sched_getscheduler(0)
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        raise AssertionError(f"{item.nodeid} left the test process at real-time policy {policy} (put back)")


@pytest.fixture
def unused_port() -> int:
    return free_port()


# -- CI runs the fleet or fails (issue 23) ---------------------------------------------------------------
# Under CI=true a skipped test in these folders is a failure: `make setup` installs nats-server, PostgreSQL
# and iproute2 or stops, so a skip there means the fleet went untested, never that it passed.
FLEET_FOLDERS = ("tests/fleet/", "tests/registry/", "tests/hosts/")


def _in_ci() -> bool:
    import os

    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and _in_ci()) or hasattr(report, "wasxfail"):
        return
    path = str(item.path).replace("\\", "/")
    if any(folder in path for folder in FLEET_FOLDERS):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=true: a fleet test may not skip ({reason})"


# -- one suite in two runs (Makefile `test`, docs/testing.md) -------------------------------------------------
# `make test` runs the suite on 3 xdist workers, a file to a worker (--dist loadfile), then the `serial` tests
# alone: the hosts tests time partitions and resumes (a second's target), the ROS 2 tests hold a robot's control
# rate and command latency; the other workers' load on this 2-core machine would blur both.
SERIAL_FOLDERS = ("tests/hosts/", "tests/ros2/")
# The longest files start first, so that no worker is left running one of them alone at the end (figures: the
# slowest files of `pytest --durations=0` on 3 workers, each several minutes of a 2-core machine).
LONGEST_FIRST = ("tests/fleet/test_all_together.py", "tests/test_learning_sac.py", "tests/trainer/test_elastic.py",
                 "tests/test_behaviour_cloning.py", "tests/trainer/test_torchrun.py", "tests/sim/test_newton.py",
                 "tests/test_learning_vector.py", "tests/gateway/test_fuzz.py", "tests/test_lineage.py",
                 "tests/test_demo.py", "tests/trainer/test_sac_loop.py", "tests/gateway/test_rollout.py")


def pytest_collection_modifyitems(config, items):
    """Marks the serial folders' tests `serial`; orders the longest files first (a stable sort: within a file,
    and among the other files, the collection's order)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}

    def where(item) -> str:
        return item.nodeid.partition("::")[0]

    for item in items:
        if where(item).startswith(SERIAL_FOLDERS):
            item.add_marker(pytest.mark.serial)
    items.sort(key=lambda item: rank.get(where(item), len(rank)))
