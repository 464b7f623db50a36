"""The sim runner: N environments, each driven through a `bridge.client.Session`, in one asyncio loop.

From the command line: `tether sim` (`sim.cli`). From Python (plain text, it needs a gateway):

    stats = asyncio.run(run_sessions("127.0.0.1:50051", lambda i: make_env("Hopper-v5", seed=i),
                                     envs=8, seconds=10))
    stats.summary()  # {"steps": ..., "steps_per_s": ..., "rtt_ms": {"p50": ..., "p99": ...}, ...}

The protocol (Hello, durability, Replay, failover across a list of gateways) is `bridge.client`'s;
this module only drives environments. Each observation gets one reply. An Action is stepped inline
(MuJoCo steps take microseconds); a StepError is counted and the last applied action (zeros after a
reset) is stepped instead; a LAST observation is answered by EpisodeEnd and the env is reset (so is
a MID one the gateway ends, when a reward term's condition fired). When the budget (`seconds` or
`steps`) runs out, a session in mid-episode sends its last observation as a truncated LAST, so the
gateway sees every reward, then closes its stream. With a `controller`, the env steps the
controller's action instead of the policy's, and reports it as the applied action (scripted
demonstrations for behaviour cloning).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

from bridge.client import ClientStats, Credentials, Session, SessionError
from bridge.client.channel import aio_channel
from bridge.client.chunks import ChunkConfig, ChunkExecutor
from bridge.client.session import CHANNEL_OPTIONS
from protos.codec import TensorError, decode_all, encode_all
from protos.tether.v1 import bridge_pb2
from sim.chunked import chunk_hello_specs, drive_chunks
from sim.env import Environment, StepType, TimeStep, observation_encoder, zeros
from sim.vector import VectorEnvironment, VectorTimeStep, safe_action

__all__ = ["ClientTls", "Pacer", "SessionError", "SimStats", "check_rate", "run_sessions",
           "run_vector_sessions", "vector_observation"]


SimStats = ClientStats  # the counters of one run (`bridge.client.stats`)

Controller = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


@dataclass(frozen=True, kw_only=True)
class ClientTls:
    """TLS to the gateway: the CA that signed its certificate; `cert` + `key` for mTLS (the client's identity,
    e.g. from `tether certs init DIR --client sim_1:robot`)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    def credentials(self, token: str | None = None) -> Credentials:
        return Credentials(ca=self.ca, cert=self.cert, key=self.key, token=token)


class _Budget:
    """Shared stop condition; claims happen between awaits, so they are atomic in one loop."""

    def __init__(self, *, steps: int | None, seconds: float | None):
        self.left = steps
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def exhausted(self) -> bool:
        return (self.left is not None and self.left <= 0) or (
            self.deadline is not None and time.monotonic() >= self.deadline)

    def claim(self, n: int = 1) -> None:
        if self.left is not None:
            self.left -= n


class Pacer:
    """A fixed control rate: `await pacer.wait()` before each step returns at most `hz` times a second.

    Deadline-based, so sleeping does not drift: step k is due at start + k / hz. A step that comes late
    goes at once, but the schedule then restarts from it, so a slow stretch is never made up in a burst
    (at most 1 + hz * t steps in the first t seconds). `hz=None`: no pacing.

        pacer = Pacer(50.0)
        while ...:
            await pacer.wait()  # then step the env
    """

    def __init__(self, hz: float | None):
        self.period = None if hz is None else 1.0 / check_rate(hz)
        self.due: float | None = None

    async def wait(self) -> None:
        if self.period is None:
            return
        now = time.monotonic()
        if self.due is None or now - self.due > self.period:
            self.due = now  # the first step, or late by more than a period: restart the schedule here
        elif now < self.due:
            await asyncio.sleep(self.due - now)
        self.due += self.period


def check_rate(hz: float | None, *, flag: str = "--rate") -> float | None:
    """A control rate in Hz: None (as fast as possible) or a positive finite number; ValueError naming `flag`."""
    if hz is None:
        return None
    if isinstance(hz, bool) or not isinstance(hz, int | float) or not math.isfinite(hz) or hz <= 0:
        raise ValueError(f"{flag} must be a positive, finite number of steps per second (Hz), got {hz!r}")
    return float(hz)


