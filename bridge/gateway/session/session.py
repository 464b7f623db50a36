"""One connected robot or simulated env: its specs, its step order, its episodes, its rewards.

Size: ~430 lines: the step path of one env in one place (handle, settle, episode and reward accounting), read
top to bottom in docs/step.md; VectorSession (vector.py) shares its pieces.

`Session.handle(observation)` turns one observation into exactly one reply: an `Action`, a
`StepError` (the session goes on), or an `EpisodeEnd` for a LAST step (or when a reward term's
condition ends the episode). The servicer calls `session.flush()` after each reply: what the reply
does not need happens there, off the critical path (`settle`: the router hears the step's outcome,
and a MID step's reward is computed when no reward term can end the episode; then the log appends
the completed transitions). A session used without `flush` settles at its next step. Which policy
version acts follows the router (the rollout controller: live, canary, pins) at each episode start
(`switch="episode"`) or at every step (`switch="step"`); the router also hears every step's outcome
and episode return (the per-version statistics that judge a canary) and runs the shadow version off
the critical path.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from bridge.gateway.session.batcher import MicroBatcher
from bridge.gateway.session.images import ImageDecoder, encoded
from bridge.gateway.session.recorder import Recorder, RecorderGroup, RewardOutcome
from bridge.gateway.versions.catalog import LOG_PROB, ServedPolicy
from bridge.rewards import RewardFunction
from protos import bridge_pb2
from protos.codec import Spec, TensorError, check_all, encode

Code = bridge_pb2.StepError.Code


@dataclass
class SessionStats:
    steps: int = 0
    episodes: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    guard: bridge_pb2.GuardReport = field(default_factory=bridge_pb2.GuardReport)  # the edge's latest counts

    def count_error(self, code: int) -> None:
        name = Code.Name(code)
        self.errors[name] = self.errors.get(name, 0) + 1


class VersionRouter(Protocol):
    """Which version a session acts with, and what it learns from the steps (RolloutController fits)."""

    def acting(self, policy: str, session_id: str, labels: Mapping[str, str]) -> ServedPolicy | None: ...

    def stepped(self, policy: ServedPolicy, *, latency_s: float, error: bool, guard: int,
                inputs: Mapping[str, np.ndarray] | None = None, actions: Mapping[str, np.ndarray] | None = None,
                deadline_s: float = 0.0, rows: bool = False, interventions: int = 0, env_steps: int = 1) -> None: ...

    def episode_ended(self, policy: ServedPolicy, episode_return: float) -> None: ...


def guard_total(report: bridge_pb2.GuardReport) -> int:
    """All the edge guard's interventions in one count."""
    return report.clamped + report.rate_limited + report.watchdog + report.estop


class Rewards(Protocol):
    """What a session needs from a reward function (bridge.rewards.RewardFunction fits; without
    `can_terminate`, every reward is computed before the reply)."""

    version: str

    def compute(self, observation, action, next_observation, env_reward, previous_action=None): ...


