"""The sim client: N environments, each a `tether.v1.Bridge.Connect` session, in one asyncio loop.

From the command line (`tether sim`, in `sim.cli`):

    tether sim --gateway 127.0.0.1:50051 --env Hopper-v5 --envs 8 --seconds 10

From Python (plain text, it needs a gateway):

    stats = asyncio.run(run_sessions("127.0.0.1:50051", lambda i: make_env("Hopper-v5", seed=i),
                                     envs=8, seconds=10))
    stats.summary()  # {"steps": ..., "steps_per_s": ..., "rtt_ms": {"p50": ..., "p99": ...}, ...}

Each session sends Hello, awaits Welcome, then loops: Observation -> one reply. An Action is
stepped inline (MuJoCo steps take microseconds); a StepError is counted and the last applied
action (zeros after a reset) is stepped instead; a LAST observation is answered by EpisodeEnd
and the env is reset (so is a MID one the gateway ends, when a reward term's condition fired).
When the budget (`seconds` or `steps`) runs out, a session in mid-episode sends its last
observation as a truncated LAST, so the gateway sees every reward, then closes its stream.

When the gateway logs experience (`Welcome.logging`), a session keeps every step it sent until a
reply says it is durable (`durable_through`). If the gateway goes away, the session reconnects
(`reconnect_s`), says Hello again with the same id and resends, as `Replay`, what the new
gateway's log lacks, then goes on: no acknowledged or answered step is lost or logged twice.
With a `controller`, the env steps the controller's action instead of the policy's, and reports
it as the applied action (scripted demonstrations for behaviour cloning).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from bridge.common.percentiles import summary_ms
from protos.codec import TensorError, decode_all, encode_all
from protos.tether.v1 import bridge_pb2, bridge_pb2_grpc
from sim.env import Environment, StepType, TimeStep, zeros
from sim.vector import VectorEnvironment, VectorTimeStep, safe_action

__all__ = ["SessionError", "SimStats", "main", "run_sessions", "run_vector_sessions", "vector_observation"]


VECTOR_PREFIXES = ("newton", "isaaclab", "mujoco", "gymnasium", "serial")  # `--env` names of vector envs


class SessionError(RuntimeError):
    """A session failed: the gateway rejected or ended its stream, or broke the protocol."""


@dataclass
class SimStats:
    """Counters shared by all sessions of one `run_sessions` call."""

    steps: int = 0                 # env.step calls (one per reply to a FIRST/MID observation)
    episodes: int = 0              # episodes ended with a LAST observation
    errors: Counter[str] = field(default_factory=Counter)        # StepError code names, INVALID_ACTION
    rtt_ns: deque[int] = field(default_factory=lambda: deque(maxlen=200_000))  # send -> Action
    policy_versions: Counter[int] = field(default_factory=Counter)
    returns: deque[float] = field(default_factory=lambda: deque(maxlen=1000))  # client-side returns
    sessions: int = 0              # sessions welcomed by the gateway
    reconnects: int = 0            # sessions that reconnected after the gateway went away
    cut_episodes: int = 0          # episodes ended early (truncated LAST) because the budget ran out
    replayed: int = 0              # steps resent as Replay after a reconnect
    held: int = 0                  # env steps answered with the safe action under an operator e-stop (Action.estop)
    elapsed_s: float = 0.0

    def rtt_ms(self) -> dict[str, float | None]:
        return summary_ms(self.rtt_ns)  # the console's definition (bridge.common.percentiles): same samples, same p99

    @property
    def newest_version(self) -> int | None:
        return max(self.policy_versions, default=None)

    def summary(self) -> dict:
        return {"steps": self.steps,
                "steps_per_s": round(self.steps / self.elapsed_s, 1) if self.elapsed_s > 0 else 0.0,
                "sessions": self.sessions, "episodes": self.episodes,
                "mean_return": round(float(np.mean(self.returns)), 3) if self.returns else None,
                "rtt_ms": self.rtt_ms(), "errors": dict(self.errors),
                "policy_versions": {str(v): n for v, n in sorted(self.policy_versions.items())},
                "recent_return": None if self.recent_return() is None else round(self.recent_return(), 3),
                "reconnects": self.reconnects, "replayed": self.replayed, "held": self.held,
                "elapsed_s": round(self.elapsed_s, 3)}

    def recent_return(self, episodes: int = 20) -> float | None:
        """The mean return of the last `episodes` episodes."""
        recent = list(self.returns)[-episodes:]
        return float(np.mean(recent)) if recent else None

    def status_line(self) -> str:
        s, rtt = self.summary(), self.rtt_ms()
        rtt_text = "-" if rtt["p50"] is None else f"{rtt['p50']:.2f}/{rtt['p99']:.2f} ms"
        recent = self.recent_return()
        versions = sorted(self.policy_versions) or ["-"]
        version_text = f"v{versions[0]}" if len(versions) == 1 else f"v{versions[0]}..v{versions[-1]}"
        return (f"sim {s['elapsed_s']:7.1f}s  sessions {s['sessions']}  steps {s['steps']} "
                f"({s['steps_per_s']:.0f}/s)  episodes {s['episodes']}  "
                f"return(last 20) {'-' if recent is None else f'{recent:.1f}'}  rtt p50/p99 {rtt_text}  "
                f"errors {sum(self.errors.values())}  versions {version_text}")


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


class _Broken(Exception):
    """The stream to the gateway broke (the gateway went away): reconnect, or give up."""


Controller = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


class _Session:
    def __init__(self, channel, env: Environment, *, hello: bridge_pb2.Hello, target: str, stats: SimStats,
                 budget: _Budget, connect_timeout: float, reply_timeout: float, reconnect_s: float,
                 controller: Controller | None = None, episodes: int | None = None):
        self.episodes = episodes  # episodes this session runs (None = until the budget runs out)
        self.channel, self.env, self.hello_msg, self.id, self.target = channel, env, hello, hello.session_id, target
        self.stats, self.budget, self.reply_timeout = stats, budget, reply_timeout
        self.connect_timeout, self.reconnect_s, self.controller = connect_timeout, reconnect_s, controller
        self.fallback = zeros(env.action_spec())
        self.call = None
        self.logging = False
        self.unacked: deque[tuple[bridge_pb2.Observation, bridge_pb2.Action | None]] = deque()  # sent, not durable
        self.reconnects = 0
        self.welcomed = False

    async def _reply(self, timeout: float, what: str) -> bridge_pb2.ServerMessage:
        try:
            msg = await asyncio.wait_for(self.call.read(), timeout)
        except TimeoutError:
            raise TimeoutError(f"session {self.id}: no {what} from {self.target} "
                               f"within {timeout:g} s") from None
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                raise _Broken(e.details()) from None
            raise
        if msg is grpc.aio.EOF:
            code, details = await self.call.code(), await self.call.details()
            if code == grpc.StatusCode.UNAVAILABLE:
                raise _Broken(details)
            raise SessionError(f"session {self.id}: {self.target} ended the stream while we awaited "
                               f"{what}: {code.name} {details}")
        return msg

    async def _write(self, message: bridge_pb2.ClientMessage) -> None:
        try:
            await self.call.write(message)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as e:
            raise _Broken(str(e)) from None

    async def hello(self, timeout: float, *, wait_for_ready: bool = False) -> bridge_pb2.Welcome:
        if self.call is not None:
            self.call.cancel()
        self.call = bridge_pb2_grpc.BridgeStub(self.channel).Connect(wait_for_ready=wait_for_ready)
        await self._write(bridge_pb2.ClientMessage(hello=self.hello_msg))
        msg = await self._reply(timeout, "Welcome")
        if msg.WhichOneof("kind") != "welcome":
            raise SessionError(f"session {self.id}: expected Welcome, got {msg.WhichOneof('kind')}")
        if not self.welcomed:
            self.welcomed = True
            self.stats.sessions += 1
        self.id = msg.welcome.session_id or self.id
        self.hello_msg.session_id = self.id
        self.logging = msg.welcome.logging
        self._durable(msg.welcome.durable_through)
        return msg.welcome

    def _durable(self, through: int) -> None:
        while self.unacked and self.unacked[0][0].step < through:
            self.unacked.popleft()

    async def _exchange(self, observation: bridge_pb2.Observation) -> bridge_pb2.ServerMessage:
        """Send one observation and return its reply, reconnecting (and replaying) if the gateway
        went away in between."""
        deadline = None
        while True:
            try:
                await self._write(bridge_pb2.ClientMessage(observation=observation))
                msg = await self._reply(self.reply_timeout, f"reply to step {observation.step}")
                break
            except _Broken as e:
                deadline = deadline or time.monotonic() + self.reconnect_s
                if time.monotonic() >= deadline:
                    raise ConnectionError(f"session {self.id}: gateway {self.target} gone ({e}) and not back "
                                          f"within {self.reconnect_s:g} s") from None
                await self._reconnect(deadline)
        if self.logging:
            action = msg.action if msg.WhichOneof("kind") == "action" else None
            self.unacked.append((observation, action))
        self._durable(msg.durable_through)
        return msg

    async def _reconnect(self, deadline: float) -> None:
        """Hello again with the same id, then replay what the gateway's log lacks."""
        await asyncio.sleep(0.05)
        try:
            await self.hello(max(0.1, deadline - time.monotonic()), wait_for_ready=True)
        except (TimeoutError, _Broken):
            return  # not back yet: the caller retries until its deadline
        self.reconnects += 1
        entries = list(self.unacked)
        for i, (obs, action) in enumerate(entries):
            if action is None:
                continue  # answered by an error: no transition to log
            replay = bridge_pb2.Replay(observation=obs, action=action)
            if i + 1 < len(entries):
                replay.next.CopyFrom(entries[i + 1][0])
            await self._write(bridge_pb2.ClientMessage(replay=replay))
            self.stats.replayed += 1
            msg = await self._reply(self.reply_timeout, f"Replayed for step {obs.step}")
            if msg.WhichOneof("kind") == "error":
                raise SessionError(f"session {self.id}: replay of step {obs.step} refused: {msg.error.message}")
            self._durable(msg.durable_through)

    async def run(self) -> None:
        ts, step, episode, episode_return = self.env.reset(), 0, 0, 0.0
        episodes_left = self.episodes
        while True:
            stop = self.budget.exhausted()
            if ts.step_type is StepType.FIRST and (stop or episodes_left == 0):
                return  # nothing of this episode was sent
            if ts.step_type is StepType.FIRST and episodes_left is not None:
                episodes_left -= 1
            step_type = StepType.LAST if stop else ts.step_type
            cut = stop and ts.step_type is not StepType.LAST
            if step_type is not StepType.LAST:
                self.budget.claim()
            t0 = time.perf_counter_ns()
            msg = await self._exchange(bridge_pb2.Observation(
                step=step, t_sent_ns=time.time_ns(), step_type=int(step_type), episode=episode,
                tensors=encode_all(ts.observation), reward=ts.reward, terminated=ts.terminated,
                applied_action=encode_all(ts.applied_action or {})))
            kind = msg.WhichOneof("kind")
            reply = getattr(msg, kind) if kind else None
            if reply is None or kind == "welcome" or reply.step != step:
                raise SessionError(f"session {self.id}: step {step} ({step_type.name}) got "
                                   f"{kind} for step {getattr(reply, 'step', '?')}")
            step += 1
            if step_type is StepType.LAST or kind == "episode_end":
                if kind == "error":
                    self.stats.errors[bridge_pb2.StepError.Code.Name(reply.code)] += 1
                elif kind != "episode_end":
                    raise SessionError(f"session {self.id}: LAST step {step - 1} got {kind}, not EpisodeEnd")
                self.stats.episodes += 1
                self.stats.returns.append(episode_return)
                if stop:
                    self.stats.cut_episodes += cut
                    return
                ts, episode_return, episode = self.env.reset(), 0.0, episode + 1
                self.fallback = zeros(self.env.action_spec())
                continue
            ts = self._act(kind, reply, time.perf_counter_ns() - t0, ts)
            self.fallback = ts.applied_action
            self.stats.steps += 1
            episode_return += ts.reward

    def _act(self, kind: str, reply, rtt_ns: int, current: TimeStep) -> TimeStep:
        if kind == "action":
            self.stats.rtt_ns.append(rtt_ns)
            if reply.estop:  # an operator's e-stop: the safe action (held), no policy acted
                self.stats.held += 1
            else:
                self.stats.policy_versions[reply.policy_version] += 1
            try:
                action = decode_all(reply.tensors)
                return self.env.step(action if self.controller is None else self.controller(current.observation))
            except TensorError:
                self.stats.errors["INVALID_ACTION"] += 1
        elif kind == "error":
            self.stats.errors[bridge_pb2.StepError.Code.Name(reply.code)] += 1
        else:
            raise SessionError(f"session {self.id}: a {kind} answered a non-LAST observation")
        return self.env.step(self.fallback)

    async def close(self) -> None:
        """Half-close, drain to the end of the stream and check that it ended OK."""
        await self.call.done_writing()
        try:
            while await asyncio.wait_for(self.call.read(), self.reply_timeout) is not grpc.aio.EOF:
                pass
        except TimeoutError:
            raise TimeoutError(f"session {self.id}: {self.target} did not end the stream within "
                               f"{self.reply_timeout:g} s of our half-close") from None
        code = await self.call.code()
        if code != grpc.StatusCode.OK:
            details = await self.call.details()
            raise SessionError(f"session {self.id}: stream ended with {code.name} {details}")


