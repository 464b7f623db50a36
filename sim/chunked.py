"""`tether sim --chunk H`: one env executing a chunked policy's chunks, tick by tick, through `ChunkExecutor`.

The edge node and this loop share `bridge.client.chunks.ChunkExecutor`, so a chunk is aligned, prefixed
and blended the same in both (see its module doc). Here a control tick is one env step. The observation
before tick t asks for a chunk once no more than the threshold's actions are left; the reply is applied
before tick t + d, where d is

- `delay_ticks` when given: the sim's own inference latency, in ticks (time stops while the policy is
  late, so a run is reproducible; d = 0 is lockstep); the default without a control rate is 0;
- with a control rate (`rate_hz`) and no `delay_ticks`: measured, as on a robot: the reply lands in the first tick after
  it arrived.

A tick with nothing queued (the chunk came too late) steps the last action again and counts as idle
(`stats.idle_ticks`). An episode waits for its first chunk (no tick before it). Each observation carries
the reward summed over the ticks since the previous one; `stats.steps` counts env steps (ticks).

    stats = asyncio.run(run_sessions("127.0.0.1:50051", make, envs=1, steps=1000,
                                     chunks=ChunkConfig(horizon=16, prefix=True), delay_ticks=4))
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

import numpy as np

from bridge.client import ClientStats, Session, SessionError
from bridge.client.chunks import ChunkConfig, ChunkExecutor, ChunkRequest, prefix_specs
from protos.codec import Spec, TensorError, decode_all
from protos.tether.v1 import bridge_pb2
from sim.env import Environment, StepType, TimeStep, observation_encoder, zeros

__all__ = ["ChunkLayout", "chunk_hello_specs", "drive_chunks"]

Code = bridge_pb2.StepError.Code


class ChunkLayout:
    """An env's action tensors side by side in one row of `size` values, and a chunk of H such rows.

    >>> layout = ChunkLayout((Spec("arm", np.float32, (2,)), Spec("grip", np.float32, ())), horizon=3)
    >>> layout.size, [(s.name, s.shape) for s in layout.chunk_specs]
    (3, [('arm', (3, 2)), ('grip', (3,))])
    >>> chunk = layout.chunk({"arm": np.zeros((3, 2), np.float32), "grip": np.arange(3, dtype=np.float32)})
    >>> chunk[:, 2].tolist(), layout.action(chunk[1])["grip"]
    ([0.0, 1.0, 2.0], array(1., dtype=float32))
    """

    def __init__(self, specs: Sequence[Spec], *, horizon: int):
        self.specs, self.horizon = tuple(specs), horizon
        self.sizes = [math.prod(s.shape) for s in self.specs]
        self.size = sum(self.sizes)

        def rows(bounds: tuple[float, ...]) -> tuple[float, ...]:   # one bound for all, or per element per row
            return bounds if len(bounds) <= 1 else bounds * horizon
        self.chunk_specs = tuple(Spec(s.name, s.dtype, (horizon, *s.shape), rows(s.low), rows(s.high))
                                 for s in self.specs)

    def chunk(self, tensors: dict[str, np.ndarray]) -> np.ndarray:
        """A reply's action tensors as one (H, size) array; TensorError naming a missing or misshapen one."""
        parts = []
        for spec in self.chunk_specs:
            value = tensors.get(spec.name)
            if value is None or value.shape != spec.shape:
                raise TensorError(spec.name, f"expected shape {list(spec.shape)}, got "
                                             f"{None if value is None else list(value.shape)}")
            parts.append(np.asarray(value, np.float64).reshape(self.horizon, -1))
        return np.concatenate(parts, axis=1)

    def action(self, row: np.ndarray) -> dict[str, np.ndarray]:
        """One row back into the env's action tensors."""
        out, offset = {}, 0
        for spec, n in zip(self.specs, self.sizes, strict=True):
            out[spec.name] = np.asarray(row[offset:offset + n], spec.dtype).reshape(spec.shape)
            offset += n
        return out


def chunk_hello_specs(env: Environment, config: ChunkConfig) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
    """The Hello's observation and action specs for `env` under `config`: actions (H, ...), and the prefix
    inputs (`prefix_specs`) with `config.prefix`."""
    layout = ChunkLayout(env.action_spec(), horizon=config.horizon)
    extra = prefix_specs(config.horizon, layout.size) if config.prefix else ()
    return tuple(env.observation_spec()) + extra, layout.chunk_specs


