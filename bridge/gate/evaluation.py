"""Evaluation in simulation: `tether sim` processes against the gateway, pinned to one version.

Usage (plain text: it needs a gateway that honours the pins):

    evaluator = SimEvaluator(address=gateway.address, env="InvertedPendulum-v5",
                             pin=rollout.pin_session, unpin=rollout.unpin_session, seed=0, max_steps=200)
    returns = await evaluator.returns("pendulum", 3, episodes=5)     # [float] * 5, same seeds every call

Each call starts one `python -m tether sim` process with `--session-id gate-<policy>-v<version>-<nonce>`
(session i is that prefix + "-i"), `--episodes K`, `--seed` and `--summary` (plus `sim_args`, e.g.
`["--tls-ca", "certs/ca.crt"]` for a gateway that serves TLS; `sim_env`, e.g. a robot token in
TETHER_TOKEN for a gateway that checks tokens); its sessions are pinned
to `version` before it starts and unpinned after it ends. The actions must all come from `version`
(the summary's policy_versions): a pin the gateway did not honour is an error, never a silent
evaluation of the wrong version.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path


class EvaluationError(RuntimeError):
    """The simulator runs did not produce the episodes asked for (the check fails, saying why)."""


class SimEvaluator:
    """Episode returns from real simulator processes (see the module docstring)."""

    def __init__(self, *, address: str, env: str | None, pin: Callable[[str, int], None | Awaitable[None]],
                 unpin: Callable[[str], None | Awaitable[None]], seed: int = 0, max_steps: int | None = None,
                 envs: int = 4, timeout_s: float = 600.0, python: str = sys.executable,
                 sim_args: Sequence[str] = (), policy_envs: Mapping[str, str] | None = None,
                 sim_env: Mapping[str, str] | None = None):
        if not address or ":" not in address:
            raise ValueError(f"address {address!r} must be HOST:PORT of the gateway")
        if not env and not policy_envs:
            raise ValueError("env must name the simulator environment, e.g. 'InvertedPendulum-v5'")
        if isinstance(envs, bool) or not isinstance(envs, int) or envs < 1:
            raise ValueError(f"envs must be an integer >= 1, got {envs!r}")
        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"max_steps must be None or an integer >= 1, got {max_steps!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.policy_envs = dict(policy_envs or {})
        self.address, self.env, self.seed, self.max_steps, self.envs = address, env, seed, max_steps, envs
        self.timeout_s, self.python, self.sim_args = timeout_s, python, tuple(sim_args)
        self._pin, self._unpin = pin, unpin
        self.sim_env = dict(sim_env or {})  # more environment for the sims (e.g. TETHER_TOKEN: a robot token)

    @classmethod
    def from_config(cls, config, *, address: str, pin: Callable[[str, int], None | Awaitable[None]],
                    unpin: Callable[[str], None | Awaitable[None]], **kw) -> SimEvaluator:
        """The evaluator a `GateConfig` describes (eval_env, eval_envs per policy, eval_max_steps)."""
        if config.eval_env is None and not config.eval_envs:
            raise ValueError("GateConfig.eval_env is None and eval_envs is empty: there is no env to evaluate in")
        return cls(address=address, env=config.eval_env, policy_envs=config.eval_envs, pin=pin, unpin=unpin,
                   max_steps=config.eval_max_steps, **kw)

    def command(self, policy: str, version: int, episodes: int, prefix: str, summary: Path) -> list[str]:
        """The `tether sim` command line of one evaluation run."""
        env = self.policy_envs.get(policy, self.env)
        if not env:
            raise EvaluationError(f"no env to evaluate policy {policy!r} in")
        cmd = [self.python, "-m", "tether", "sim", "--gateway", self.address, "--env", env,
               "--envs", str(min(self.envs, episodes)), "--episodes", str(episodes), "--seed", str(self.seed),
               "--policy", policy, "--session-id", prefix, "--summary", str(summary), "--status-every", "3600"]
        if self.max_steps is not None:
            cmd += ["--max-episode-steps", str(self.max_steps)]
        return cmd + list(self.sim_args)

    async def returns(self, policy: str, version: int, episodes: int) -> list[float]:
        if episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {episodes}")
        prefix = f"gate-{policy}-v{version}-{uuid.uuid4().hex[:6]}"
        sessions = [f"{prefix}-{i}" for i in range(min(self.envs, episodes))]
        with tempfile.TemporaryDirectory(prefix="tether-gate-") as tmp:
            summary_path = Path(tmp) / "summary.json"
            cmd = self.command(policy, version, episodes, prefix, summary_path)
            pinned: list[str] = []
            try:
                for session in sessions:
                    await _maybe_await(self._pin(session, version))
                    pinned.append(session)
                await self._run(cmd)
            finally:
                for session in pinned:
                    await _maybe_await(self._unpin(session))
            try:
                summary = json.loads(summary_path.read_text())
            except (OSError, ValueError) as exc:
                raise EvaluationError(f"tether sim wrote no readable summary: {exc}") from exc
        return _episode_returns(summary, version=version, episodes=episodes)

    async def _run(self, cmd: list[str]) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.sim_env)
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.PIPE, env=env)
        try:
            _, stderr = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            raise EvaluationError(f"tether sim did not finish within {self.timeout_s:g} s") from None
        finally:
            if proc.returncode is None:
                proc.kill()
                with contextlib.suppress(Exception):
                    await proc.wait()
        if proc.returncode != 0:
            tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
            raise EvaluationError(f"tether sim exited with {proc.returncode}: {' | '.join(tail)}")


async def _maybe_await(result) -> None:
    if inspect.isawaitable(result):
        await result


def _episode_returns(summary: dict, *, version: int, episodes: int) -> list[float]:
    returns = summary.get("returns")
    if not isinstance(returns, list) or not all(isinstance(r, int | float) for r in returns):
        raise EvaluationError(f"the summary's returns are not a list of numbers: {returns!r}")
    if summary.get("cut_episodes", 0):
        raise EvaluationError(f"{summary['cut_episodes']} episode(s) were cut short by the run's budget")
    if len(returns) != episodes:
        raise EvaluationError(f"{len(returns)} episodes completed, {episodes} asked for")
    versions = {int(v) for v, n in summary.get("policy_versions", {}).items() if n}
    if versions != {version}:
        raise EvaluationError(f"the evaluation sessions acted with versions {sorted(versions)}, not only v{version}: "
                              "the gateway did not honour the pin")
    errors = summary.get("errors") or {}
    if errors:
        raise EvaluationError(f"step errors during evaluation: {errors}")
    return [float(r) for r in returns]