def vector_observation(step: int, ts: VectorTimeStep) -> bridge_pb2.Observation:
    """The Observation of a vectorised session for one `VectorTimeStep` (tensors with a leading N)."""
    obs = bridge_pb2.Observation(step=step, t_sent_ns=time.time_ns(), tensors=encode_all(ts.observation),
                                 env_step_types=ts.step_type.tolist(), env_rewards=ts.reward.tolist(),
                                 env_terminated=ts.terminated.tolist(), env_truncated=ts.truncated.tolist())
    if ts.final_observation is not None and ts.last().any():
        obs.final_observation.extend(encode_all(ts.final_observation))
    return obs


class _VectorSession(_Session):
    """One stream for a whole `VectorEnvironment`: N rows per observation and per action.

    Budget and `SimStats.steps` count env steps (N per exchange). The last step's rewards stay on the
    client (a vector env has no truncated LAST to send); reconnects are not attempted.
    """

    async def run(self) -> None:
        env, n = self.env, self.env.num_envs
        ts, step, episode_return = env.reset(), 0, np.zeros(n)
        fallback = safe_action(env.action_spec(), n)
        while not self.budget.exhausted():
            self.budget.claim(n)
            t0 = time.perf_counter_ns()
            await self._write(bridge_pb2.ClientMessage(observation=vector_observation(step, ts)))
            msg = await self._reply(self.reply_timeout, f"reply to step {step}")
            kind = msg.WhichOneof("kind")
            if kind == "action" and msg.action.step == step:
                self.stats.rtt_ns.append(time.perf_counter_ns() - t0)
                if msg.action.estop:  # an operator's e-stop: safe action rows (held), no policy acted
                    self.stats.held += n
                else:
                    self.stats.policy_versions[msg.action.policy_version] += n
                for error in msg.action.env_errors:
                    self.stats.errors[bridge_pb2.StepError.Code.Name(error.code)] += 1
                try:
                    ts = env.step(decode_all(msg.action.tensors))
                except TensorError:
                    self.stats.errors["INVALID_ACTION"] += 1
                    ts = env.step(fallback)
            elif kind == "error" and msg.error.step == step:
                self.stats.errors[bridge_pb2.StepError.Code.Name(msg.error.code)] += 1
                ts = env.step(fallback)
            else:
                raise SessionError(f"session {self.id}: step {step} got {kind} for step "
                                   f"{getattr(getattr(msg, kind, None), 'step', '?')}")
            step += 1
            fallback = ts.applied_action
            self.stats.steps += n
            episode_return += ts.reward
            ended = np.flatnonzero(ts.last())
            if ended.size:
                self.stats.episodes += int(ended.size)
                self.stats.returns.extend(episode_return[ended].tolist())
                episode_return[ended] = 0.0