async def _drive(session: Session, env: Environment, *, stats: SimStats, budget: _Budget,
                 controller: Controller | None, episodes: int | None, rate_hz: float | None = None) -> None:
    """One env through `session` until the budget (or its `episodes`) runs out; at most `rate_hz` steps a second."""
    ts, step, episode, episode_return = env.reset(), 0, 0, 0.0
    fallback = zeros(env.action_spec())
    pacer = Pacer(rate_hz)
    encode_observation = observation_encoder(env.observation_spec())  # camera images: JPEG where declared
    while True:
        await pacer.wait()
        stop = budget.exhausted()
        if ts.step_type is StepType.FIRST and (stop or episodes == 0):
            return  # nothing of this episode was sent
        if ts.step_type is StepType.FIRST and episodes is not None:
            episodes -= 1
        step_type = StepType.LAST if stop else ts.step_type
        cut = stop and ts.step_type is not StepType.LAST
        if step_type is not StepType.LAST:
            budget.claim()
        t0 = time.perf_counter_ns()
        msg = await session.step(bridge_pb2.Observation(
            step=step, t_sent_ns=time.time_ns(), step_type=int(step_type), episode=episode,
            tensors=encode_observation(ts.observation), reward=ts.reward, terminated=ts.terminated,
            applied_action=encode_all(ts.applied_action or {})))
        kind = msg.WhichOneof("kind")
        reply = getattr(msg, kind) if kind else None
        if reply is None or kind == "welcome" or reply.step != step:
            raise SessionError(f"session {session.id}: step {step} ({step_type.name}) got "
                               f"{kind} for step {getattr(reply, 'step', '?')}")
        step += 1
        if step_type is StepType.LAST or kind == "episode_end":
            if kind == "error":
                stats.errors[bridge_pb2.StepError.Code.Name(reply.code)] += 1
            elif kind != "episode_end":
                raise SessionError(f"session {session.id}: LAST step {step - 1} got {kind}, not EpisodeEnd")
            stats.episodes += 1
            stats.returns.append(episode_return)
            if stop:
                stats.cut_episodes += cut
                return
            ts, episode_return, episode = env.reset(), 0.0, episode + 1
            fallback = zeros(env.action_spec())
            continue
        ts = _act(session, env, kind, reply, time.perf_counter_ns() - t0, ts, fallback, stats, controller)
        fallback = ts.applied_action
        stats.steps += 1
        episode_return += ts.reward


def _act(session: Session, env: Environment, kind: str, reply, rtt_ns: int, current: TimeStep, fallback,
         stats: SimStats, controller: Controller | None) -> TimeStep:
    if kind == "action":
        stats.rtt_ns.append(rtt_ns)
        if reply.estop:  # an operator's e-stop: the safe action (held), no policy acted
            stats.held += 1
        else:
            stats.policy_versions[reply.policy_version] += 1
        try:
            action = decode_all(reply.tensors)
            return env.step(action if controller is None else controller(current.observation))
        except TensorError:
            stats.errors["INVALID_ACTION"] += 1
    elif kind == "error":
        stats.errors[bridge_pb2.StepError.Code.Name(reply.code)] += 1
    else:
        raise SessionError(f"session {session.id}: a {kind} answered a non-LAST observation")
    return env.step(fallback)


def vector_observation(step: int, ts: VectorTimeStep) -> bridge_pb2.Observation:
    """The Observation of a vectorised session for one `VectorTimeStep` (tensors with a leading N)."""
    obs = bridge_pb2.Observation(step=step, t_sent_ns=time.time_ns(), tensors=encode_all(ts.observation),
                                 env_step_types=ts.step_type.tolist(), env_rewards=ts.reward.tolist(),
                                 env_terminated=ts.terminated.tolist(), env_truncated=ts.truncated.tolist())
    if ts.final_observation is not None and ts.last().any():
        obs.final_observation.extend(encode_all(ts.final_observation))
    return obs


