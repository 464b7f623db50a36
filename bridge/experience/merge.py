"""Several gateways' logs as one: per (session, step) the record of the newest ownership epoch.

    merged = merge_logs(["runs/gw-a/experience", "runs/gw-b/experience"])
    for t in merged.transitions:          # sorted by (session, step); each (session, step) once
        ...
    merged.stale, merged.duplicates       # records dropped, and why (counts); merged.per_log: records read per log

Each gateway stamps what it logs with its claim's epoch (`Transition.owner_epoch`, bridge.registry.ownership);
a session that moved from gateway A (epoch 1) to B (epoch 2) may have records of the same steps in both
logs: what A wrote but had not acknowledged when the client moved (the client replays those to B), and what
A wrote late, cut off from the client but not from its disk (fenced: never acknowledged). The rule, per
session: the first step an epoch logged is where its owner took the session over, so a record of epoch e
is dropped when a newer epoch e' > e logged a step at or before it (`stale`: e's owner was no longer the
owner from there on, whether or not e' logged that very step); of the records left, one per step is kept,
the newest epoch's (`duplicates`: the same step and epoch twice, which only logs without ownership,
epoch 0, can have).

Why nothing acknowledged is lost: a gateway acknowledges a step only after ownership confirmed its epoch
current (bridge.experience.log), so every step a client saw acknowledged at epoch e was written before
e' was claimed; the client's replay to e' starts at its first step not acknowledged, so e' logs nothing
at or below an acknowledged step of e, and those records of e are kept. Why nothing is doubled: one
record per (session, step) is kept.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bridge.experience.reader import read_transitions
from protos import experience_pb2

__all__ = ["Merged", "merge_logs", "merge_transitions"]


@dataclass
class Merged:
    transitions: list[experience_pb2.Transition]
    stale: int = 0        # records of an epoch whose steps a newer epoch had taken over
    duplicates: int = 0   # the same (session, step, epoch) again
    per_log: dict[str, int] = field(default_factory=dict)  # records read, per log directory
    epochs: dict[str, list[int]] = field(default_factory=dict)  # per session: the epochs kept, in order

    def summary(self) -> dict:
        return {"transitions": len(self.transitions), "stale": self.stale, "duplicates": self.duplicates,
                "per_log": self.per_log, "sessions": len({t.session for t in self.transitions}),
                "moved_sessions": sum(1 for e in self.epochs.values() if len(e) > 1)}


def merge_transitions(records: Iterable[experience_pb2.Transition]) -> Merged:
    """`merge_logs` for transitions already read (from anywhere)."""
    by_session: dict[str, list[experience_pb2.Transition]] = defaultdict(list)
    for t in records:
        by_session[t.session].append(t)
    out, stale, duplicates, epochs = [], 0, 0, {}
    for session in sorted(by_session):
        rows = by_session[session]
        start: dict[int, int] = {}
        for t in rows:
            if t.step < start.get(t.owner_epoch, 1 << 64):
                start[t.owner_epoch] = t.step
        later_min, running = {}, 1 << 64  # per epoch: the lowest first step of any newer epoch
        for e in sorted(start, reverse=True):
            later_min[e] = running
            running = min(running, start[e])
        best: dict[int, experience_pb2.Transition] = {}
        for t in rows:
            if t.step >= later_min[t.owner_epoch]:
                stale += 1
                continue
            kept = best.get(t.step)
            if kept is None or t.owner_epoch > kept.owner_epoch:
                best[t.step] = t
            if kept is not None:
                duplicates += kept.owner_epoch == t.owner_epoch
                stale += kept.owner_epoch != t.owner_epoch  # an older epoch's copy of a step not past its start
        out.extend(best[s] for s in sorted(best))
        epochs[session] = sorted({t.owner_epoch for t in best.values()})
    return Merged(out, stale=stale, duplicates=duplicates, epochs=epochs)


def merge_logs(directories: Iterable[str | Path]) -> Merged:
    """Every complete transition of the logs in `directories`, merged (see module docstring)."""
    per_log: Counter[str] = Counter()
    records = []
    for d in directories:
        for t in read_transitions(d):
            per_log[str(d)] += 1
            records.append(t)
    merged = merge_transitions(records)
    merged.per_log = dict(per_log)
    return merged
