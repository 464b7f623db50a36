"""K seeded episodes of one env through a gateway, in lockstep waves of one vectorised session each.

Plain text (it needs a gateway serving `policy`):

    run = asyncio.run(run_episodes("127.0.0.1:50051", "InvertedPendulum-v5", policy="pendulum",
                                   episodes=10, seed=0, envs=5))
    run.returns, run.lengths, run.seeds        # per episode, in seed order
    run.actions["action"].shape, run.pairs      # every action the policy gave, (previous, next) rows

Episode i runs on seed `seed + i`. Waves of `envs` episodes: wave w is one vector env of `envs` copies,
reset with seed `seed + w * envs` (copy j of a gymnasium or toy env is then reset with `seed + w * envs + j`;
a Newton env hashes (seed, j) into copy j's start), driven through ONE vectorised session: each step is
one Observation of `envs` rows, one Triton request of exactly those rows. So the batch a policy sees is
the same run after run (no micro-batching with other sessions changes a float sum), and a wave ends when
each copy's first episode has ended (copies that ended early keep stepping their next episode; it is not
counted). Envs that exist only one at a time (`Hopper-v5`, `PointMass`) are stacked as `serial:<id>`.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

import sim
from bridge.client import Credentials, Session, SessionError
from protos.codec import Spec, TensorError, decode_all
from protos.tether.v1 import bridge_pb2
from sim.client import vector_observation
from sim.vector import safe_action

__all__ = ["EnvRun", "run_episodes", "vector_id"]


def vector_id(env_id: str) -> str:
    """The vector env an eval of `env_id` steps: vector ids as they are, single envs as `serial:<id>`.

    >>> vector_id("newton:cartpole"), vector_id("Hopper-v5")
    ('newton:cartpole', 'serial:Hopper-v5')
    """
    return env_id if sim.is_vector(env_id) else f"serial:{env_id}"


@dataclass
class EnvRun:
    """What K episodes of one env and one policy gave (episode i ran on `seeds[i]`)."""

    env: str
    policy: str
    action_spec: tuple[Spec, ...] = ()
    seeds: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    actions: dict[str, np.ndarray] = field(default_factory=dict)   # rows: every counted step's raw action
    pairs: list[tuple[int, int]] = field(default_factory=list)      # (previous, next) rows within an episode
    rtt_ns: list[int] = field(default_factory=list)                 # one per exchange (a whole wave's step)
    errors: Counter = field(default_factory=Counter)                # StepError code -> count
    versions: Counter = field(default_factory=Counter)              # policy version -> counted steps
    elapsed_s: float = 0.0

    @property
    def steps(self) -> int:
        return int(sum(self.lengths))


async def run_episodes(address: str | list[str], env_id: str, *, policy: str, episodes: int, seed: int = 0,
                       envs: int = 8, max_episode_steps: int | None = None, credentials: Credentials | None = None,
                       connect_timeout: float = 30.0, reply_timeout: float = 30.0,
                       session_prefix: str | None = None, labels: dict[str, str] | None = None) -> EnvRun:
    """`episodes` episodes of `env_id` acted by `policy` (see the module docstring). Raises ValueError for a
    bad count or env, ConnectionError when no gateway answers, SessionError when it refuses the session."""
    for name, value in (("episodes", episodes), ("envs", envs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    width = min(envs, episodes)
    kw = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    env = sim.make(vector_id(env_id), num_envs=width, seed=seed, **kw)
    run = EnvRun(env=env_id, policy=policy, action_spec=tuple(env.action_spec()))
    rows: dict[str, list[np.ndarray]] = {s.name: [] for s in run.action_spec}
    prefix = session_prefix or f"eval-{uuid.uuid4().hex[:6]}"
    start = time.monotonic()
    try:
        for wave, first in enumerate(range(0, episodes, width)):
            count = min(width, episodes - first)
            hello = bridge_pb2.Hello(
                session_id=f"{prefix}-{wave}", policy=policy, source=getattr(env, "source", "sim:eval"),
                observation_spec=[s.to_proto() for s in env.observation_spec()],
                action_spec=[s.to_proto() for s in run.action_spec],
                labels={"env": env_id, "eval_wave": str(wave), **(labels or {})}, num_envs=width, batched=True)
            session = Session(address, hello, credentials=credentials, connect_timeout_s=connect_timeout,
                              reply_timeout_s=reply_timeout)
            async with session:
                await _wave(session, env, run, rows, wave_seed=seed + first, count=count)
    finally:
        env.close()
    run.actions = {name: np.stack(r) if r else np.zeros((0, *s.shape), s.dtype)
                   for (name, r), s in zip(rows.items(), run.action_spec, strict=True)}
    run.elapsed_s = time.monotonic() - start
    return run


async def _wave(session: Session, env, run: EnvRun, rows: dict[str, list[np.ndarray]], *, wave_seed: int,
                count: int) -> None:
    """One vectorised session until copies 0..count-1 have each ended their first episode."""
    n = env.num_envs
    ts = env.reset(seed=wave_seed)
    done = np.arange(n) >= count                  # copies beyond `count` only fill the batch
    totals, lengths = np.zeros(n), np.zeros(n, np.int64)
    last_row = np.full(n, -1, np.int64)
    fallback = safe_action(run.action_spec, n)
    base = len(run.returns)
    run.seeds.extend(wave_seed + j for j in range(count))
    run.returns.extend([0.0] * count)
    run.lengths.extend([0] * count)
    step = 0
    while not done.all():
        t0 = time.perf_counter_ns()
        msg = await session.step(vector_observation(step, ts))
        kind = msg.WhichOneof("kind")
        reply = getattr(msg, kind) if kind else None
        if reply is None or kind == "welcome" or reply.step != step:
            raise SessionError(f"session {session.id}: step {step} got {kind} for step {getattr(reply, 'step', '?')}")
        counted = ~done
        action = fallback
        if kind == "action":
            run.rtt_ns.append(time.perf_counter_ns() - t0)
            for error in reply.env_errors:
                run.errors[bridge_pb2.StepError.Code.Name(error.code)] += 1
            try:
                action = decode_all(reply.tensors)
            except TensorError:
                run.errors["INVALID_ACTION"] += int(counted.sum())
            else:
                if not reply.estop:
                    run.versions[int(reply.policy_version)] += int(counted.sum())
                for j in np.flatnonzero(counted):
                    index = len(rows[run.action_spec[0].name])
                    for name in rows:
                        rows[name].append(np.asarray(action[name][j]))
                    if last_row[j] >= 0:
                        run.pairs.append((int(last_row[j]), index))
                    last_row[j] = index
        else:  # a StepError for the whole exchange: every copy steps its safe action
            run.errors[bridge_pb2.StepError.Code.Name(reply.code)] += int(counted.sum())
        try:
            ts = env.step(action)
        except TensorError:
            run.errors["INVALID_ACTION"] += int(counted.sum())
            ts = env.step(fallback)
        step += 1
        totals += np.where(counted, ts.reward, 0.0)
        lengths += counted
        for j in np.flatnonzero(counted & ts.last()):
            run.returns[base + j], run.lengths[base + j] = float(totals[j]), int(lengths[j])
            done[j] = True
