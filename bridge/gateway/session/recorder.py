"""Turns one session's steps into logged transitions (the Acme "adder" of the gateway).

A transition is RLDS-shaped: the observation of step t, the action answered to it, and what the
next observation brought (the reward for that action, terminated/truncated, the action the edge
reports it really applied). So step t is recorded when step t+1 arrives:

    recorder = Recorder(session="s1", source="sim", log=log, reward_version=fn.version)
    recorder.acted(obs_t, action_t, log_prob)       # after answering step t
    recorder.completed(obs_t1, result, ended=False)  # step t+1 arrived: t is complete
    recorder.flush()                                 # build and append (after the reply went out)
    recorder.durable_through                         # steps < this are on disk (fsynced)
    recorder.next_step                               # the lowest step the log takes next for it

`flush` does the copying (tensor bytes into a `Transition`) off the reply's critical path; the log
acknowledges a transition once it is fsynced. `durable_through` is the log's fsynced step of the
session + 1, never what is only appended: a step the log already had (a Replay after a reconnect,
answered `duplicate`) counts once the log's copy is fsynced, not when it is refused as a duplicate.

A log that cannot take a transition never ends the session: at the log's bound (`LogFull`) the
transition is not logged (the log refuses the session's later ones too, until it connects again:
`durable_through` stays below the refused step, so the client keeps it for Replay); a log that is
not running (`LogError`) is counted in `failed`. Both are logged once per recorder.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Protocol

from bridge.experience.log import Fenced, LogError, LogFull
from protos import bridge_pb2, experience_pb2

log = logging.getLogger("tether.gateway")


class ExperienceSink(Protocol):
    """What the recorder needs from the experience log (bridge.experience.ExperienceLog fits)."""

    def append(self, transition: experience_pb2.Transition) -> asyncio.Future | None: ...

    def last_step(self, session: str) -> int | None: ...

    def durable_step(self, session: str) -> int | None: ...

    def resume(self, session: str) -> None: ...


@dataclass(frozen=True)
class RewardOutcome:
    """The gateway's reward for one action: the total, each term, and whether a term ended the episode."""

    reward: float
    terms: Mapping[str, float]
    end_reason: str = ""

    @classmethod
    def of_row(cls, result, row: int, *, end_reason: str = "") -> RewardOutcome:
        """Row `row` of a batch's `RewardResult` (bridge.rewards): single-env and vectorised sessions alike."""
        return cls(float(result.reward[row]), {name: float(value[row]) for name, value in result.terms.items()},
                   end_reason)


@dataclass
class _Acted:
    observation: bridge_pb2.Observation
    action: bridge_pb2.Action
    log_prob: float | None


