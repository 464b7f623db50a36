"""The session's Triton (tests/conftest.py's `triton` fixture): one tritonserver for the whole run, serving `tiny`
(an MLP, OBS -> ACT), with room for each module's own models. Starting a Triton costs seconds; a test starts one of
its own only where that is the point (restarts, kills, flags, repositories, replicas, restricted protocols).

    def test_rollout(triton, tmp_path):
        v1 = triton.add_policy("staged")       # v1 of a fresh MLP, loaded; a name no other model in the session has
        async with running_gateway(triton.url, policy="staged", **triton.publishing(tmp_path)) as gw:
            ...                                # publishes versions of `staged` into the session's repository

A module's models are its own until its end: then `reset()` (conftest, after each module that used the session's
Triton) unloads them and removes their files, so the repository holds `tiny` alone again and the session's memory
(a python-backend stub per loaded version) stays flat. Triton unloads in the background and says it is not ready
meanwhile (strict readiness): `settle()` (conftest, before each test that asks for `triton`) waits for that.

Triton 2.51's python backend has crashed the whole server (SIGSEGV in TRITONBACKEND_ModelInstanceExecute, then
boost's lock_exception) a few times in full runs, minutes after a module's models were unloaded. A dead session Triton
would fail every later test of the worker, so `settle()` starts a fresh one on the same ports serving what the
repository holds, and says so as a warning with the tail of the log (which it keeps: the new server appends to it).
"""

from __future__ import annotations

import contextlib
import shutil
import urllib.request
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from inference_server import ModelControlError, ModelRepository, TritonServer
from protos.codec import Spec
from tests.support.waiting import wait_until
from trainer.policy import MLPPolicy

__all__ = ["ServedTriton"]

LOAD_TIMEOUT_S = 180.0  # a python-backend stub starts at niceness 19: on a loaded machine it waits its turn


@dataclass
class ServedTriton:
    server: TritonServer
    repo: ModelRepository
    policy: str               # the session's own model, never reset
    module: torch.nn.Module   # what it serves
    obs: tuple[Spec, ...]
    act: tuple[Spec, ...]
    unloading: bool = field(default=False, init=False)

    @property
    def url(self) -> str:
        return self.server.grpc_url

    def expected_action(self, observation: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.module(torch.from_numpy(observation[None])).numpy()[0]

    def add_policy(self, name: str, *, versions: int = 1, seed: int = 0, serve: str = "torchscript",
                   load: bool = True) -> MLPPolicy:
        """Versions 1..`versions` of a fresh MLP (OBS -> ACT, version v seeded `seed + v - 1`) as `name`, loaded
        unless `load` is false; returns version 1's module. AssertionError when `name` is in the repository."""
        self.claim(name)
        modules = [MLPPolicy(self.obs[0], self.act[0], seed=seed + v).eval() for v in range(versions)]
        for version, module in enumerate(modules, start=1):
            self.repo.write_version(name, version, module, self.obs, self.act, serve=serve)
        if load:
            self.server.load_model(name, timeout=LOAD_TIMEOUT_S)
        return modules[0]

    def add_initial_policy(self, env: str, *, stochastic: bool = True, load: bool = True) -> str:
        """`tether.initial_policy.write_initial_policy` for `env` (by default the learning loop's Gaussian policy,
        served by onnxruntime), loaded unless `load` is false; returns its name (the env's policy name)."""
        from tether.initial_policy import policy_name, write_initial_policy

        self.claim(policy_name(env))
        name = write_initial_policy(self.repo, env, stochastic=stochastic)
        if load:
            self.server.load_model(name, timeout=LOAD_TIMEOUT_S)
        return name

    def claim(self, name: str) -> str:
        """`name`, asserted free in the session's repository (another model of that name would be shared)."""
        assert not (self.repo.root / name).exists(), f"model {name!r} is already in the session's repository"
        return name

    def publishing(self, folder: Path) -> dict:
        """A gateway's config for publishing into the session's repository (`model_repository`) with a registry
        of its own in `folder` (its versions, rollouts and e-stops apart from other tests')."""
        return {"model_repository": self.repo.root, "registry": Path(folder) / "registry.sqlite"}

    def publishing_args(self, folder: Path) -> list[str]:
        """`publishing` as `tether gateway` flags."""
        return [f"--{key.replace('_', '-')}={value}" for key, value in self.publishing(folder).items()]

    def reset(self) -> None:
        """Every model but `policy` unloaded and its files (retired versions too) removed."""
        for folder in sorted(self.repo.root.iterdir()):
            if folder.is_dir() and not folder.name.startswith(".") and folder.name != self.policy:
                with contextlib.suppress(ModelControlError):  # never loaded, or its load failed
                    self.server.unload_model(folder.name)
                shutil.rmtree(folder)
                self.unloading = True
        for folder in (self.repo.root / ".retired").glob("*"):
            if folder.name != self.policy:
                shutil.rmtree(folder)

    def settle(self) -> None:
        """Once the models `reset` unloaded are gone: Triton ready again (at once when nothing was unloaded); a
        fresh Triton if this one died."""
        if self.server.exited():
            self.revive()
        if self.unloading:
            wait_until(self._ready, "the session's Triton ready again after a module's models were unloaded",
                       timeout=120, period=0.05)
            self.unloading = False

    def revive(self) -> None:
        """A fresh Triton on the same ports, serving every model in the repository (a module's own too), after
        this one died; a warning names how it ended."""
        code, tail = self.server.exited(), self.server.log_summary(lines=4)
        self.server.stop()
        self.server.models = tuple(sorted(folder.name for folder in self.repo.root.iterdir()
                                          if folder.is_dir() and not folder.name.startswith(".")))
        self.server.start(timeout=LOAD_TIMEOUT_S)
        self.unloading = False
        warnings.warn(f"the session's Triton exited with {code} and was restarted on the same ports serving "
                      f"{list(self.server.models)}; its log ({self.server.log_path}) ended:\n{tail}", stacklevel=1)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.server.http_url}/v2/health/ready", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False
