"""A vectorised session: N simulated envs on one stream, stepped as one batch (`Hello.num_envs = N`).

Every observation carries tensors with a leading N and per-env `env_step_types`, `env_rewards`,
`env_terminated`, `env_truncated` (and `final_observation` rows for envs that ended), with the
same-step auto-reset of `sim/vector.py`: a LAST env's observation row is already the first of its
next episode, so every env gets an action row, every step. `VectorSession.handle` answers with one
`Action` of N rows (one Triton request through the micro-batcher, which merges it with other
sessions' rows up to `max_batch` and splits bigger batches), plus:

- `Action.episode_ends`: one `EpisodeEnd` (with `env`) per env whose episode ended at this
  observation: LAST, or a reward term's condition (`reason = "reward:<term>"`; the env's row then
  starts its next episode in the gateway's accounting; the client does not reset it);
- `Action.env_errors`: one `EnvError` per env whose row is bad (a NaN in its observation, reward or
  terminal observation): its action row is the safe action (zero clipped into the action spec's
  bounds), its pending transition is dropped, nothing of this step is logged for it, and every
  other env goes on. A malformed batch (wrong name, dtype, shape, env_* lengths) is one StepError.

Rewards are computed once per step for all envs that completed a transition (batch-first); terms that
read the next observation read `final_observation` for LAST envs (a client without terminal
observations, e.g. Isaac Lab, sends none: those rows then read the reset observation). With an
experience log, env i logs its transitions as session `"<id>/<i>"`, episode = the gateway's count of
env i's ended episodes, step = the stream's step. The policy version follows the catalog at every
step (one request, one version per session: the router's choice for the session id and labels); each
transition records the version that acted, and with a stochastic policy its log-probability (also sent to the
client in `Action.log_prob`, one per row, when the session logs).

`replay(Replay)` (after a reconnect: the client resends the N-row steps not yet acknowledged durable) goes
through the same accounting as a live step without inference: the replayed action rows (and their
`log_prob`) are what env i logs for that step, and the observation that follows on the stream (the next
Replay's, or the live step resent after them) completes it. The checks apply per row: a row whose
observation, action or log-probability is not finite is not logged (as a live step's bad row), nor is a step
an operator's e-stop held (`Action.estop`: it drops what is pending, as live); a malformed
step (names, dtypes, shapes, env_* or log_prob lengths, another policy) is one StepError. Each env's
transition is logged once: the log takes a step of `"<id>/<i>"` only above the last it has (a replayed
step that every env already has is answered `duplicate`), and `durable_through` is the lowest over the envs.

    session = VectorSession(session_id="v", source="newton:cartpole", policy=served, num_envs=64,
                            observation_spec=obs_specs, action_spec=act_specs, batcher=batcher,
                            deadline_s=0.1)
    reply = await session.handle(observation)   # ServerMessage(action=Action with 64 rows)
    session.flush()
"""

from __future__ import annotations

import time

import numpy as np

from bridge.gateway.session.batcher import MicroBatcher
from bridge.gateway.session.recorder import RecorderGroup, RewardOutcome
from bridge.gateway.session.session import (
    InferenceFailed,
    Rewards,
    SessionBase,
    SessionStats,
    VersionRouter,
    replayed_log_prob,
    robot_deadline,
)
from bridge.gateway.versions.catalog import LOG_PROB, ServedPolicy
from bridge.rewards import RewardFunction
from protos import bridge_pb2
from protos.codec import Spec, TensorError, decode, dtype_to_numpy, encode

Code = bridge_pb2.StepError.Code
FIRST, MID, LAST = bridge_pb2.FIRST, bridge_pb2.MID, bridge_pb2.LAST
MAX_ENVS = 1 << 16