class Recorder:
    def __init__(self, *, session: str, source: str, log: ExperienceSink | None, reward_version: str):
        self.session, self.source, self.reward_version = session, source, reward_version
        self._log = log
        self.pending: _Acted | None = None
        self._ready: list[experience_pb2.Transition] = []
        self.duplicates = 0
        self.failed = 0      # the log was not running (LogError), or lost the transition
        self.refused = 0     # not logged: the log was full (LogFull)
        self.epoch = 0       # the gateway's ownership claim on the session (Transition.owner_epoch; 0: none)
        self.fenced = 0      # not acknowledged or dropped: another gateway owns the session now
        if log is not None:
            log.resume(session)  # a new connection: its client replays what a refusal left out

    @property
    def durable_through(self) -> int:
        """Steps of this session below this are on disk (fsynced): the log's durable step + 1."""
        if self._log is None:
            return 0
        step = self._log.durable_step(self.session)
        return 0 if step is None else step + 1

    @property
    def next_step(self) -> int:
        """The lowest step the log will take for this session: its last appended step + 1 (0 if none)."""
        step = self._log.last_step(self.session) if self._log is not None else None
        return 0 if step is None else step + 1

    @property
    def logging(self) -> bool:
        return self._log is not None

    def acted(self, observation: bridge_pb2.Observation, action: bridge_pb2.Action,
              log_prob: float | None) -> None:
        self.pending = _Acted(observation, action, log_prob)

    def abandon(self) -> None:
        """The pending step will get no successor (a new episode began without a LAST)."""
        self.pending = None

    def fence(self) -> None:
        """Detach from the log for good (a new connection of this session took over): nothing pending or
        built but not appended is appended, and nothing later is (`logging` is False from now on)."""
        self.fenced += len(self._ready) + (self.pending is not None)  # dropped: never appended
        self._log, self.pending, self._ready = None, None, []

    def take(self) -> _Acted | None:
        """The pending step, now no longer pending (for `complete` later: a session settling a reward after
        the reply went out)."""
        acted, self.pending = self.pending, None
        return acted

    def completed(self, following: bridge_pb2.Observation, outcome: RewardOutcome, *, ended: bool) -> None:
        """`following` answered the pending step: its reward, applied action, and, when the episode
        `ended` there, whether by termination (MDP end) or truncation."""
        self.complete(self.take(), following, outcome, ended=ended)

    def complete(self, acted: _Acted | None, following: bridge_pb2.Observation, outcome: RewardOutcome, *,
                 ended: bool) -> None:
        """`completed` for a step taken with `take` before."""
        if acted is None or self._log is None:
            return
        obs, action = acted.observation, acted.action
        terminated = ended and (following.terminated or bool(outcome.end_reason))
        t = experience_pb2.Transition(
            session=self.session, episode=obs.episode, step=obs.step, step_type=obs.step_type,
            reward=outcome.reward, reward_terms=outcome.terms, terminated=terminated,
            truncated=ended and not terminated, policy=action.policy, policy_version=action.policy_version,
            reward_version=self.reward_version, timing=action.timing, source=self.source,
            env_reward=following.reward, owner_epoch=self.epoch, intervention=following.intervention)
        t.observation.extend(obs.tensors)
        t.action.extend(action.tensors)
        t.applied_action.extend(following.applied_action or action.tensors)  # sims step what they got
        if following.HasField("guard"):
            t.guard.CopyFrom(following.guard)
        if ended:
            t.next_observation.extend(following.tensors)
        if acted.log_prob is not None:
            t.has_log_prob, t.log_prob = True, acted.log_prob
        self._ready.append(t)

    def flush(self) -> None:
        """Append what `completed` built; called after the reply is on its way."""
        ready, self._ready = self._ready, []
        for t in ready:
            try:
                future = self._log.append(t)
            except LogFull as exc:
                self.refused += 1
                if self.refused == 1:
                    log.warning("session %s: %s", self.session, exc)
                continue
            except LogError as exc:
                self.failed += 1
                if self.failed == 1:
                    log.error("session %s: step %d was not logged: %s", self.session, t.step, exc)
                continue
            if future is None:
                self.duplicates += 1   # the log has it; durable_through counts it once the log's copy is fsynced
            else:
                future.add_done_callback(lambda f, step=t.step: self._acked(f, step))

    def _acked(self, future: asyncio.Future, step: int) -> None:
        if not future.cancelled() and isinstance(future.exception(), Fenced):
            self.fenced += 1
            return
        if future.cancelled() or future.exception() is not None:
            self.failed += 1
            if self.failed == 1:  # once per recorder (a log closed under a disk fault fails them all)
                log.error("session %s: step %d was not logged: %s", self.session, step,
                          "cancelled" if future.cancelled() else future.exception())


class RecorderGroup:
    """The recorders of a vectorised session's envs, one per env, logged as sessions "<id>/<i>".

    It answers what the servicer asks of a session's recorder: `logging`, `flush()`, `abandon()`, and
    `durable_through` (the lowest over the envs: every env's steps below it are on disk).
    """

    def __init__(self, *, session: str, source: str, log: ExperienceSink | None, reward_version: str, num_envs: int):
        self.recorders = [Recorder(session=f"{session}/{i}", source=source, log=log, reward_version=reward_version)
                          for i in range(num_envs)]
        self._log = log
        self._keys = [r.session for r in self.recorders]
        self._steps = getattr(log, "durable_steps", None)  # a live mapping: one C-level pass per reply

    @property
    def logging(self) -> bool:
        return self._log is not None

    @property
    def durable_through(self) -> int:
        if self._steps is None:
            return min(r.durable_through for r in self.recorders)
        return min(map(self._steps.get, self._keys, repeat(-1, len(self._keys)))) + 1

    @property
    def next_step(self) -> int:
        """The vector session's step after the newest any env has logged (0 if none)."""
        return max(r.next_step for r in self.recorders)

    def abandon(self) -> None:
        """No env's pending step gets a successor (an e-stop holds the session, or its inference failed)."""
        for r in self.recorders:
            r.pending = None

    @property
    def epoch(self) -> int:
        return self.recorders[0].epoch if self.recorders else 0

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        for r in self.recorders:
            r.epoch = epoch

    @property
    def fenced(self) -> int:
        return sum(r.fenced for r in self.recorders)

    def fence(self) -> None:
        """Every env's `Recorder.fence`."""
        self._log = None
        for r in self.recorders:
            r.fence()

    def flush(self) -> None:
        for r in self.recorders:
            if r._ready:
                r.flush()
