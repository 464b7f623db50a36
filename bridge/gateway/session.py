"""One connected robot or simulated env: its specs, its step order, its episodes.

`Session.handle(observation)` turns one observation into exactly one reply: an `Action`, a
`StepError` (the session goes on), or an `EpisodeEnd` for a LAST step.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

import numpy as np

from bridge.gateway.batcher import MicroBatcher
from bridge.gateway.policies import ServedPolicy
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


class Session:
    def __init__(self, *, session_id: str, source: str, policy: ServedPolicy,
                 observation_spec: tuple[Spec, ...], action_spec: tuple[Spec, ...],
                 batcher: MicroBatcher, deadline_s: float):
        self.id = session_id
        self.source = source
        self.policy = policy
        self.observation_spec = observation_spec
        self.action_spec = action_spec
        self._batcher = batcher
        self._deadline_s = deadline_s
        self._last_step: int | None = None
        self._episode_return = 0.0
        self._episode_length = 0
        self._outputs = tuple(s.name for s in policy.outputs)
        self._input_names = tuple(s.name for s in policy.inputs)
        self._action_dtypes = {s.name: s.dtype for s in action_spec}
        self.stats = SessionStats()

    async def handle(self, obs: bridge_pb2.Observation) -> bridge_pb2.ServerMessage:
        received = time.time_ns()
        if self._last_step is not None and obs.step <= self._last_step:
            return self._error(obs.step, Code.OUT_OF_ORDER, "step",
                               f"step {obs.step} after step {self._last_step}")
        self._last_step = obs.step
        try:
            arrays = check_all(self.observation_spec, obs.tensors)
            if not math.isfinite(obs.reward):
                raise TensorError("reward", f"non-finite reward {obs.reward}")
        except TensorError as exc:
            return self._error(obs.step, Code.INVALID_OBSERVATION, exc.field, str(exc))
        self._track_episode(obs)
        if obs.HasField("guard"):
            self.stats.guard = obs.guard
        if obs.step_type == bridge_pb2.LAST:
            return self._end_episode(obs.step)
        return await self._act(obs, arrays, received)

    def _track_episode(self, obs: bridge_pb2.Observation) -> None:
        if obs.step_type == bridge_pb2.FIRST:
            self._episode_return, self._episode_length = 0.0, 0
        else:
            self._episode_return += obs.reward
            self._episode_length += 1

    def _end_episode(self, step: int) -> bridge_pb2.ServerMessage:
        self.stats.episodes += 1
        end = bridge_pb2.EpisodeEnd(step=step, episode=self.stats.episodes, length=self._episode_length,
                                    episode_return=self._episode_return)
        return bridge_pb2.ServerMessage(episode_end=end)

    async def _act(self, obs: bridge_pb2.Observation, arrays: dict[str, np.ndarray],
                   received: int) -> bridge_pb2.ServerMessage:
        inputs = {name: arrays[name] for name in self._input_names}
        started = time.time_ns()
        try:
            async with asyncio.timeout(self._deadline_s):
                result = await self._batcher.infer(self.policy.name, self.policy.version, inputs,
                                                   outputs=self._outputs)
        except TimeoutError:
            return self._error(obs.step, Code.DEADLINE_EXCEEDED, "",
                               f"no action within the {self._deadline_s * 1e3:.0f} ms deadline")
        except Exception as exc:
            return self._error(obs.step, Code.INFERENCE_FAILED, "",
                               f"policy {self.policy.name!r} v{self.policy.version}: {exc}")
        finished = time.time_ns()
        tensors = [encode(name, result[name].astype(self._action_dtypes[name], copy=False))
                   for name in self._outputs]
        self.stats.steps += 1
        timing = bridge_pb2.Timing(t_sent_ns=obs.t_sent_ns, gateway_recv_ns=received,
                                   infer_start_ns=started, infer_end_ns=finished,
                                   gateway_send_ns=time.time_ns())
        action = bridge_pb2.Action(step=obs.step, tensors=tensors, policy=self.policy.name,
                                   policy_version=self.policy.version, timing=timing)
        return bridge_pb2.ServerMessage(action=action)

    def _error(self, step: int, code: int, field_name: str, message: str) -> bridge_pb2.ServerMessage:
        self.stats.count_error(code)
        err = bridge_pb2.StepError(step=step, code=code, field=field_name, message=message)
        return bridge_pb2.ServerMessage(error=err)