async def _drive_vector(session: Session, env: VectorEnvironment, *, stats: SimStats, budget: _Budget,
                        rate_hz: float | None = None) -> None:
    """A whole `VectorEnvironment` on one stream: N rows per observation and per action. Budget and
    `SimStats.steps` count env steps (N per exchange); the last step's rewards stay on the client.
    `rate_hz`: at most that many exchanges (of N env steps) a second."""
    n = env.num_envs
    ts, step, episode_return = env.reset(), 0, np.zeros(n)
    fallback = safe_action(env.action_spec(), n)
    pacer = Pacer(rate_hz)
    while not budget.exhausted():
        await pacer.wait()
        if budget.exhausted():
            break
        budget.claim(n)
        t0 = time.perf_counter_ns()
        msg = await session.step(vector_observation(step, ts))
        kind = msg.WhichOneof("kind")
        if kind == "action" and msg.action.step == step:
            stats.rtt_ns.append(time.perf_counter_ns() - t0)
            if msg.action.estop:  # an operator's e-stop: safe action rows (held), no policy acted
                stats.held += n
            else:
                stats.policy_versions[msg.action.policy_version] += n
            for error in msg.action.env_errors:
                stats.errors[bridge_pb2.StepError.Code.Name(error.code)] += 1
            try:
                ts = env.step(decode_all(msg.action.tensors))
            except TensorError:
                stats.errors["INVALID_ACTION"] += 1
                ts = env.step(fallback)
        elif kind == "error" and msg.error.step == step:
            stats.errors[bridge_pb2.StepError.Code.Name(msg.error.code)] += 1
            ts = env.step(fallback)
        else:
            raise SessionError(f"session {session.id}: step {step} got {kind} for step "
                               f"{getattr(getattr(msg, kind, None), 'step', '?')}")
        step += 1
        fallback = ts.applied_action
        stats.steps += n
        episode_return += ts.reward
        ended = np.flatnonzero(ts.last())
        if ended.size:
            stats.episodes += int(ended.size)
            stats.returns.extend(episode_return[ended].tolist())
            episode_return[ended] = 0.0


async def _one_session(addresses: list[str], channels: dict, credentials: Credentials,
                       env: Environment | VectorEnvironment, *, index: int, session_id: str, policy: str,
                       labels: Mapping[str, str], stats: SimStats, budget: _Budget, connect_timeout: float,
                       reply_timeout: float, reconnect_s: float, controller: Controller | None,
                       episodes: int | None, sessions: list[Session], balanced: bool = False,
                       rate_hz: float | None = None, chunks: ChunkConfig | None = None,
                       delay_ticks: int | None = None, executors: list[ChunkExecutor] | None = None) -> None:
    vector = isinstance(env, VectorEnvironment)
    observation_spec, action_spec = env.observation_spec(), env.action_spec()
    if chunks is not None:
        if vector:
            raise ValueError("chunks: only single-env sessions execute chunks, not a vector env")
        observation_spec, action_spec = chunk_hello_specs(env, chunks)
    hello = bridge_pb2.Hello(
        session_id=session_id, policy=policy, source=getattr(env, "source", f"sim:{type(env).__name__}"),
        observation_spec=[s.to_proto() for s in observation_spec],
        action_spec=[s.to_proto() for s in action_spec],
        labels={"env_index": str(index), **labels, **({"chunk": str(chunks.horizon)} if chunks else {})},
        num_envs=env.num_envs if vector else 0, batched=vector)
    session = Session(addresses, hello, credentials=credentials, connect_timeout_s=connect_timeout,
                      reply_timeout_s=reply_timeout, reconnect_s=reconnect_s, channels=channels,
                      balanced=balanced)
    sessions.append(session)
    try:
        await session.open()
        stats.sessions += 1
        if vector:
            await _drive_vector(session, env, stats=stats, budget=budget, rate_hz=rate_hz)
        elif chunks is not None:
            await drive_chunks(session, env, config=chunks, stats=stats, budget=budget, pacer=Pacer(rate_hz),
                               episodes=episodes, delay_ticks=delay_ticks, executors=executors)
        else:
            await _drive(session, env, stats=stats, budget=budget, controller=controller, episodes=episodes,
                         rate_hz=rate_hz)
        await session.close()
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            raise ConnectionError(f"gateway {session.address} unavailable (session {session.id}): "
                                  f"{e.details()}") from None
        raise SessionError(f"session {session.id} on {session.address}: {e.code().name}: {e.details()}",
                           code=e.code()) from None
    finally:
        stats.reconnects += session.reconnects
        stats.replayed += session.replayed
        await session.aclose()


