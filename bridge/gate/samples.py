"""Recorded observations for the action-sanity check: the most recent steps of a policy's sessions.

    batch = recent_observations(run_dir / "experience", policy="pendulum", inputs=input_specs, count=256)
    batch.inputs        # {"observation": array[n, ...]}, oldest first
    batch.pairs         # (i, j): rows i and j are consecutive steps of one episode of one session
    len(batch)          # n <= count (0 when the log has none of this policy)

Segments are read newest first, each at most once, until `count` observations are found.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bridge.experience.reader import LogCursor
from bridge.experience.segment import list_segments, read_opening
from protos import experience_pb2
from protos.codec import Spec, TensorError, decode_all


@dataclass(frozen=True)
class ObservationBatch:
    inputs: dict[str, np.ndarray]
    pairs: tuple[tuple[int, int], ...]
    keys: tuple[tuple[str, int, int], ...]   # (session, episode, step) of each row

    def __len__(self) -> int:
        return len(self.keys)


def _first_offset(path: Path) -> int | None:
    try:
        with open(path, "rb") as f:
            opening = read_opening(f, path)
    except FileNotFoundError:
        return None
    return None if opening is None else opening[0]


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
                        max_segments: int = 64) -> ObservationBatch:
    """Up to `count` of the most recent logged observations of `policy` that fit `inputs`."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    segments = [(i, p) for i, p in list_segments(Path(directory))][::-1][:max_segments]
    chunks: list[list[tuple[experience_pb2.Transition, dict[str, np.ndarray]]]] = []
    found = 0
    end: int | None = None
    for _, path in segments:
        first = _first_offset(path)
        if first is None:
            continue
        newest: deque[tuple[experience_pb2.Transition, dict[str, np.ndarray]]] = deque(maxlen=count - found)
        cursor = LogCursor(directory, from_offset=first)
        try:
            while True:  # bounded: every round moves next_offset on, or ends
                before = cursor.next_offset
                for t in cursor.read(max_count=512, end_offset=end, follow=False, keep=lambda t: t.policy == policy):
                    arrays = _fits(t, inputs)
                    if arrays is not None:
                        newest.append((t, arrays))
                if cursor.next_offset == before:
                    break
        finally:
            cursor.close()
        end = first
        chunks.append(list(newest))
        found += len(newest)
        if found >= count:
            break
    rows = [row for chunk in reversed(chunks) for row in chunk]
    keys = tuple((t.session, t.episode, t.step) for t, _ in rows)
    index = {key: i for i, key in enumerate(keys)}
    pairs = tuple((index[(s, e, step - 1)], i) for i, (s, e, step) in enumerate(keys)
                  if step > 0 and (s, e, step - 1) in index)
    stacked = {spec.name: np.stack([arrays[spec.name] for _, arrays in rows]) if rows
               else np.zeros((0, *spec.shape), spec.dtype) for spec in inputs}
    return ObservationBatch(stacked, pairs, keys)