class VectorSession(SessionBase):
    def __init__(self, *, session_id: str, source: str, policy: ServedPolicy, num_envs: int,
                 observation_spec: tuple[Spec, ...], action_spec: tuple[Spec, ...], batcher: MicroBatcher,
                 deadline_s: float, rewards: Rewards | None = None, recorder: RecorderGroup | None = None,
                 router: VersionRouter | None = None, labels: dict[str, str] | None = None):
        if not 1 <= num_envs <= MAX_ENVS:
            raise ValueError(f"num_envs must be in [1, {MAX_ENVS}], got {num_envs}")
        self.id, self.source, self.num_envs = session_id, source, num_envs
        self.observation_spec, self.action_spec = observation_spec, action_spec
        self.rewards = rewards or RewardFunction.passthrough()
        self.recorder = recorder or RecorderGroup(session=session_id, source=source, log=None,
                                                  reward_version=self.rewards.version, num_envs=num_envs)
        self._router, self._batcher, self._deadline_s = router, batcher, deadline_s
        self.labels = dict(labels or {})
        self._last_step: int | None = None
        n = num_envs
        self._return = np.zeros(n)
        self._length = np.zeros(n, np.int64)
        self._episodes = np.zeros(n, np.int64)       # ended episodes per env
        self._acted = np.zeros(n, bool)              # env i's row got a policy action last step
        self._intervened = (0, 0)                    # (env steps a person acted, env steps completed) this step
        self._has_previous = np.zeros(n, bool)       # env i has an action before the acted one (smoothness)
        self._observation: dict[str, np.ndarray] = {}
        self._action: dict[str, np.ndarray] = {}
        self._previous: dict[str, np.ndarray] = {s.name: np.zeros((n, *s.shape), s.dtype) for s in action_spec}
        self._safe = _safe_rows(action_spec, n)
        self._action_dtypes = {s.name: s.dtype for s in action_spec}
        self.stats = SessionStats()
        self._use(policy)
        if self.recorder.logging:  # every env's log has the steps up to here: replays of them are duplicates
            have = min(r.next_step for r in self.recorder.recorders) - 1
            self._last_step = have if have >= 0 else None

    def replay(self, replay: bridge_pb2.Replay) -> bridge_pb2.ServerMessage:
        """An N-row step answered before a reconnect, resent for the log (no inference; see the module docstring)."""
        self.settle()
        obs, action = replay.observation, replay.action
        if self._last_step is not None and obs.step <= self._last_step:
            self.recorder.recorders[0].duplicates += 1
            return bridge_pb2.ServerMessage(replayed=bridge_pb2.Replayed(step=obs.step, duplicate=True))
        if action.estop:  # an operator's e-stop held it (safe action rows, no policy): as live, nothing is logged
            self._last_step = obs.step
            self.drop_pending()
            return bridge_pb2.ServerMessage(replayed=bridge_pb2.Replayed(step=obs.step))
        try:
            batch = _Batch.check(obs, self.observation_spec, self.num_envs, self.action_spec)
            actions = _decode(action.tensors, self.action_spec, self.num_envs, "action")
            log_prob = replayed_log_prob(action.log_prob, self.num_envs)
            if replay.HasField("next"):  # checked; the next message on the stream completes the step
                _Batch.check(replay.next, self.observation_spec, self.num_envs, self.action_spec)
            if action.policy != self.policy.name:  # the log's lineage: only what this session's policy answered
                raise TensorError("action.policy", f"{action.policy[:64]!r} is not this session's policy "
                                                   f"{self.policy.name!r}")
        except TensorError as exc:
            return self._error(obs.step, Code.INVALID_OBSERVATION, exc.field, f"replay: {exc}")
        duplicate = all(r.next_step > obs.step for r in self.recorder.recorders)
        self._last_step = obs.step
        router, self._router = self._router, None  # the episodes a replay ends were the old gateway's to judge
        try:
            self._track_episodes(obs, batch)  # the observation rows complete the envs' previous steps
        finally:
            self._router = router
        for spec in self.action_spec:     # a row whose action is not finite is not logged
            if spec.dtype.kind == "f":
                finite = np.isfinite(actions[spec.name].reshape(self.num_envs, -1)).all(axis=1)
                batch._flag(~finite, f"action.{spec.name}", "contains NaN or infinite values")
        if log_prob is not None:
            batch._flag(~np.isfinite(log_prob), "action.log_prob", "contains NaN or infinite values")
        self._observation, self._action, self._acted = batch.observation, actions, ~batch.bad
        if self.recorder.logging:
            reply = bridge_pb2.Action(step=obs.step, policy=action.policy, policy_version=action.policy_version,
                                      timing=action.timing)
            self._log_acted(obs, batch, reply, actions, log_prob)
        return bridge_pb2.ServerMessage(replayed=bridge_pb2.Replayed(step=obs.step, duplicate=duplicate))

    async def handle(self, obs: bridge_pb2.Observation) -> bridge_pb2.ServerMessage:
        received = time.time_ns()
        if self._report is not None:  # used without flush: the last step's outcome first
            self.settle()
        if (out_of_order := self._out_of_order(obs.step)) is not None:
            return out_of_order
        try:
            batch = _Batch.check(obs, self.observation_spec, self.num_envs, self.action_spec)
        except TensorError as exc:
            return self._error(obs.step, Code.INVALID_OBSERVATION, exc.field, str(exc))
        ends = self._track_episodes(obs, batch)
        self._follow_router()
        return await self._act(obs, batch, ends, received)

    def drop_pending(self) -> None:
        """Forget every env's last action (their transitions are never logged): an e-stop holds what follows."""
        self._acted[:] = False
        self.recorder.abandon()

    def _track_episodes(self, obs: bridge_pb2.Observation, batch: _Batch) -> list[bridge_pb2.EpisodeEnd]:
        """Reward the envs' previous actions, count steps, and end the episodes that ended here."""
        first, last, bad = batch.step_types == FIRST, batch.step_types == LAST, batch.bad
        restarted = first | bad
        if restarted.any():
            for i in np.flatnonzero(restarted).tolist():
                self.recorder.recorders[i].abandon()
            self._acted &= ~restarted
        self._length[~first] += 1
        reward_end = np.zeros(self.num_envs, bool)
        reasons: dict[int, str] = {}
        everyone = bool(self._acted.all())
        idx = np.arange(self.num_envs) if everyone else np.flatnonzero(self._acted)
        # of the env steps this observation completes, those a person acted (the router's per-version figures)
        self._intervened = (int(np.count_nonzero(batch.interventions[idx])), int(idx.size))
        if idx.size:
            rows = slice(None) if everyone else idx  # all rows: views, no gathers

            def pick(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                return {k: v[rows] for k, v in arrays.items()}

            following = batch.following(last)
            result = self.rewards.compute(pick(self._observation), pick(self._action), pick(following),
                                          batch.rewards[rows], pick(self._previous),
                                          first_step=~self._has_previous[rows])
            self._return[rows] += result.reward
            for name, value in self._action.items():
                self._previous[name][rows] = value[rows]
            self._has_previous[rows] = True
            if result.terminate.any():
                reward_end[idx] = result.terminate & ~last[idx]
                for j in np.flatnonzero(result.terminate).tolist():
                    reasons[int(idx[j])] = f"reward:{result.ended_by(j)}"
            if self.recorder.logging:
                self._log_completed(obs, batch, idx, result, last, following, reasons)
        ended = last | reward_end
        ends = []
        for i in np.flatnonzero(ended).tolist():
            self._episodes[i] += 1
            ends.append(self._episode_ended(obs.step, episode=int(self._episodes[i]), length=int(self._length[i]),
                                            episode_return=float(self._return[i]),
                                            reason="" if last[i] else reasons.get(i, ""), env=i))
        restart = ended | first
        if restart.any():
            self._return[restart], self._length[restart], self._has_previous[restart] = 0.0, 0, False
        return ends

    def _log_completed(self, obs, batch: _Batch, idx: np.ndarray, result, last: np.ndarray,
                       following: dict[str, np.ndarray], reasons: dict[int, str]) -> None:
        for j, i in enumerate(idx.tolist()):
            ended = bool(last[i]) or bool(result.terminate[j])
            row = bridge_pb2.Observation(step=obs.step, t_sent_ns=obs.t_sent_ns, step_type=int(batch.step_types[i]),
                                         reward=float(batch.rewards[i]), terminated=bool(batch.terminated[i]),
                                         episode=int(self._episodes[i]), intervention=bool(batch.interventions[i]))
            if ended and batch.final is not None:
                row.tensors.extend(encode(name, value[i]) for name, value in following.items())
            if batch.applied is not None:
                row.applied_action.extend(encode(name, value[i]) for name, value in batch.applied.items())
            outcome = RewardOutcome.of_row(result, j, end_reason=reasons.get(i, "") if not last[i] else "")
            self.recorder.recorders[i].completed(row, outcome, ended=ended)

    async def _act(self, obs: bridge_pb2.Observation, batch: _Batch, ends: list[bridge_pb2.EpisodeEnd],
                   received: int) -> bridge_pb2.ServerMessage:
        inputs = {name: batch.observation[name] for name in self._input_names}
        if batch.bad.any():  # bad rows are inferred as zeros (one request), then replaced by the safe action
            inputs = {name: np.where(_rows(batch.bad, value), 0, value).astype(value.dtype)
                      for name, value in inputs.items()}
        timing = bridge_pb2.Timing()  # the batcher stamps its batch and Triton times into it
        started = time.time_ns()
        try:
            result = await self._inferred(self._batcher.infer_rows, inputs, timing=timing,
                                          deadline_ns=robot_deadline(obs, received))
        except InferenceFailed as exc:
            self.drop_pending()
            return self._failed(obs.step, exc, received, guard=0, interventions=self._intervened[0],
                                env_steps=self._intervened[1])
        finished = time.time_ns()
        actions = {name: result[name].astype(dtype, copy=False) for name, dtype in self._action_dtypes.items()}
        if batch.bad.any():
            actions = {name: np.where(_rows(batch.bad, value), self._safe[name], value)
                       for name, value in actions.items()}
        good = ~batch.bad
        # per-version figures and the shadow (one version per session, all rows), told after the reply
        self._tell_router((finished - received) / 1e9, error=False, guard=0,
                          inputs=None if batch.bad.any() else inputs, actions=actions, rows=True,
                          interventions=self._intervened[0], env_steps=self._intervened[1])
        self.stats.steps += int(good.sum())
        timing.t_sent_ns, timing.gateway_recv_ns, timing.infer_start_ns, timing.infer_end_ns = (
            obs.t_sent_ns, received, started, finished)
        timing.clock_offset_ns = obs.clock_offset_ns
        timing.gateway_send_ns = time.time_ns()
        action = bridge_pb2.Action(step=obs.step, tensors=[encode(name, value) for name, value in actions.items()],
                                   policy=self.policy.name, policy_version=self.policy.version, timing=timing,
                                   episode=obs.episode, episode_ends=ends, env_errors=batch.errors)
        for error in batch.errors:
            self.stats.count_error(error.code)
        self._observation, self._action, self._acted = batch.observation, actions, good
        if self.recorder.logging:
            log_prob = result.get(LOG_PROB)
            if log_prob is not None:  # the client keeps it for a Replay: the replayed transitions have it too
                log_prob = log_prob.reshape(self.num_envs, -1)[:, 0]
                action.log_prob.extend(log_prob.tolist())
            self._log_acted(obs, batch, action, actions, log_prob)
        return bridge_pb2.ServerMessage(action=action)

    def _log_acted(self, obs, batch: _Batch, action: bridge_pb2.Action, actions: dict[str, np.ndarray],
                   log_prob: np.ndarray | None) -> None:
        for i in np.flatnonzero(~batch.bad).tolist():  # a row of length 0 starts its env's episode
            row = bridge_pb2.Observation(step=obs.step, t_sent_ns=obs.t_sent_ns,
                                         step_type=FIRST if self._length[i] == 0 else MID,
                                         tensors=[encode(name, value[i]) for name, value in batch.observation.items()],
                                         episode=int(self._episodes[i]))
            act = bridge_pb2.Action(step=obs.step, tensors=[encode(name, value[i]) for name, value in actions.items()],
                                    policy=action.policy, policy_version=action.policy_version, timing=action.timing,
                                    episode=int(self._episodes[i]))
            self.recorder.recorders[i].acted(row, act, None if log_prob is None else float(log_prob[i]))


class _Batch:
    """One checked vector observation: arrays with a leading N, per-env fields, and the bad rows."""

    def __init__(self, n: int):
        self.observation: dict[str, np.ndarray] = {}
        self.final: dict[str, np.ndarray] | None = None
        self.applied: dict[str, np.ndarray] | None = None  # what each env applied last step (a person's, say)
        self.bad = np.zeros(n, bool)
        self.errors: list[bridge_pb2.EnvError] = []

    def following(self, last: np.ndarray) -> dict[str, np.ndarray]:
        """The observation each env's previous action led to: the terminal one for LAST envs."""
        if self.final is None or not last.any():
            return self.observation
        return {name: np.where(_rows(last, value), self.final[name], value) for name, value in self.observation.items()}

    def _flag(self, rows: np.ndarray, field_name: str, what: str) -> None:
        if not rows.any():
            return
        for i in np.flatnonzero(rows & ~self.bad).tolist():
            self.errors.append(bridge_pb2.EnvError(env=i, code=Code.INVALID_OBSERVATION, field=field_name,
                                                   message=f"{field_name}: env {i}: {what}"))
        self.bad |= rows

    @classmethod
    def check(cls, obs: bridge_pb2.Observation, specs: tuple[Spec, ...], n: int,
              action_specs: tuple[Spec, ...] = ()) -> _Batch:
        """`action_specs`: what `applied_action` rows are checked against (a client reporting what each env
        applied, e.g. a person's command on the env_interventions rows)."""
        batch = cls(n)
        batch.step_types = _per_env(obs.env_step_types, n, "env_step_types", np.int8, required=True)
        if batch.step_types.min() < FIRST or batch.step_types.max() > LAST:
            bad = sorted(set(batch.step_types.tolist()) - {FIRST, MID, LAST})
            raise TensorError("env_step_types", f"unknown step type(s) {bad}")
        batch.rewards = _per_env(obs.env_rewards, n, "env_rewards", np.float64)
        batch.terminated = _per_env(obs.env_terminated, n, "env_terminated", bool)
        batch.interventions = _per_env(obs.env_interventions, n, "env_interventions", bool)
        batch.observation = _decode(obs.tensors, specs, n, "observation")
        if obs.final_observation:
            batch.final = _decode(obs.final_observation, specs, n, "final_observation")
        if obs.applied_action:
            batch.applied = _decode(obs.applied_action, action_specs, n, "applied_action")
            for spec in action_specs:
                if spec.dtype.kind == "f":
                    finite = np.isfinite(batch.applied[spec.name].reshape(n, -1)).all(axis=1)
                    batch._flag(~finite, f"applied_action.{spec.name}", "contains NaN or infinite values")
        for spec in specs:
            if spec.dtype.kind == "f":
                finite = np.isfinite(batch.observation[spec.name].reshape(n, -1)).all(axis=1)
                batch._flag(~finite, spec.name, "contains NaN or infinite values")
        batch._flag(~np.isfinite(batch.rewards), "env_rewards", "non-finite reward")
        if batch.final is not None:
            last = batch.step_types == LAST
            for spec in specs:
                if spec.dtype.kind == "f":
                    finite = np.isfinite(batch.final[spec.name].reshape(n, -1)).all(axis=1)
                    batch._flag(last & ~finite, f"final_observation.{spec.name}", "contains NaN or infinite values")
        return batch


def _per_env(values, n: int, name: str, dtype, *, required: bool = False) -> np.ndarray:
    if not values and not required:
        return np.zeros(n, dtype)
    if len(values) != n:
        raise TensorError(name, f"{len(values)} values for {n} envs")
    return np.fromiter(values, dtype, count=n)


def _decode(tensors, specs: tuple[Spec, ...], n: int, what: str) -> dict[str, np.ndarray]:
    by_name = {s.name: s for s in specs}
    arrays = {}
    for t in tensors:
        if t.name in arrays:
            raise TensorError(t.name, f"{what}: sent twice")
        if (spec := by_name.get(t.name)) is not None:  # the declared dtype/shape first: no copy of a misfit's bytes
            declared = dtype_to_numpy(t.dtype)
            if declared != spec.dtype:
                raise TensorError(spec.name, f"{what}: dtype {declared.name}, expected {spec.dtype.name}")
            if tuple(t.shape) != (n, *spec.shape):
                raise TensorError(spec.name, f"{what}: shape {list(t.shape)}, expected {[n, *spec.shape]}")
        arrays[t.name] = decode(t)
    expected = {s.name for s in specs}
    for name in arrays.keys() - expected:
        raise TensorError(name, f"{what}: not in the declared spec {sorted(expected)}")
    for spec in specs:
        value = arrays.get(spec.name)
        if value is None:
            raise TensorError(spec.name, f"{what}: missing")
        if value.dtype != spec.dtype:
            raise TensorError(spec.name, f"{what}: dtype {value.dtype.name}, expected {spec.dtype.name}")
        if value.shape != (n, *spec.shape):
            raise TensorError(spec.name, f"{what}: shape {list(value.shape)}, expected {[n, *spec.shape]}")
    return arrays


def _rows(mask: np.ndarray, like: np.ndarray) -> np.ndarray:
    """(N,) mask broadcastable against an (N, ...) array."""
    return mask.reshape(-1, *([1] * (like.ndim - 1)))


def _safe_rows(specs: tuple[Spec, ...], n: int) -> dict[str, np.ndarray]:
    """Zero clipped into each spec's bounds (`Spec.safe_value`, as sim.vector.safe_action), (N, ...)."""
    return {s.name: np.broadcast_to(s.safe_value(), (n, *s.shape)).copy() for s in specs}