async def run_sessions(target: str | Sequence[str], make_env: Callable[[int], Environment | VectorEnvironment], *,
                       envs: int, seconds: float | None = None, steps: int | None = None, policy: str = "",
                       on_progress: Callable[[SimStats], None] | None = None,
                       connect_timeout: float = 10.0, reply_timeout: float = 10.0,
                       progress_every: float = 1.0, labels: Mapping[str, str] | None = None,
                       reconnect_s: float = 0.0, controller: Controller | None = None,
                       until: Callable[[SimStats], bool] | None = None, episodes: int | None = None,
                       session_prefix: str | None = None, tls: ClientTls | None = None,
                       token: str | None = None, sessions_out: list[Session] | None = None,
                       balanced: bool = False, rate_hz: float | None = None, chunks: ChunkConfig | None = None,
                       delay_ticks: int | None = None, executors_out: list[ChunkExecutor] | None = None) -> SimStats:
    """Run `envs` sessions against the gateway at `target` (HOST:PORT, or a list of them to fail over
    across) until `seconds` or `steps` (total env steps over all sessions, exact) runs out; return their
    `SimStats`. A `VectorEnvironment` from `make_env` gets a vectorised session (see `run_vector_sessions`).

    `reconnect_s` > 0: a session whose gateway goes away moves to the next address of `target` (the same
    one for a single address) for up to that long, and replays what was not logged. `controller`: see the
    module docstring. `until`: checked at each progress tick; when it says so, the run ends early (e.g.
    once the return is high enough). `episodes`: a budget of K complete episodes in total (single-env
    sessions; session i runs K // envs episodes, plus one if i < K % envs, so a seeded run replays the
    same episodes). `session_prefix`: session i is called "<prefix>-<i>" (default "sim-<random>").
    `tls`: connect over TLS (`ClientTls`; with a client certificate for a gateway that requires one).
    `token`: a robot token NAME.SECRET (`tether token add NAME --role robot`) for a gateway that checks
    tokens, sent as `authorization: Bearer` on every stream (in plaintext only to a loopback address).
    `sessions_out`: a list that receives the `bridge.client.Session`s (their `failovers`, ...).
    `balanced`: several addresses are one gRPC channel that picks a healthy gateway by round_robin and health
    checking, for the first Hello and each failover (bridge.client.session's docstring).
    `rate_hz`: a fixed control rate, as a robot's: each session steps at most that many times a second
    (`Pacer`; a vectorised session: that many exchanges of N env steps). Default: as fast as replies come.
    `chunks`: a chunked policy's chunks, executed tick by tick (`sim.chunked`: one observation per chunk, the
    prefix with `chunks.prefix`, steps count env steps); `delay_ticks`: its inference latency in ticks (default
    0 without `rate_hz`, measured with it); `executors_out` receives each session's `ChunkExecutor`.

    Raises ConnectionError if no gateway is reachable within `connect_timeout`,
    SessionError if it rejects a session or breaks the protocol, TimeoutError if a reply takes
    longer than `reply_timeout`. The first failing session stops all of them.
    """
    if envs < 1:
        raise ValueError(f"envs must be >= 1, got {envs}")
    if seconds is None and steps is None and episodes is None:
        raise ValueError("give a budget: seconds, steps or episodes")
    if episodes is not None and (isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1):
        raise ValueError(f"episodes must be an integer >= 1, got {episodes!r}")
    if (seconds is not None and seconds <= 0) or (steps is not None and steps < 0):
        raise ValueError(f"budget must be positive, got seconds={seconds} steps={steps}")
    rate_hz = check_rate(rate_hz)
    if chunks is None and (delay_ticks is not None or executors_out is not None):
        raise ValueError("delay_ticks and executors_out go with chunks (a chunked policy)")
    if chunks is not None and controller is not None:
        raise ValueError("chunks: not with a controller (it acts per step, not per chunk)")
    if delay_ticks is not None and (isinstance(delay_ticks, bool) or not isinstance(delay_ticks, int)
                                    or not 0 <= delay_ticks <= chunks.horizon):
        raise ValueError(f"delay_ticks: expected an integer in [0, {chunks.horizon}] (the chunk horizon), "
                         f"got {delay_ticks!r}")
    addresses = [target] if isinstance(target, str) else list(target)
    credentials = tls.credentials(token) if tls is not None else Credentials(token=token)
    channels = {address: aio_channel(address, credentials, options=CHANNEL_OPTIONS) for address in addresses}
    environments: list[Environment] = []
    progress: asyncio.Task | None = None
    sessions = sessions_out if sessions_out is not None else []
    try:
        await _any_ready(channels, connect_timeout)
        for i in range(envs):
            environments.append(make_env(i))
        if chunks is not None and any(isinstance(env, VectorEnvironment) for env in environments):
            raise ValueError("chunks: only single-env sessions execute chunks, not a vector env")
        if episodes is not None and any(isinstance(env, VectorEnvironment) for env in environments):
            raise ValueError("an episodes budget needs single-env sessions, not a vector env")
        quotas = [None] * envs if episodes is None else [episodes // envs + (i < episodes % envs) for i in range(envs)]
        prefix = session_prefix or f"sim-{uuid.uuid4().hex[:6]}"
        stats = SimStats()
        budget, start = _Budget(steps=steps, seconds=seconds), time.monotonic()
        if on_progress is not None or until is not None:
            progress = asyncio.create_task(_tick(stats, start, on_progress, progress_every, until, budget))
        try:
            async with asyncio.TaskGroup() as tg:
                for i, env in enumerate(environments):
                    tg.create_task(_one_session(
                        addresses, channels, credentials, env, index=i, session_id=f"{prefix}-{i}", policy=policy,
                        labels=labels or {}, stats=stats, budget=budget, connect_timeout=connect_timeout,
                        reply_timeout=reply_timeout, reconnect_s=reconnect_s, controller=controller,
                        episodes=quotas[i], sessions=sessions, balanced=balanced, rate_hz=rate_hz,
                        chunks=chunks, delay_ticks=delay_ticks, executors=executors_out))
        except BaseExceptionGroup as group:
            first = group.exceptions[0]
            if len(group.exceptions) > 1:
                first.add_note(f"({len(group.exceptions) - 1} more session(s) failed)")
            raise first from None
        stats.elapsed_s = time.monotonic() - start
        return stats
    finally:
        if progress is not None:
            progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress
        for env in environments:
            env.close()
        for channel in channels.values():
            await channel.close()


async def _any_ready(channels: Mapping[str, grpc.aio.Channel], timeout: float) -> None:
    """Returns once one of the channels is connected; ConnectionError after `timeout`."""
    waits = [asyncio.ensure_future(channel.channel_ready()) for channel in channels.values()]
    try:
        done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    if not done:
        names = ", ".join(channels)
        raise ConnectionError(f"gateway {names} not reachable within {timeout:g} s")


async def run_vector_sessions(target: str | Sequence[str], make_vector_env: Callable[[int], VectorEnvironment], *,
                              sessions: int = 1, **kw) -> SimStats:
    """Run `sessions` vectorised sessions (one stream per `VectorEnvironment`, N = its `num_envs`)
    against the gateway at `target`; the keywords are `run_sessions`' (budget, policy, progress, ...).

    `steps` counts env steps over all sessions (N per exchange: it may overshoot by less than N per
    session). Plain text (it needs a gateway):

        stats = asyncio.run(run_vector_sessions("127.0.0.1:50051",
                                                lambda i: make_vector_env("newton:cartpole", num_envs=64, seed=i),
                                                sessions=2, seconds=10))
    """
    return await run_sessions(target, make_vector_env, envs=sessions, **kw)


async def _tick(stats: SimStats, start: float, on_progress: Callable[[SimStats], None] | None,
                every: float, until: Callable[[SimStats], bool] | None, budget: _Budget) -> None:
    while True:
        await asyncio.sleep(every)
        stats.elapsed_s = time.monotonic() - start
        if on_progress is not None:
            on_progress(stats)
        if until is not None and until(stats):
            budget.deadline = time.monotonic()  # sessions end their episodes (truncated LAST) and close
