"""Which logged transitions an export takes, and the log's episodes one at a time.

    sel = Selection(policy="hopper_v5", min_version=3, interventions_only=True)
    for ep in logged_episodes("runs/demo/experience", sel):
        ep.transitions, ep.complete          # one env episode of one session, in step order

`tether log export` and the format writers (npz, bridge.experience.lerobot, bridge.experience.foxglove)
share it; `add_selection_flags(parser)` gives them the same flags, `selection_from_args(args)` reads them.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bridge.experience.reader import read_transitions
from protos import experience_pb2
from protos.codec import TRANSITION_TENSORS, transition_problem

__all__ = ["LoggedEpisode", "Selection", "Skips", "add_selection_flags", "logged_episodes", "selection_from_args"]


@dataclass(frozen=True)
class Selection:
    """Filters: `policy` by name; versions in [min_version, max_version]; the gateway's receive time in
    [since_ns, until_ns) (wall clock, ns); `interventions_only` keeps whole episodes in which a person acted;
    `complete_only` keeps episodes that ended (terminated or truncated). None: no bound."""

    policy: str | None = None
    min_version: int | None = None
    max_version: int | None = None
    since_ns: int | None = None
    until_ns: int | None = None
    interventions_only: bool = False
    complete_only: bool = False

    def __post_init__(self):
        if None not in (self.min_version, self.max_version) and self.min_version > self.max_version:
            raise ValueError(f"versions {self.min_version}:{self.max_version}: the first is past the last")
        if None not in (self.since_ns, self.until_ns) and self.since_ns >= self.until_ns:
            raise ValueError("--since must come before --until")

    def admits(self, t: experience_pb2.Transition) -> bool:
        """The per-transition filters: policy, version range, time range."""
        v, when = t.policy_version, t.timing.gateway_recv_ns
        return ((self.policy is None or t.policy == self.policy)
                and (self.min_version is None or v >= self.min_version)
                and (self.max_version is None or v <= self.max_version)
                and (self.since_ns is None or when >= self.since_ns)
                and (self.until_ns is None or when < self.until_ns))

    def keeps(self, episode: LoggedEpisode) -> bool:
        """The per-episode filters: complete only, interventions only."""
        return ((not self.complete_only or episode.complete)
                and (not self.interventions_only or any(t.intervention for t in episode.transitions)))


@dataclass
class LoggedEpisode:
    """One env episode of one session as logged: `transitions` in step order, `complete` if it ended."""

    index: int                       # 0, 1, ... among the episodes kept, in the order they were finished
    session: str
    episode: int
    transitions: list[experience_pb2.Transition] = field(default_factory=list)
    complete: bool = False

    @property
    def terminated(self) -> bool:
        return bool(self.transitions) and self.transitions[-1].terminated

    @property
    def truncated(self) -> bool:
        return bool(self.transitions) and self.transitions[-1].truncated


class Skips:
    """Unusable records: counted, the first one named (`first = {"offset", "problem"}`)."""

    def __init__(self):
        self.count, self.first = 0, None
        self._shapes: dict[str, tuple[int, tuple[int, ...]]] = {}

    def record(self, offset: int, why: str) -> None:
        self.count += 1
        if self.first is None or offset < self.first["offset"]:  # the reader reports ahead of what it yields
            self.first = {"offset": offset, "problem": why}

    def usable(self, t: experience_pb2.Transition) -> bool:
        """Whether `t` can be used (else it is recorded): decodes, finite, shaped as the earlier ones."""
        problem = transition_problem(t)
        for group in TRANSITION_TENSORS if problem is None else ():
            for x in getattr(t, group):
                seen = self._shapes.setdefault(f"{group}.{x.name}", (x.dtype, tuple(x.shape)))
                if seen != (x.dtype, tuple(x.shape)) and problem is None:
                    problem = f"{group}.{x.name}: shape {list(x.shape)}, earlier transitions {list(seen[1])}"
        if problem is not None:
            self.record(t.offset, problem)
        return problem is None


def logged_episodes(log_dir: str | Path, selection: Selection = Selection(), skips: Skips | None = None,
                    ) -> Iterator[LoggedEpisode]:
    """The episodes of the log at `log_dir` that `selection` keeps, each as soon as it ends (a session's next
    episode also ends its last); those still open at the log's end last, `complete=False`. Unusable records
    are counted in `skips` and left out. Holds only the open episodes in memory."""
    skips = skips if skips is not None else Skips()
    open_eps: dict[tuple[str, int], LoggedEpisode] = {}
    kept = 0

    def finish(ep: LoggedEpisode, complete: bool) -> Iterator[LoggedEpisode]:
        nonlocal kept
        ep.complete = complete
        if ep.transitions and selection.keeps(ep):
            ep.index, kept = kept, kept + 1
            yield ep

    for t in read_transitions(log_dir, on_skip=skips.record):
        if not skips.usable(t) or not selection.admits(t):
            continue
        key = (t.session, t.episode)
        if key not in open_eps:
            for other in [k for k in open_eps if k[0] == t.session]:
                yield from finish(open_eps.pop(other), complete=False)
            open_eps[key] = LoggedEpisode(0, t.session, t.episode)
        open_eps[key].transitions.append(t)
        if t.terminated or t.truncated:
            yield from finish(open_eps.pop(key), complete=True)
    for ep in list(open_eps.values()):
        yield from finish(ep, complete=False)


def _time_ns(text: str) -> int:
    """Unix seconds (`1764720000.5`) or ISO 8601 (`2026-12-03T02:00:00Z`; no zone: UTC) -> ns."""
    try:
        return int(float(text) * 1e9)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither unix seconds nor an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1e9)


def _versions(text: str) -> tuple[int | None, int | None]:
    """`7` (that version), `3:7`, `3:` or `:7` (inclusive; an open end is unbounded)."""
    lo, sep, hi = text.partition(":")
    try:
        first = int(lo) if lo else None
        last = (int(hi) if hi else None) if sep else first
    except ValueError:
        raise argparse.ArgumentTypeError(f"versions {text!r}: expected N, A:B, A: or :B") from None
    return first, last


def add_selection_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to take (default: everything usable)")
    g.add_argument("--policy", default=None, help="only this policy's transitions")
    g.add_argument("--versions", type=_versions, default=(None, None), metavar="A:B",
                   help="only these policy versions (inclusive; N, A:B, A: or :B)")
    g.add_argument("--since", type=_time_ns, default=None, metavar="TIME",
                   help="only steps the gateway received at or after TIME (unix seconds or ISO 8601, UTC)")
    g.add_argument("--until", type=_time_ns, default=None, metavar="TIME", help="only steps received before TIME")
    g.add_argument("--interventions-only", action="store_true",
                   help="only episodes in which a person acted (whole episodes)")
    g.add_argument("--complete-only", action="store_true", help="only episodes that ended (terminated/truncated)")


def selection_from_args(a: argparse.Namespace) -> Selection:
    return Selection(policy=a.policy, min_version=a.versions[0], max_version=a.versions[1], since_ns=a.since,
                     until_ns=a.until, interventions_only=a.interventions_only, complete_only=a.complete_only)
