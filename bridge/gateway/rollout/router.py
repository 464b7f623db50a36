"""The rollout's hot path: which version each session acts with, and what the sessions' steps say
about each version (statistics, the regression monitor's samples, the shadow's divergence).

    router = RolloutRouter(catalog=catalog, batcher=batcher, thresholds=Thresholds())
    router.set(registry.rollout("hopper"))                 # after every change of the rollout
    policy = router.acting("hopper", "arm_2", {"robot": "arm_2"})     # a ServedPolicy (or None)
    router.stepped(policy, latency_s=0.0011, error=False, guard=0, inputs=obs, actions=act, deadline_s=0.1)
    router.episode_ended(policy, 431.0)
    router.monitor("hopper").verdict(candidate=4, incumbent=3)

Nothing here waits for the registry or Triton on a session's behalf: assignments are cached per
session until the rollout changes, and the shadow is inferred in a task the reply never waits for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np

from bridge.gateway.rollout.stats import VersionStats
from bridge.gateway.session.batcher import MicroBatcher
from bridge.gateway.versions.catalog import PolicyCatalog, ServedPolicy
from bridge.registry import RegressionMonitor, Rollout, Thresholds, assign, shadow_of

MAX_ASSIGNED = 65536  # cached session assignments per policy (cleared at every rollout change)
MAX_SHADOW_INFLIGHT = 64  # shadow inferences in flight at once; beyond it a step is not shadowed


class RolloutRouter:
    """The VersionRouter sessions use (bridge.gateway.session.session); see the module docstring."""

    def __init__(self, *, catalog: PolicyCatalog, batcher: MicroBatcher, thresholds: Thresholds):
        self._catalog, self._batcher, self._thresholds = catalog, batcher, thresholds
        self.rollouts_now: dict[str, Rollout] = {}
        self._assigned: dict[str, dict[str, tuple]] = {}  # policy -> session id -> (labels, version)
        self._monitors: dict[str, RegressionMonitor] = {}
        self.stats = VersionStats()
        self._shadow_tasks: set[asyncio.Task] = set()
        self.tap = None  # a shared registry: a SampleTap that ships what sessions show to the leader (rollout_follow)

    def set(self, rollout: Rollout) -> None:
        self.rollouts_now[rollout.policy] = rollout
        self._assigned[rollout.policy] = {}

    def monitor(self, policy: str) -> RegressionMonitor:
        monitor = self._monitors.get(policy)
        if monitor is None:
            monitor = self._monitors[policy] = RegressionMonitor(self._thresholds)
        return monitor

    async def stop(self) -> None:
        for task in list(self._shadow_tasks):
            task.cancel()
        await asyncio.gather(*self._shadow_tasks, return_exceptions=True)

    def acting(self, policy: str, session_id: str, labels: Mapping[str, str]) -> ServedPolicy | None:
        """The version `session_id` acts with now (pins, then canary, then live); None = no opinion."""
        assigned = self._assigned.get(policy)
        if assigned is None:
            return None
        cached = assigned.get(session_id)
        if cached is not None and cached[0] is labels:
            version = cached[1]
        else:  # once per session (and labels) and rollout change: assign() hashes the session id
            if len(assigned) >= MAX_ASSIGNED:
                assigned.clear()
            version = assign(self.rollouts_now[policy], session_id, labels)
            assigned[session_id] = (labels, version)
        return None if version is None else self._catalog.get(policy, version)

    def stepped(self, policy: ServedPolicy, *, latency_s: float, error: bool, guard: int,
                inputs: Mapping[str, np.ndarray] | None = None, actions: Mapping[str, np.ndarray] | None = None,
                deadline_s: float = 0.0, rows: bool = False, interventions: int = 0, env_steps: int = 1) -> None:
        """One step's outcome (a vectorised session's step counts once; `rows`: inputs/actions have a
        leading N; `interventions` of its `env_steps` env steps reported a person's command applied); with a
        shadow version, it is inferred on the same inputs in a task."""
        self.stats.step(policy.name, policy.version, latency_s=latency_s, error=error, guard=guard,
                        interventions=interventions, env_steps=env_steps)
        self.monitor(policy.name).observe_step(policy.version, latency_s, error, guard,
                                               interventions=interventions / env_steps if env_steps else 0.0)
        if self.tap is not None:
            self.tap.step(policy.name, policy.version, latency_s, error, guard, interventions=interventions,
                          env_steps=env_steps)
        if inputs is None or actions is None:
            return
        rollout = self.rollouts_now.get(policy.name)
        shadow = shadow_of(rollout) if rollout is not None else None
        if shadow is None or shadow == policy.version or len(self._shadow_tasks) >= MAX_SHADOW_INFLIGHT:
            return
        task = asyncio.get_running_loop().create_task(self._shadow(policy.name, shadow, inputs, actions, deadline_s,
                                                                   rows))
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    async def _shadow(self, name: str, version: int, inputs: Mapping[str, np.ndarray],
                      actions: Mapping[str, np.ndarray], deadline_s: float, rows: bool) -> None:
        """The shadow version on the same observation; only the divergence is kept, nothing is actuated."""
        try:
            async with asyncio.timeout(deadline_s or None):
                infer = self._batcher.infer_rows if rows else self._batcher.infer
                got = await infer(name, version, inputs, outputs=tuple(actions))
            divergence = float(np.mean([np.mean(np.abs(got[k].astype(np.float64) - a.astype(np.float64)))
                                        for k, a in actions.items()]))
        except asyncio.CancelledError:
            raise
        except Exception:
            divergence = None
        self.stats.shadow(name, version, divergence=divergence)
        if self.tap is not None:
            self.tap.shadow(name, version, divergence)

    def episode_ended(self, policy: ServedPolicy, episode_return: float) -> None:
        self.stats.episode(policy.name, policy.version, episode_return=episode_return)
        self.monitor(policy.name).observe_episode(policy.version, episode_return)
        if self.tap is not None:
            self.tap.episode(policy.name, policy.version, episode_return)