def _rpc_error(e: grpc.aio.AioRpcError, *, target: str, session_id: str) -> Exception:
    if e.code() == grpc.StatusCode.UNAVAILABLE:
        return ConnectionError(f"gateway {target} unavailable (session {session_id}): {e.details()}")
    return SessionError(f"session {session_id} on {target}: {e.code().name}: {e.details()}")


async def _one_session(channel, env: Environment, *, index: int, session_id: str, target: str,
                       policy: str, labels: Mapping[str, str], stats: SimStats, budget: _Budget,
                       connect_timeout: float, reply_timeout: float, reconnect_s: float,
                       controller: Controller | None, episodes: int | None = None) -> None:
    vector = isinstance(env, VectorEnvironment)
    hello = bridge_pb2.Hello(
        session_id=session_id, policy=policy, source=getattr(env, "source", f"sim:{type(env).__name__}"),
        observation_spec=[s.to_proto() for s in env.observation_spec()],
        action_spec=[s.to_proto() for s in env.action_spec()],
        labels={"env_index": str(index), **labels},
        num_envs=env.num_envs if vector else 0, batched=vector)
    session = (_VectorSession if vector else _Session)(
        channel, env, hello=hello, target=target, stats=stats, budget=budget, connect_timeout=connect_timeout,
        reply_timeout=reply_timeout, reconnect_s=reconnect_s, controller=controller, episodes=episodes)
    try:
        await session.hello(connect_timeout)
        await session.run()
        await session.close()
    except grpc.aio.AioRpcError as e:
        raise _rpc_error(e, target=target, session_id=session.id) from None
    except _Broken as e:
        raise ConnectionError(f"gateway {target} unavailable (session {session.id}): {e}") from None
    finally:
        stats.reconnects += session.reconnects
        if session.call is not None:
            session.call.cancel()  # a no-op once the stream has ended