class SessionBase:
    """What single-env and vectorised sessions share: the acting policy, step order, errors, flushing."""

    policy: ServedPolicy
    stats: SessionStats
    recorder: Recorder | RecorderGroup
    _action_dtypes: dict[str, np.dtype]
    _last_step: int | None
    _router: VersionRouter | None = None
    labels: Mapping[str, str]
    route_labels: Mapping[str, str] | None = None  # the labels the router sees (None: `labels`); see limits.may_route
    _deadline_s: float
    _report: tuple | None = None  # the last step's outcome for the router, told by `settle` after the reply
    superseded: str = ""  # why a new connection of this session id took it over (its stream ends: ABORTED)
    on_superseded: Callable[[str], None] | None = None  # the servicer's: ends this session's stream
    on_drain: Callable[[str], None] | None = None  # the servicer's: ends the stream UNAVAILABLE (the gateway drains)

    def supersede(self, why: str) -> None:
        """A new connection of this session id took over: nothing more of this one is logged (the recorder is
        fenced: the new session alone appends for the id) and its stream ends (`on_superseded`)."""
        self.superseded = why
        self.recorder.fence()
        if self.on_superseded is not None:
            self.on_superseded(why)

    def _use(self, policy: ServedPolicy) -> None:
        self.policy = policy
        self._outputs = tuple(self._action_dtypes) + ((LOG_PROB,) if policy.log_prob else ())
        self._input_names = tuple(s.name for s in policy.inputs)

    def _follow_router(self) -> None:
        if self._router is not None:
            chosen = self._router.acting(self.policy.name, self.id,
                                         self.labels if self.route_labels is None else self.route_labels)
            if chosen is not None and chosen is not self.policy:
                self._use(chosen)

    def _out_of_order(self, step: int) -> bridge_pb2.ServerMessage | None:
        """The error reply for a step not after the previous one; else None (and the step is taken)."""
        if self._last_step is not None and step <= self._last_step:
            return self._error(step, Code.OUT_OF_ORDER, "step", f"step {step} after step {self._last_step}")
        self._last_step = step
        return None

    def _error(self, step: int, code: int, field_name: str, message: str) -> bridge_pb2.ServerMessage:
        return step_error(self.stats, step, code, field_name, message)

    def _inferred(self, infer, inputs: dict[str, np.ndarray], **request):
        """`infer` (the batcher's `infer` or `infer_rows`) of the acting version under the deadline: an awaitable
        of the outputs, or of `InferenceFailed`. `request`: the batcher's deadline_ns and timing."""
        return infer_within(infer(self.policy.name, self.policy.version, inputs, outputs=self._outputs, **request),
                            deadline_s=self._deadline_s, policy=self.policy)

    def _failed(self, step: int, exc: InferenceFailed, received: int, **told) -> bridge_pb2.ServerMessage:
        """The error reply to a step the policy gave no action for, the step's outcome kept for the router."""
        self._tell_router((time.time_ns() - received) / 1e9, error=True, **told)
        return self._error(step, exc.code, "", str(exc))

    def _episode_ended(self, step: int, *, episode: int, length: int, episode_return: float, reason: str,
                       env: int = 0) -> bridge_pb2.EpisodeEnd:
        """An episode over (of env `env` in a vectorised session): counted, its return told to the router (the
        acting version's returns; not for an episode without a policy step), and its `EpisodeEnd`."""
        self.stats.episodes += 1
        if self._router is not None and length:
            self._router.episode_ended(self.policy, episode_return)
        return bridge_pb2.EpisodeEnd(step=step, episode=episode, length=length, episode_return=episode_return,
                                     reason=reason, env=env)

    def _tell_router(self, latency_s: float, *, error: bool, guard: int, inputs=None, actions=None,
                     rows: bool = False, interventions: int = 0, env_steps: int = 1) -> None:
        """Keep a step's outcome for the router (per-version figures, the canary's monitor, the shadow):
        `settle` tells it once the reply is sent. `interventions`: of the `env_steps` env steps this observation
        completed, those whose applied action was a person's (`Observation.intervention`, `env_interventions`)."""
        if self._router is not None:
            self._report = (self.policy, latency_s, error, guard, inputs, actions, rows, interventions, env_steps)

    def settle(self) -> None:
        """The last step's bookkeeping that its reply did not need (idempotent; `flush` and the next step call it)."""
        report, self._report = self._report, None
        if report is not None:
            policy, latency_s, error, guard, inputs, actions, rows, interventions, env_steps = report
            self._router.stepped(policy, latency_s=latency_s, error=error, guard=guard, inputs=inputs,
                                 actions=actions, deadline_s=self._deadline_s, rows=rows,
                                 interventions=interventions, env_steps=env_steps)

    def flush(self) -> None:
        """Settle and log what the last reply completed (the servicer calls it once the reply is sent)."""
        self.settle()
        self.recorder.flush()

    async def held_step(self, obs: bridge_pb2.Observation) -> bridge_pb2.ServerMessage | None:
        """Take a step that an operator's e-stop holds (session.holds): no inference, nothing logged (what
        is pending is dropped: no transition spans the hold), the edge's guard report kept. Returns an OUT_OF_ORDER
        error, or None: the caller answers with the safe action."""
        if (error := self._out_of_order(obs.step)) is not None:
            return error
        if obs.HasField("guard"):
            self.stats.guard = obs.guard
        self.drop_pending()
        return None

    def drop_pending(self) -> None:
        raise NotImplementedError