async def drive_chunks(session: Session, env: Environment, *, config: ChunkConfig, stats: ClientStats, budget,
                       pacer, episodes: int | None = None, delay_ticks: int | None = None,
                       executors: list[ChunkExecutor] | None = None) -> None:
    """One env through `session` until `budget` (or its `episodes`) runs out (see the module doc); `pacer`
    (sim.client.Pacer) paces the ticks. `executors`: receives this env's `ChunkExecutor` (its trace and
    arrivals kept, for reports and tests)."""
    if delay_ticks is None and pacer.period is None:
        delay_ticks = 0
    layout = ChunkLayout(env.action_spec(), horizon=config.horizon)
    encode_observation = observation_encoder(env.observation_spec())  # camera images: JPEG where declared
    ex = ChunkExecutor(config, size=layout.size, delay=delay_ticks or 0, keep=100_000 if executors is not None else 0)
    if executors is not None:
        executors.append(ex)
    period_ns = round(pacer.period * 1e9) if pacer.period else 0
    blank = ChunkRequest(0, 0, 0, np.zeros((config.horizon, layout.size), np.float32)).tensors() if config.prefix \
        else {}                          # a LAST observation's prefix: nothing committed
    ts, tick, step, episode = env.reset(), 0, 0, 0
    held, reward, episode_return, first, ended = zeros(env.action_spec()), 0.0, 0.0, True, False
    pending: asyncio.Task | None = None
    sent_ns = 0

    async def reply(task: asyncio.Task) -> tuple[str, object]:
        msg = await task
        kind = msg.WhichOneof("kind")
        body = getattr(msg, kind) if kind else None
        if body is None or kind == "welcome" or body.step != ex.pending.step:
            raise SessionError(f"session {session.id}: step {ex.pending.step} got {kind} for step "
                               f"{getattr(body, 'step', '?')}")
        return kind, body

    def take(kind: str, body, *, waited: bool = False) -> bool:
        """Apply a reply to a chunk request; True if it ended the episode (a reward term's condition).
        `waited`: time stopped for it (lockstep, or an episode's first chunk)."""
        if kind == "action":
            stats.rtt_ns.append(time.monotonic_ns() - sent_ns)
            stats.policy_versions[body.policy_version] += 1
            try:
                chunk = layout.chunk(decode_all(body.tensors))
            except TensorError:
                stats.errors["INVALID_ACTION"] += 1
                ex.lost()
                return False
            d = ex.arrive(chunk, now=tick, policy_version=body.policy_version, at_ns=session.received_ns or None,
                          measured=not waited or delay_ticks == 0)
            stats.chunk_delays[d] += 1
            return False
        ex.lost()
        if kind == "error":
            stats.errors[Code.Name(body.code)] += 1
            return False
        if kind == "episode_end":
            return True
        raise SessionError(f"session {session.id}: a {kind} answered a non-LAST observation")

    while True:
        await pacer.wait()
        stop = budget.exhausted()
        if first and (stop or episodes == 0):
            return                       # nothing of this episode was sent
        if pending is not None and (pending.done() if delay_ticks is None else tick >= ex.pending.tick + delay_ticks):
            ended = take(*await reply(pending)) or ended
            pending = None
        if stop or ts.last() or ended:
            if pending is not None:      # the episode is over: its chunk is not executed
                ended = take(*await reply(pending)) or ended
                pending = None
            if not ended:
                await _last(session, step, episode, encode_observation({**ts.observation, **blank}), ts, reward,
                            stats=stats, cut=stop and not ts.last())
                step += 1
            stats.episodes += 1
            stats.returns.append(episode_return)
            if stop:
                return
            ts, reward, episode_return, first, episode, ended = env.reset(), 0.0, 0.0, True, episode + 1, False
            ex.clear()
            held = zeros(env.action_spec())
            continue
        if ex.due(tick):
            if first and episodes is not None:
                episodes -= 1
            request = ex.request(tick, step=step)
            obs = bridge_pb2.Observation(step=step, step_type=int(StepType.FIRST if first else StepType.MID),
                                         episode=episode, tensors=encode_observation(ts.observation), reward=reward)
            deadline = ex.deadline_ns(tick, now_ns=session.clock(), period_ns=period_ns) if period_ns else 0
            ex.fill(obs, request, deadline_ns=deadline)
            sent_ns = time.monotonic_ns()
            pending = asyncio.ensure_future(session.step(obs))
            step, reward, first = step + 1, 0.0, False
            if delay_ticks == 0 or not ex.remaining(tick):   # lockstep, or nothing queued yet: wait for it
                ended = take(*await reply(pending), waited=True)
                pending = None
                if ended:
                    continue
        item = ex.act(tick, at_ns=session.clock())
        if item is None:
            stats.idle_ticks += 1
            action = held
        else:
            action = layout.action(item[0])
        ts = env.step(action)
        held = ts.applied_action if ts.applied_action is not None else action
        budget.claim()
        stats.steps += 1
        tick += 1
        reward += ts.reward
        episode_return += ts.reward


async def _last(session: Session, step: int, episode: int, tensors: list, ts: TimeStep,
                reward: float, *, stats: ClientStats, cut: bool) -> None:
    """The episode's LAST observation (truncated when `cut`: the budget ran out); EpisodeEnd expected."""
    msg = await session.step(bridge_pb2.Observation(
        step=step, step_type=int(StepType.LAST), episode=episode, tensors=tensors,
        reward=reward, terminated=ts.terminated and not cut))
    kind = msg.WhichOneof("kind")
    if kind == "error":
        stats.errors[Code.Name(msg.error.code)] += 1
    elif kind != "episode_end":
        raise SessionError(f"session {session.id}: LAST step {step} got {kind}, not EpisodeEnd")
    stats.cut_episodes += cut