class _Token(grpc.aio.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer TOKEN` to every Connect stream."""

    def __init__(self, token: str):
        self._pair = ("authorization", f"Bearer {token}")

    async def intercept_stream_stream(self, continuation, details, request_iterator):
        metadata = grpc.aio.Metadata(*(tuple(details.metadata) if details.metadata else ()), self._pair)
        return await continuation(grpc.aio.ClientCallDetails(details.method, details.timeout, metadata,
                                                             details.credentials, details.wait_for_ready),
                                  request_iterator)


def _channel(target: str, tls: ClientTls | None, token: str | None) -> grpc.aio.Channel:
    interceptors = [_Token(token)] if token else None
    if tls is not None:
        return grpc.aio.secure_channel(target, tls.credentials(), interceptors=interceptors)
    host = target.rpartition(":")[0].strip("[]") or target
    if token and not (host in ("localhost", "::1") or host.startswith("127.")):
        raise ValueError(f"refusing to send a token in plaintext to {target}: give --tls-ca")
    return grpc.aio.insecure_channel(target, interceptors=interceptors)


@dataclass(frozen=True, kw_only=True)
class ClientTls:
    """TLS to the gateway: the CA that signed its certificate; `cert` + `key` for mTLS (the client's identity,
    e.g. from `tether certs init DIR --client sim_1:robot`)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.cert is None) != (self.key is None):
            raise ValueError(f"a client certificate needs both --tls-cert and --tls-key, got {self.cert}, {self.key}")
        return grpc.ssl_channel_credentials(Path(self.ca).read_bytes(),
                                            Path(self.key).read_bytes() if self.key else None,
                                            Path(self.cert).read_bytes() if self.cert else None)


async def run_sessions(target: str, make_env: Callable[[int], Environment | VectorEnvironment], *, envs: int,
                       seconds: float | None = None, steps: int | None = None, policy: str = "",
                       on_progress: Callable[[SimStats], None] | None = None,
                       connect_timeout: float = 10.0, reply_timeout: float = 10.0,
                       progress_every: float = 1.0, labels: Mapping[str, str] | None = None,
                       reconnect_s: float = 0.0, controller: Controller | None = None,
                       until: Callable[[SimStats], bool] | None = None, episodes: int | None = None,
                       session_prefix: str | None = None, tls: ClientTls | None = None,
                       token: str | None = None) -> SimStats:
    """Run `envs` sessions against the gateway at `target` until `seconds` or `steps` (total env
    steps over all sessions, exact) runs out; return their `SimStats`. A `VectorEnvironment` from
    `make_env` gets a vectorised session (see `run_vector_sessions`).

    `reconnect_s` > 0: a session whose gateway goes away reconnects for up to that long (and
    replays what was not logged). `controller`: see the module docstring. `until`: checked at
    each progress tick; when it says so, the run ends early (e.g. once the return is high enough).
    `episodes`: a budget of K complete episodes in total (single-env sessions; session i runs
    K // envs episodes, plus one if i < K % envs, so a seeded run replays the same episodes).
    `session_prefix`: session i is called "<prefix>-<i>" (default "sim-<random>").
    `tls`: connect over TLS (`ClientTls`; with a client certificate for a gateway that requires one).
    `token`: a robot token NAME.SECRET (`tether token add NAME --role robot`) for a gateway that checks
    tokens, sent as `authorization: Bearer` on every stream (in plaintext only to a loopback address).

    Raises ConnectionError if the gateway is not reachable within `connect_timeout`,
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
    channel = _channel(target, tls, token)
    environments: list[Environment] = []
    progress: asyncio.Task | None = None
    try:
        try:
            await asyncio.wait_for(channel.channel_ready(), connect_timeout)
        except TimeoutError:
            raise ConnectionError(f"gateway {target} not reachable within {connect_timeout:g} s") from None
        for i in range(envs):
            environments.append(make_env(i))
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
                        channel, env, index=i, session_id=f"{prefix}-{i}", target=target, policy=policy,
                        labels=labels or {}, stats=stats, budget=budget, connect_timeout=connect_timeout,
                        reply_timeout=reply_timeout, reconnect_s=reconnect_s, controller=controller,
                        episodes=quotas[i]))
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
        await channel.close()


async def run_vector_sessions(target: str, make_vector_env: Callable[[int], VectorEnvironment], *,
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


def main(argv: Sequence[str] | None = None) -> int:
    """`tether sim`: moved to `sim.cli.main` (kept here for `python -m sim.client` and old imports)."""
    from sim.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
