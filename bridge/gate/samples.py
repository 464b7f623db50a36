"""Recorded observations for the action-sanity check: the most recent steps of a policy's sessions.

    batch = recent_observations(run_dir / "experience", policy="pendulum", inputs=input_specs, count=256)
    batch.inputs        # {"observation": array[n, ...]}, oldest first
    batch.pairs         # (i, j): rows i and j are consecutive steps of one episode of one session
    len(batch)          # n <= count (0 when the log has none of this policy)

Segments are read newest first, backwards in growing windows, until `count` observations are found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bridge.experience.reader import LogCursor
from bridge.experience.segment import list_segments, scan_segment
from protos import experience_pb2
from protos.codec import Spec, TensorError, decode_all


@dataclass(frozen=True)
class ObservationBatch:
    inputs: dict[str, np.ndarray]
    pairs: tuple[tuple[int, int], ...]
    keys: tuple[tuple[str, int, int], ...]   # (session, episode, step) of each row

    def __len__(self) -> int:
        return len(self.keys)


def _fits(t: experience_pb2.Transition, inputs: Sequence[Spec]) -> dict[str, np.ndarray] | None:
    try:
        arrays = decode_all(t.observation)
    except TensorError:
        return None
    out = {}
    for spec in inputs:
        a = arrays.get(spec.name)
        if a is None or a.dtype != spec.dtype or a.shape != spec.shape:
            return None
        out[spec.name] = a
    return out


def recent_observations(directory: Path, *, policy: str, inputs: Sequence[Spec], count: int,
                        exclude_prefix: str = "gate-", max_segments: int = 64) -> ObservationBatch:
    """Up to `count` of the most recent logged observations of `policy` that fit `inputs`, leaving
    out sessions whose id starts with `exclude_prefix` (the gate's own evaluation runs).

    Reads backwards in windows that double (records before a window are skipped, not decoded)."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")

    def keep(t: experience_pb2.Transition) -> bool:
        return t.policy == policy and not (exclude_prefix and t.session.startswith(exclude_prefix))

    newest_first: list[tuple[experience_pb2.Transition, dict[str, np.ndarray]]] = []
    for _, path in list_segments(Path(directory))[::-1][:max_segments]:
        scan = scan_segment(path, decode_messages=False)
        if scan.first_offset is None:
            continue
        first, hi, window = scan.first_offset, scan.end_offset, 2 * count
        while hi > first and len(newest_first) < count:
            lo = max(first, hi - window)
            newest_first.extend(reversed(_read(directory, lo, hi, keep, inputs)))
            hi, window = lo, window * 2
        if len(newest_first) >= count:
            break
    rows = newest_first[:count][::-1]
    keys = tuple((t.session, t.episode, t.step) for t, _ in rows)
    index = {key: i for i, key in enumerate(keys)}
    pairs = tuple((index[(s, e, step - 1)], i) for i, (s, e, step) in enumerate(keys)
                  if step > 0 and (s, e, step - 1) in index)
    stacked = {spec.name: np.stack([arrays[spec.name] for _, arrays in rows]) if rows
               else np.zeros((0, *spec.shape), spec.dtype) for spec in inputs}
    return ObservationBatch(stacked, pairs, keys)


def _read(directory: Path, lo: int, hi: int, keep, inputs: Sequence[Spec]
          ) -> list[tuple[experience_pb2.Transition, dict[str, np.ndarray]]]:
    """The kept transitions with offsets in [lo, hi) that fit `inputs`, in offset order."""
    out = []
    cursor = LogCursor(directory, from_offset=lo)
    try:
        while cursor.next_offset < hi:  # bounded: every round moves next_offset on, or ends
            before = cursor.next_offset
            for t in cursor.read(max_count=512, end_offset=hi, follow=False, keep=keep):
                arrays = _fits(t, inputs)
                if arrays is not None:
                    out.append((t, arrays))
            if cursor.next_offset == before:
                break
    finally:
        cursor.close()
    return out
