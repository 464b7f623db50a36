"""Recorded observations for the action-sanity check: the most recent steps of a policy's sessions.

    batch = recent_observations(run_dir / "experience", policy="pendulum", inputs=input_specs, count=256)
    batch.inputs        # {"observation": array[n, ...]}, oldest first
    batch.pairs         # (i, j): rows i and j are consecutive steps of one episode of one session
    len(batch)          # n <= count (0 when the log has none of this policy)

Segments are read newest first, each from its last message backwards, until `count` observations
are found (a segment being written is read up to its last complete record).
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError
from mcap.opcode import Opcode

from bridge.experience.segment import list_segments, read_opening
from protos import experience_pb2
from protos.codec import Spec, TensorError, decode_all

_HEAD = struct.Struct("<BQ")  # an MCAP record: opcode, length
_MSG_FIELDS = 22               # a Message record's channel, sequence, log time, publish time


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
        if a.dtype.kind == "f" and not np.isfinite(a).all():  # a poisoned record never judges a candidate
            return None
        out[spec.name] = a
    return out


def recent_observations(directory: Path, *, policy: str, inputs: Sequence[Spec], count: int,
                        exclude_prefix: str = "gate-", max_segments: int = 64,
                        index: LogIndex | None = None) -> ObservationBatch:
    """Up to `count` of the most recent logged observations of `policy` that fit `inputs`, leaving
    out sessions whose id starts with `exclude_prefix` (the gate's own evaluation runs).

    Each segment (newest first) is indexed by one pass over its record headers (remembered in
    `index` for the next call), then its messages are decoded from the last one backwards until
    enough are found."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    index = index if index is not None else LogIndex()
    segments = list_segments(Path(directory))
    index.forget_except({path for _, path in segments})
    newest_first: list[tuple[experience_pb2.Transition, dict[str, np.ndarray]]] = []
    for _, path in segments[::-1][:max_segments]:
        for t in _backwards(path, index):
            if t.policy != policy or (exclude_prefix and t.session.startswith(exclude_prefix)):
                continue
            arrays = _fits(t, inputs)
            if arrays is not None:
                newest_first.append((t, arrays))
                if len(newest_first) >= count:
                    break
        if len(newest_first) >= count:
            break
    rows = newest_first[::-1]
    keys = tuple((t.session, t.episode, t.step) for t, _ in rows)
    index = {key: i for i, key in enumerate(keys)}
    pairs = tuple((index[(s, e, step - 1)], i) for i, (s, e, step) in enumerate(keys)
                  if step > 0 and (s, e, step - 1) in index)
    stacked = {spec.name: np.stack([arrays[spec.name] for _, arrays in rows]) if rows
               else np.zeros((0, *spec.shape), spec.dtype) for spec in inputs}
    return ObservationBatch(stacked, pairs, keys)


class LogIndex:
    """Where each message record of each segment starts, kept between calls: a finished segment is
    indexed once, the one being written only from where the previous call stopped."""

    def __init__(self):
        self._segments: dict[Path, tuple[int, int, array]] = {}   # path -> (inode, scanned up to, starts)
        self._lock = threading.Lock()

    def starts(self, path: Path, mm: mmap.mmap, inode: int, data_start: int, size: int) -> tuple[array, int]:
        """(the record starts, how many of them lie within `size`): later calls only append."""
        with self._lock:
            return self._starts(path, mm, inode, data_start, size)

    def _starts(self, path: Path, mm: mmap.mmap, inode: int, data_start: int, size: int) -> tuple[array, int]:
        inode_was, pos, starts = self._segments.get(path, (inode, data_start, array("Q")))
        if inode_was != inode or pos > size:  # replaced or cut back (a repaired torn tail): start over
            pos, starts = data_start, array("Q")
        while pos + _HEAD.size <= size:  # bounded: pos grows by at least the header each round
            opcode, length = _HEAD.unpack_from(mm, pos)
            end = pos + _HEAD.size + length
            if opcode != Opcode.MESSAGE or end > size or length < _MSG_FIELDS:
                break  # the closing records, or a record still being written
            starts.append(pos)
            pos = end
        self._segments[path] = (inode, pos, starts)
        return starts, len(starts)

    def forget_except(self, paths: set[Path]) -> None:
        with self._lock:
            for path in self._segments.keys() - paths:
                del self._segments[path]


def _backwards(path: Path, index: LogIndex) -> Iterator[experience_pb2.Transition]:
    """The complete messages of one segment (being written or not), last first."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, after the memory map
    except FileNotFoundError:
        return
    with f:
        opening = read_opening(f, path)
        size = f.seek(0, os.SEEK_END)
        if opening is None or size <= opening[1]:
            return
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            starts, n = index.starts(path, mm, os.fstat(f.fileno()).st_ino, opening[1], size)
            for i in range(n - 1, -1, -1):
                pos = starts[i]
                _, length = _HEAD.unpack_from(mm, pos)
                try:
                    yield experience_pb2.Transition.FromString(mm[pos + _HEAD.size + _MSG_FIELDS:
                                                                 pos + _HEAD.size + length])
                except DecodeError:
                    continue
