"""Transitions -> per-session trajectory segments, GAE, and policy-lag figures.

A session's newest transition is held until its successor arrives: the successor's observation
is what a segment cut at a batch boundary bootstraps from. At an episode end the transition's
own `next_observation` is the bootstrap (truncated) or there is none (terminated).

    >>> from protos import codec, experience_pb2
    >>> def tr(step, **kw):
    ...     return experience_pb2.Transition(session="s", episode=0, step=step, reward=1.0,
    ...         observation=[codec.encode("observation", np.full(2, step, np.float32))], **kw)
    >>> asm = TrajectoryAssembler()
    >>> for step in range(3):
    ...     asm.add(tr(step))
    >>> [(len(s), s.bootstrap_observation["observation"].tolist(), s.terminated) for s in asm.take()]
    [(2, [2.0, 2.0], False)]
    >>> asm.add(tr(3, terminated=True))
    >>> [(len(s), s.transitions[0].step, s.terminated) for s in asm.take()]
    [(2, 2, True)]
    >>> advantages, returns = gae(np.array([1.0, 1.0]), np.array([0.5, 0.5]), 0.0, gamma=0.9, lam=1.0)
    >>> returns.round(2).tolist()
    [1.9, 1.0]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from protos import codec, experience_pb2

__all__ = ["LagStats", "Segment", "TrajectoryAssembler", "gae", "lag_stats", "policy_lag"]


@dataclass
class Segment:
    """Consecutive transitions of one session within one episode.

    `terminated`: the last transition ended the MDP (bootstrap value 0). Otherwise the value
    of `bootstrap_observation` (the episode's `next_observation` when truncated, else the
    successor's observation) continues the return.
    """

    session: str
    transitions: list[experience_pb2.Transition]
    terminated: bool = False
    truncated: bool = False
    bootstrap_observation: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.transitions)


@dataclass
class _Session:
    steps: list[experience_pb2.Transition] = field(default_factory=list)
    held: experience_pb2.Transition | None = None
    last: tuple[int, int] = (-1, -1)  # (episode, step) of the newest transition seen
    last_step: int = -1  # the highest step seen: a step above it is new even where the episode count went down (a
    # vectorised session's env counts its episodes from 0 again on a new gateway)
    episode: int = -1
    episode_return: float = 0.0
    episode_length: int = 0
    saw_first: bool = False


class TrajectoryAssembler:
    """Feed transitions in log order (`add`); `take` the segments ready for an update.

    A vectorised session's env i is its own session here (`"<id>/<i>"`: per-env trajectories). Also keeps the
    undiscounted return of every episode seen from its FIRST step to its end
    (`take_episode_returns`). A gap in a session's steps (lost or filtered transitions) closes its
    segment at the last transition whose successor is known.
    """

    def __init__(self):
        self._sessions: dict[str, _Session] = {}
        self._closed: list[Segment] = []
        self._returns: list[tuple[float, int]] = []
        self.ready = 0  # transitions whose successor (or episode end) is known

    def add(self, t: experience_pb2.Transition) -> None:
        s = self._sessions.setdefault(t.session, _Session())
        if (t.episode, t.step) <= s.last and t.step <= s.last_step:
            return  # a duplicate or an out-of-order repeat
        s.last, s.last_step = (t.episode, t.step), max(s.last_step, t.step)
        self._track_return(s, t)
        if s.held is not None:
            h, s.held = s.held, None
            # its successor: the next step of the same episode (a MID step continues it even where the episode
            # count differs: a vectorised session's env after its gateway changed counts from 0 again)
            if t.step == h.step + 1 and (t.episode == h.episode or t.step_type == 2):  # tether.v1.MID
                s.steps.append(h)
                self.ready += 1
            else:  # h's successor is missing: h cannot be bootstrapped, close what precedes it
                self._close(t.session, s, bootstrap=h.observation)
        if t.terminated or t.truncated:
            s.steps.append(t)
            self.ready += 1
            self._close(t.session, s, bootstrap=None if t.terminated else t.next_observation,
                        terminated=t.terminated, truncated=not t.terminated)
        else:
            s.held = t

    def extend(self, transitions: Iterable[experience_pb2.Transition]) -> None:
        for t in transitions:
            self.add(t)

    def take(self) -> list[Segment]:
        """Every ready segment; sessions keep their held transition for the next batch."""
        for name, s in self._sessions.items():
            if s.steps:
                assert s.held is not None  # a ready step's successor is held or ended the episode
                self._close(name, s, bootstrap=s.held.observation)
        out, self._closed, self.ready = self._closed, [], 0
        return out

    def take_episode_returns(self) -> list[tuple[float, int]]:
        """(return, length) of the episodes completed since the last call."""
        out, self._returns = self._returns, []
        return out

    def _close(self, name: str, s: _Session, *, bootstrap, terminated: bool = False,
               truncated: bool = False) -> None:
        if not s.steps:
            return
        obs = codec.decode_all(bootstrap) if bootstrap else None
        if obs is None and not terminated:  # nothing to bootstrap from: drop the segment's steps
            self.ready -= len(s.steps)
            s.steps = []
            return
        self._closed.append(Segment(name, s.steps, terminated=terminated, truncated=truncated,
                                    bootstrap_observation=obs))
        s.steps = []

    def _track_return(self, s: _Session, t: experience_pb2.Transition) -> None:
        if t.episode != s.episode:
            s.episode, s.episode_return, s.episode_length = t.episode, 0.0, 0
            s.saw_first = t.step_type == 1 or t.step == 0  # tether.v1.FIRST
        s.episode_return += t.reward
        s.episode_length += 1
        if (t.terminated or t.truncated) and s.saw_first:
            self._returns.append((s.episode_return, s.episode_length))
            s.saw_first = False


def gae(rewards: np.ndarray, values: np.ndarray, bootstrap_value: float, *, gamma: float,
        lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimates and value targets for one segment.

    `values[i]` = V(obs_i); `bootstrap_value` = V(the observation after the last step), 0 when
    the episode terminated there.
    """
    n = len(rewards)
    if len(values) != n:
        raise ValueError(f"{len(values)} values for {n} rewards")
    advantages = np.zeros(n, np.float64)
    next_value, running = float(bootstrap_value), 0.0
    for i in range(n - 1, -1, -1):
        delta = rewards[i] + gamma * next_value - values[i]
        running = delta + gamma * lam * running
        advantages[i] = running
        next_value = values[i]
    return advantages, advantages + values


@dataclass(frozen=True)
class LagStats:
    """How far behind the trainer's newest version the data of one batch was."""

    versions_mean: float
    versions_max: int
    seconds_mean: float
    seconds_max: float
    stale: int           # transitions past the allowed version lag

    def line(self) -> str:
        return (f"lag {self.versions_mean:.2f}v (max {self.versions_max}) {self.seconds_mean:.2f}s "
                f"(max {self.seconds_max:.2f}s) stale {self.stale}")


def policy_lag(transitions: Sequence[experience_pb2.Transition], *, newest_version: int,
               newest_publish_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """(versions behind, seconds behind) per transition.

    Seconds behind: for a transition acted by an older version, how long before the newest
    version's publish time it was acted (publish time - gateway receive time, at least 0). An
    old version still acting after the publish (a session waiting for its episode boundary)
    shows in the versions behind, not in the seconds.
    """
    versions = np.array([t.policy_version for t in transitions], np.int64)
    behind = np.maximum(newest_version - versions, 0)
    stamps = np.array([t.timing.gateway_recv_ns or t.timing.t_sent_ns for t in transitions], np.int64)
    seconds = np.where((behind > 0) & (newest_publish_ns > 0) & (stamps > 0), (newest_publish_ns - stamps) / 1e9, 0.0)
    return behind, np.maximum(seconds, 0.0)


def lag_stats(behind: np.ndarray, seconds: np.ndarray, *, max_version_lag: int) -> LagStats:
    """The batch's figures over all ranks (a collective when a process group exists)."""
    import torch

    from trainer import dist

    sums = dist.all_reduce_sum(torch.tensor([float(len(behind)), float(behind.sum()), float(seconds.sum()),
                                             float((behind > max_version_lag).sum())], dtype=torch.float64))
    maxima = dist.all_reduce_max(torch.tensor([float(behind.max(initial=0)), float(seconds.max(initial=0.0))],
                                              dtype=torch.float64))
    n = max(float(sums[0]), 1.0)
    return LagStats(versions_mean=float(sums[1]) / n, versions_max=int(maxima[0]), seconds_mean=float(sums[2]) / n,
                    seconds_max=float(maxima[1]), stale=int(sums[3]))