class Session(SessionBase):
    def __init__(self, *, session_id: str, source: str, policy: ServedPolicy,
                 observation_spec: tuple[Spec, ...], action_spec: tuple[Spec, ...],
                 batcher: MicroBatcher, deadline_s: float, rewards: Rewards | None = None,
                 recorder: Recorder | None = None, router: VersionRouter | None = None, switch: str = "episode",
                 labels: Mapping[str, str] | None = None, images: ImageDecoder | None = None):
        """`images`: the pool decoding camera frames (session.images); None decodes them in the step."""
        self.id, self.source, self.labels = session_id, source, dict(labels or {})
        self.policy, self.observation_spec, self.action_spec = policy, observation_spec, action_spec
        self.rewards = rewards or RewardFunction.passthrough()
        self.recorder = recorder or Recorder(session=session_id, source=source, log=None,
                                             reward_version=self.rewards.version)
        self._router = router
        self._guard_pending = 0  # edge guard interventions reported since the last step
        self._intervened = False  # this observation reports the last step's applied action as a person's
        self._switch_every_step = switch == "step"
        self._batcher = batcher
        self._deadline_s = deadline_s
        self._images, self._encoded = images, encoded(observation_spec)
        last = self.recorder.next_step - 1  # the log has steps up to here: replays of them are duplicates
        self._last_step: int | None = last if last >= 0 else None
        self._episode_return = 0.0
        self._episode_length = 0
        self._acted: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None = None  # obs, action of the last step
        self._previous_action: dict[str, np.ndarray] | None = None
        self._reward_later = not getattr(self.rewards, "can_terminate", True)  # a MID step's reward: in settle
        self._unsettled: tuple | None = None  # a MID step's reward inputs, and its taken recorder step
        self._action_dtypes = {s.name: s.dtype for s in action_spec}
        self.stats = SessionStats()
        self._use(policy)

    def settle(self) -> None:
        """Reward the last MID step (when no term can end the episode, after the reply), then tell the router."""
        if (unsettled := self._unsettled) is not None:
            self._unsettled = None
            obs, arrays, observation, action, previous, acted = unsettled
            outcome = self._outcome(obs, arrays, observation, action, previous)
            self._episode_return += outcome.reward
            self.recorder.complete(acted, obs, outcome, ended=False)
        super().settle()

    async def handle(self, obs: bridge_pb2.Observation) -> bridge_pb2.ServerMessage:
        received = time.time_ns()
        if self._unsettled is not None or self._report is not None:
            self.settle()
        if (out_of_order := self._out_of_order(obs.step)) is not None:
            return out_of_order
        try:
            decoded = await self._images.decode(self._encoded, obs.tensors) if self._encoded and self._images \
                else None
            arrays = self._checked(obs, decoded=decoded)
        except TensorError as exc:
            return self._error(obs.step, Code.INVALID_OBSERVATION, exc.field, str(exc))
        if obs.HasField("guard"):
            self._guard_pending += max(0, guard_total(obs.guard) - guard_total(self.stats.guard))
            self.stats.guard = obs.guard
        self._intervened = obs.intervention and self._acted is not None  # a person acted for the last step
        end_reason = self._track_episode(obs, arrays)
        if obs.step_type == bridge_pb2.LAST or end_reason:
            return self._end_episode(obs.step, end_reason)
        if self._switch_every_step or obs.step_type == bridge_pb2.FIRST:
            self._follow_router()
        return await self._act(obs, arrays, received)

    async def held_step(self, obs: bridge_pb2.Observation) -> bridge_pb2.ServerMessage | None:
        """Take a step that an operator's e-stop holds (session.holds): no inference, nothing logged (the
        pending transition is dropped: no transition spans the hold), the edge's guard report kept without counting
        it against the acting version. Returns the reply when the step gets no safe action: an OUT_OF_ORDER error,
        or a LAST step's EpisodeEnd; None: the caller answers with the safe action."""
        self.settle()
        if obs.step_type == bridge_pb2.LAST:
            self._acted = None
            self.recorder.abandon()
            return await self.handle(obs)  # ends the episode; with nothing acted, no inference, no reward
        return await super().held_step(obs)

    def drop_pending(self) -> None:
        """Forget the last action taken (its transition is never logged): an e-stop holds what follows it."""
        self._acted = None
        self.recorder.abandon()  # RecorderGroup.abandon: every env's

    def _track_episode(self, obs: bridge_pb2.Observation, arrays: dict[str, np.ndarray]) -> str:
        """Reward the previous action; returns why the episode ends here ("" = it goes on,
        "last" = the client said so, "reward:..." = a reward term's condition)."""
        if obs.step_type == bridge_pb2.FIRST:
            self.recorder.abandon()
            self._episode_return, self._episode_length = 0.0, 0
            self._acted, self._previous_action = None, None
            return ""
        self._episode_length += 1
        if self._acted is None:  # the previous step got no action: nothing to reward
            return "last" if obs.step_type == bridge_pb2.LAST else ""
        last = obs.step_type == bridge_pb2.LAST
        if self._reward_later and not last:  # the reward cannot change this reply: `settle` computes it
            (observation, action), previous = self._acted, self._previous_action
            self._previous_action, self._acted = action, None
            self._unsettled = (obs, arrays, observation, action, previous, self.recorder.take())
            return ""
        outcome = self._reward(obs, arrays)
        self._episode_return += outcome.reward
        self.recorder.completed(obs, outcome, ended=last or bool(outcome.end_reason))
        return outcome.end_reason or ("last" if last else "")

    def _reward(self, obs: bridge_pb2.Observation, arrays: dict[str, np.ndarray]) -> RewardOutcome:
        (observation, action), previous = self._acted, self._previous_action
        self._previous_action, self._acted = action, None
        return self._outcome(obs, arrays, observation, action, previous)

    def _outcome(self, obs: bridge_pb2.Observation, arrays: dict[str, np.ndarray], observation: dict[str, np.ndarray],
                 action: dict[str, np.ndarray], previous: dict[str, np.ndarray] | None) -> RewardOutcome:
        result = self.rewards.compute(_batch(observation), _batch(action), _batch(arrays),
                                      np.array([obs.reward]), None if previous is None else _batch(previous))
        ended_by = result.ended_by(0) if result.terminate[0] else None
        return RewardOutcome.of_row(result, 0, end_reason=f"reward:{ended_by}" if ended_by else "")

    def _end_episode(self, step: int, reason: str) -> bridge_pb2.ServerMessage:
        self._acted = None
        end = self._episode_ended(step, episode=self.stats.episodes + 1, length=self._episode_length,
                                  episode_return=self._episode_return, reason="" if reason == "last" else reason)
        return bridge_pb2.ServerMessage(episode_end=end)

    async def _act(self, obs: bridge_pb2.Observation, arrays: dict[str, np.ndarray],
                   received: int) -> bridge_pb2.ServerMessage:
        inputs = {name: arrays[name] for name in self._input_names}
        reply = bridge_pb2.ServerMessage()  # filled in place: a constructor's message argument is a copy
        timing = reply.action.timing  # the batcher stamps its batch and Triton times into it
        started = time.time_ns()
        try:
            result = await self._inferred(self._batcher.infer, inputs, timing=timing,
                                          deadline_ns=robot_deadline(obs, received))
        except InferenceFailed as exc:
            return self._failed(obs.step, exc, received, guard=self._take_guard(), interventions=int(self._intervened))
        finished = time.time_ns()
        actions = {name: result[name].astype(dtype, copy=False) for name, dtype in self._action_dtypes.items()}
        self._tell_router((finished - received) / 1e9, error=False, guard=self._take_guard(), inputs=inputs,
                          actions=actions, interventions=int(self._intervened))
        self.stats.steps += 1
        action = reply.action
        action.step, action.policy, action.policy_version, action.episode = (obs.step, self.policy.name,
                                                                             self.policy.version, obs.episode)
        action.tensors.extend([encode(name, value) for name, value in actions.items()])
        timing.t_sent_ns, timing.gateway_recv_ns, timing.infer_start_ns, timing.infer_end_ns = (
            obs.t_sent_ns, received, started, finished)
        timing.clock_offset_ns = obs.clock_offset_ns
        timing.gateway_send_ns = time.time_ns()
        self._acted = (arrays, actions)
        if self.recorder.logging:
            log_prob = float(result[LOG_PROB].reshape(-1)[0]) if LOG_PROB in result else None
            if log_prob is not None:  # the client keeps it for a Replay: the replayed transition has it too
                action.log_prob.append(log_prob)
            self.recorder.acted(obs, action, log_prob)
        return reply

    def _take_guard(self) -> int:
        pending, self._guard_pending = self._guard_pending, 0
        return pending

    def _checked(self, obs: bridge_pb2.Observation, prefix: str = "",
                 decoded: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """An observation's arrays, checked against the session's specs: its tensors (names, dtypes,
        shapes, finite), its reward (finite) and the `applied_action` it reports (as an action). TensorError
        names the field (`prefix.` first: "next.applied_action.action"). `decoded`: its images, decoded by the pool."""
        arrays = _checked_tensors(self.observation_spec, obs.tensors, prefix, decoded)
        if not math.isfinite(obs.reward):
            raise TensorError(f"{prefix}.reward" if prefix else "reward", f"non-finite reward {obs.reward}")
        if obs.applied_action:  # what the edge really applied: logged, and trained on by BC
            _checked_tensors(self.action_spec, obs.applied_action, f"{prefix}.applied_action" if prefix
                             else "applied_action")
        return arrays

    def replay(self, replay: bridge_pb2.Replay) -> bridge_pb2.ServerMessage:
        """A step answered before a reconnect, resent for the log (no inference), with the acting log-probability
        it was answered with (`Action.log_prob`)."""
        self.settle()
        obs, action = replay.observation, replay.action
        if self._last_step is not None and obs.step <= self._last_step:
            self.recorder.duplicates += 1
            return bridge_pb2.ServerMessage(replayed=bridge_pb2.Replayed(step=obs.step, duplicate=True))
        following = replay.next if replay.HasField("next") else None
        try:  # every check a live observation gets, and the action against the action spec: nothing bad is logged
            arrays = self._checked(obs, "observation")
            actions = _checked_tensors(self.action_spec, action.tensors, "action")
            after = self._checked(following, "next") if following is not None else None
            if action.policy != self.policy.name:  # the log's lineage: only what this session's policy answered
                raise TensorError("action.policy", f"{action.policy[:64]!r} is not this session's policy "
                                                   f"{self.policy.name!r}")
            log_prob = replayed_log_prob(action.log_prob, 1)
            if log_prob is not None and not np.isfinite(log_prob).all():
                raise TensorError("action.log_prob", f"non-finite log-probability {log_prob[0]}")
        except TensorError as exc:
            return self._error(obs.step, Code.INVALID_OBSERVATION, exc.field, f"replay: {exc}")
        self._last_step = obs.step
        self._acted = (arrays, actions)
        if self.recorder.logging:
            self.recorder.acted(obs, action, None if log_prob is None else float(log_prob[0]))
        if following is not None:  # complete it now; without `next` it waits for the live observation
            ended = following.step_type == bridge_pb2.LAST
            outcome = self._reward(following, after)
            self.recorder.completed(following, outcome, ended=ended or bool(outcome.end_reason))
        return bridge_pb2.ServerMessage(replayed=bridge_pb2.Replayed(step=obs.step))



def robot_deadline(obs: bridge_pb2.Observation, received_ns: int) -> int:
    """The observation's deadline in the gateway's clock (its robot clock time plus the client's offset
    estimate), 0 when it gave none; one over a second before its arrival (a clock far off) counts as none."""
    if not obs.deadline_ns:
        return 0
    deadline = obs.deadline_ns + obs.clock_offset_ns
    return deadline if deadline > received_ns - 1_000_000_000 else 0


def replayed_log_prob(values, rows: int) -> np.ndarray | None:
    """A Replay's `Action.log_prob`: None (a deterministic policy), or `rows` values (TensorError for another count;
    the caller checks that they are finite: a single env's step as a whole, a vectorised one's per row)."""
    if not values:
        return None
    if len(values) != rows:
        raise TensorError("action.log_prob", f"{len(values)} values for {rows} row(s)")
    return np.fromiter(values, np.float32, count=rows)


def _checked_tensors(specs: tuple[Spec, ...], tensors, prefix: str,
                     decoded: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """`check_all`, with the field the tensor came in named in the error ("applied_action.action")."""
    try:
        return check_all(specs, tensors, decoded)
    except TensorError as exc:
        if not prefix:
            raise
        raise TensorError(f"{prefix}.{exc.field}", str(exc).removeprefix(f"{exc.field}: ")) from None


def step_error(stats: SessionStats, step: int, code: int, field_name: str, message: str) -> bridge_pb2.ServerMessage:
    """A counted StepError reply (single-env and vectorised sessions)."""
    stats.count_error(code)
    return bridge_pb2.ServerMessage(error=bridge_pb2.StepError(step=step, code=code, field=field_name, message=message))


class InferenceFailed(Exception):
    """No action: the deadline passed (`DEADLINE_EXCEEDED`) or Triton failed (`INFERENCE_FAILED`)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


async def infer_within(request, *, deadline_s: float, policy: ServedPolicy) -> dict[str, np.ndarray]:
    """Await a batcher request under the session's deadline; failures become `InferenceFailed`.

    The deadline is one timer that cancels this task (what `asyncio.timeout` does, at half its cost per step);
    a cancellation from elsewhere still propagates."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    expired: list[bool] = []
    cancelling = task.cancelling()
    timer = loop.call_at(loop.time() + deadline_s, _expire, task, expired)
    try:
        return await request
    except asyncio.CancelledError:
        if not expired or task.uncancel() > cancelling:
            raise
        raise InferenceFailed(Code.DEADLINE_EXCEEDED,
                              f"no action within the {deadline_s * 1e3:.0f} ms deadline") from None
    except Exception as exc:
        raise InferenceFailed(Code.INFERENCE_FAILED, f"policy {policy.name!r} v{policy.version}: {exc}") from exc
    finally:
        timer.cancel()


def _expire(task: asyncio.Task, expired: list[bool]) -> None:
    expired.append(True)
    task.cancel()


def _batch(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A batch of one (views, no copies)."""
    return {name: value[None] for name, value in arrays.items()}
