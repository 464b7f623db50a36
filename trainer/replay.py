"""The off-policy learner's replay: ring buffers of numpy rows, RLPD-style symmetric sampling, and the
adder that turns logged `tether.v1.Transition`s into (s, a, r, s', done) rows.

Two buffers: `online` holds what the served policy acted (the live `Experience.Subscribe` stream);
`offline` holds the seed data (previous runs' logs, `--seed-log`), demonstrations (`--demos`) and
every transition where a person acted (`Transition.intervention`). A batch takes half its rows from
each (RLPD's symmetric sampling), all from one while the other is empty. Demonstrations and
interventions are learned on the action that was applied (`applied_action`: the person's); the
policy's own transitions on the action it sampled (`action`, before the actuator clipped it: the
actor is the served unsquashed Gaussian, so Q is learned over that same action space and the clip is
part of the environment).

    >>> import numpy as np
    >>> from protos import codec, experience_pb2
    >>> replay = MixedReplay(capacity=100, observation_size=2, action_size=1)
    >>> adder = ReplayAdder(replay, observation="observation", action="action")
    >>> def tr(step, *, person=False, **kw):
    ...     return experience_pb2.Transition(session="s", episode=0, step=step, reward=1.0, intervention=person,
    ...         observation=[codec.encode("observation", np.full(2, step, np.float32))],
    ...         action=[codec.encode("action", np.full(1, 5.0, np.float32))],
    ...         applied_action=[codec.encode("action", np.full(1, 3.0, np.float32))], **kw)
    >>> for t in (tr(0), tr(1, person=True), tr(2, terminated=True)):
    ...     adder.add(t)
    >>> len(replay.online), len(replay.offline)     # the person's step went to the demo half
    (2, 1)
    >>> replay.offline.action[:1].tolist(), replay.online.action[:2].ravel().tolist()
    ([[3.0]], [5.0, 5.0])
    >>> batch = replay.sample(4, np.random.default_rng(0))
    >>> batch["observation"].shape, int(batch["from_offline"].sum())
    ((4, 2), 2)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from protos import codec, experience_pb2

__all__ = ["MixedReplay", "ReplayAdder", "ReplayBuffer"]

_FIRST, _MID = 1, 2  # tether.v1.StepType
_FIELDS = ("observation", "action", "reward", "next_observation", "done")


class ReplayBuffer:
    """A fixed-capacity ring of (observation, action, reward, next_observation, done) rows, float32.

    >>> b = ReplayBuffer(capacity=3, observation_size=1, action_size=1)
    >>> for i in range(5):
    ...     b.add([i], [0], 1.0, [i + 1], False)
    >>> len(b), b.added, sorted(b.observation[:len(b)].ravel().tolist())   # the oldest two were overwritten
    (3, 5, [2.0, 3.0, 4.0])
    """

    def __init__(self, *, capacity: int, observation_size: int, action_size: int):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        if observation_size < 1 or action_size < 1:
            raise ValueError(f"observation_size ({observation_size}) and action_size ({action_size}) must be >= 1")
        self.capacity = capacity
        self.observation = np.zeros((capacity, observation_size), np.float32)
        self.action = np.zeros((capacity, action_size), np.float32)
        self.reward = np.zeros(capacity, np.float32)
        self.next_observation = np.zeros((capacity, observation_size), np.float32)
        self.done = np.zeros(capacity, np.float32)
        self.added = 0  # rows ever added (the next row goes to added % capacity)

    def __len__(self) -> int:
        return min(self.added, self.capacity)

    def add(self, observation, action, reward: float, next_observation, done: bool) -> None:
        i = self.added % self.capacity
        self.observation[i] = observation
        self.action[i] = action
        self.reward[i] = reward
        self.next_observation[i] = next_observation
        self.done[i] = float(done)
        self.added += 1

    def sample(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """`n` rows drawn uniformly with replacement."""
        if len(self) == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        idx = rng.integers(0, len(self), size=n)
        return {name: getattr(self, name)[idx] for name in _FIELDS}


class MixedReplay:
    """The online and the offline (seeds, demonstrations, interventions) buffers, sampled symmetrically."""

    def __init__(self, *, capacity: int, observation_size: int, action_size: int, offline_capacity: int | None = None):
        self.online = ReplayBuffer(capacity=capacity, observation_size=observation_size, action_size=action_size)
        self.offline = ReplayBuffer(capacity=offline_capacity or capacity, observation_size=observation_size,
                                    action_size=action_size)

    def __len__(self) -> int:
        return len(self.online) + len(self.offline)

    def sample(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """`n` rows: n // 2 online and the rest offline when both hold data, else all from the one that does.
        `from_offline` marks the offline rows."""
        if n < 1:
            raise ValueError(f"batch size must be >= 1, got {n}")
        if len(self.online) and len(self.offline):
            counts = (n // 2, n - n // 2)
        elif len(self.online) or len(self.offline):
            counts = (n, 0) if len(self.online) else (0, n)
        else:
            raise ValueError("cannot sample: both replay buffers are empty")
        parts = [buf.sample(k, rng) for buf, k in zip((self.online, self.offline), counts, strict=True) if k]
        batch = {name: np.concatenate([p[name] for p in parts]) for name in _FIELDS}
        batch["from_offline"] = np.concatenate([np.zeros(counts[0], bool), np.ones(counts[1], bool)])
        return batch


@dataclass
class _Held:
    t: experience_pb2.Transition
    offline: bool
    action: np.ndarray


@dataclass
class _Returns:
    episode: int = -1
    total: float = 0.0
    from_first: bool = False
    done: list[float] = field(default_factory=list)


class ReplayAdder:
    """Logged transitions (in log order) -> rows of a `MixedReplay` (Acme's adder role).

    A step becomes a row once its successor is known: the next step of the same session and episode
    gives s'; an episode's last step carries its own `next_observation` (s' of a truncation; a
    termination needs none, done = 1). A step whose successor never comes (a gap) is dropped.
    `offline=True` (seed logs) sends every row to the offline half; `demos=True` also learns every row
    on `applied_action`. Interventions always go offline, on `applied_action`.
    """

    def __init__(self, replay: MixedReplay, *, observation: str, action: str, offline: bool = False,
                 demos: bool = False):
        self.replay, self.observation, self.action = replay, observation, action
        self.offline, self.demos = offline or demos, demos
        self._held: dict[str, _Held] = {}
        self._returns: dict[str, _Returns] = {}
        self.rows = 0            # rows added by this adder
        self.interventions = 0   # of them, a person's
        self.dropped = 0         # steps without a successor

    def add(self, t: experience_pb2.Transition) -> None:
        person = t.intervention or self.demos
        action = _one(t.applied_action if person and t.applied_action else t.action, self.action)
        self._track_return(t)
        held = self._held.pop(t.session, None)
        if held is not None:
            h = held.t
            if t.step == h.step + 1 and (t.episode == h.episode or t.step_type == _MID):
                self._row(held, _one(t.observation, self.observation), done=False)
            else:
                self.dropped += 1
        item = _Held(t, self.offline or t.intervention, action)
        if t.terminated:
            nxt = _one(t.next_observation, self.observation) if t.next_observation else None
            self._row(item, nxt, done=True)
        elif t.truncated:
            if t.next_observation:
                self._row(item, _one(t.next_observation, self.observation), done=False)
            else:
                self.dropped += 1
        else:
            self._held[t.session] = item

    def take_episode_returns(self) -> list[float]:
        """Returns of the episodes completed (seen from their first step) since the last call."""
        out = [r for s in self._returns.values() for r in s.done]
        for s in self._returns.values():
            s.done = []
        return out

    def _row(self, held: _Held, next_observation: np.ndarray | None, *, done: bool) -> None:
        obs = _one(held.t.observation, self.observation)
        buffer = self.replay.offline if held.offline else self.replay.online
        buffer.add(obs, held.action, held.t.reward, obs if next_observation is None else next_observation, done)
        self.rows += 1
        self.interventions += int(held.t.intervention)

    def _track_return(self, t: experience_pb2.Transition) -> None:
        s = self._returns.setdefault(t.session, _Returns())
        if t.episode != s.episode:
            s.episode, s.total, s.from_first = t.episode, 0.0, t.step_type == _FIRST or t.step == 0
        s.total += t.reward
        if (t.terminated or t.truncated) and s.from_first:
            s.done.append(s.total)
            s.from_first = False


def _one(tensors, name: str) -> np.ndarray:
    for x in tensors:
        if x.name == name:
            return codec.decode(x).reshape(-1).astype(np.float32, copy=False)
    raise codec.TensorError(name, f"missing from a transition (it has {[x.name for x in tensors]})")
