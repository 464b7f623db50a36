"""Reading the experience log's segments in offset order, while the log may be writing them.

    for t in read_transitions(log_dir, from_offset=0):   # everything complete on disk now
        print(t.offset, t.session, t.step, t.reward)

    cursor = LogCursor(log_dir, from_offset=1000)        # resumable: the Subscribe stream's reader
    batch = cursor.read(max_count=256, end_offset=log.durable_offset)
    more = cursor.read(max_count=256, end_offset=log.durable_offset)   # continues where it stopped

Only complete records are read: the open segment's last, partly written record (or a torn tail
after a crash) is where reading stops, and the next call resumes from there. A complete record that
does not parse as a `tether.v1.Transition`, or carries another offset than its place, is skipped and
counted (`cursor.skipped`, `on_skip(offset, why)`, a warning): it never stops a reader at the same
place on every resume. (Whether a parsed transition is fit to learn from is the readers' own check:
`protos.codec.transition_problem`.)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from google.protobuf.message import DecodeError
from mcap.opcode import Opcode

from bridge.experience.segment import iter_records, list_segments, read_opening
from protos import experience_pb2

log = logging.getLogger("tether.experience")
_REC = 9
_MSG_FIELDS = 22


class LogCursor:
    """A resumable position in the log (see module docstring). Not thread-safe: one reader thread
    at a time (the Subscribe stream calls it through `asyncio.to_thread`, one call at a time)."""

    def __init__(self, directory: str | Path, from_offset: int = 0,
                 on_skip: Callable[[int, str], None] | None = None):
        self.directory = Path(directory)
        self.skipped = 0                 # complete records that are not a transition at their offset
        self._on_skip = on_skip
        self.next_offset = from_offset   # the next offset to look at
        self._file = None
        self._index = 0                  # the open segment's index
        self._first = 0                  # its first offset
        self._count = 0                  # messages passed in it
        self._pos = 0                    # file position of the next record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def read(self, *, max_count: int = 256, end_offset: int | None = None, max_bytes: int = 64 << 20,
             keep: Callable[[experience_pb2.Transition], bool] | None = None,
             follow: bool = True, out=None) -> list[experience_pb2.Transition]:
        """Up to `max_count` transitions (those `keep` accepts) with offset in [next_offset, end_offset),
        reading at most about `max_bytes`. With follow=False an incomplete segment that is not the
        last is skipped (a damaged file in a static directory); with follow=True reading waits at it.
        `out`: a repeated Transition field (e.g. `ExperienceBatch.transitions`) to parse straight into,
        saving a copy per transition; it is returned."""
        into = out is not None
        out = [] if out is None else out
        scanned = 0
        rechecked, stalled_at = False, -1
        while len(out) < max_count and scanned < max_bytes:
            if end_offset is not None and self.next_offset >= end_offset:
                break
            if self._file is None and not self._open_next(follow):
                break
            f = self._file
            size = os.fstat(f.fileno()).st_size
            f.seek(self._pos)
            moved_on = False
            for opcode, start, end in iter_records(f, size):
                if opcode != Opcode.MESSAGE:
                    self._next_segment()  # closing metadata / DataEnd: this segment is complete
                    moved_on = True
                    break
                offset = self._first + self._count
                if end_offset is not None and offset >= end_offset:
                    return out
                if offset >= self.next_offset:
                    f.seek(start + _REC + _MSG_FIELDS)
                    data = f.read(end - start - _REC - _MSG_FIELDS)
                    try:
                        if into:
                            t = out.add()
                            t.ParseFromString(data)
                        else:
                            t = experience_pb2.Transition.FromString(data)
                        why = None if t.offset == offset else f"message {self._count} has offset {t.offset}"
                    except DecodeError as exc:
                        why = f"message {self._count} does not parse as tether.v1.Transition ({exc})"
                    scanned += len(data)
                    self.next_offset = offset + 1
                    if why is not None:
                        if into:
                            del out[-1]
                        self._skip(offset, f"{f.name}: {why}")
                    elif keep is not None and not keep(t):
                        if into:
                            del out[-1]
                    elif not into:
                        out.append(t)
                self._count += 1
                self._pos = end
                if len(out) >= max_count or scanned >= max_bytes:
                    return out
                f.seek(end)
            if moved_on:
                rechecked = False
                continue
            # the end of the complete records: a segment being written, or a torn one
            if not follow and any(i > self._index for i, _ in list_segments(self.directory)):  # a later one
                if not rechecked or self._pos != stalled_at:
                    rechecked, stalled_at = True, self._pos  # it may have been finished meanwhile: look again
                    continue
                self._next_segment()
                rechecked = False
                continue
            break
        return out

    def _skip(self, offset: int, why: str) -> None:
        self.skipped += 1
        (log.warning if self.skipped == 1 or self.skipped % 1000 == 0 else log.debug)(
            "experience log: skipped the record at offset %d (%d so far by this reader): %s", offset, self.skipped, why)
        if self._on_skip is not None:
            self._on_skip(offset, why)

    def _opening(self, path: Path) -> tuple[int, int] | None:
        try:
            with open(path, "rb") as f:
                opening = read_opening(f, path)
        except FileNotFoundError:
            return None
        return None if opening is None else (opening[0], opening[1])

    def _open_next(self, follow: bool) -> bool:
        """Opens the segment holding next_offset (or the first after it); False if none is readable yet."""
        segments = [(i, p) for i, p in list_segments(self.directory) if i > self._index]
        chosen = None
        for i, p in segments:
            opening = self._opening(p)
            if opening is None:
                if follow:
                    break  # being created: wait for it
                continue
            first, pos = opening
            if chosen is None or first <= self.next_offset:
                chosen = (i, p, first, pos)
            if first > self.next_offset:
                break
        if chosen is None:
            return False
        i, p, first, pos = chosen
        self._file = open(p, "rb")  # noqa: SIM115 - held across read() calls, closed by close()
        self._index, self._first, self._count, self._pos = i, first, 0, pos
        self.next_offset = max(self.next_offset, first)
        return True

    def _next_segment(self) -> None:
        self.close()


def read_transitions(directory: str | Path, from_offset: int = 0, *,
                     on_skip: Callable[[int, str], None] | None = None) -> Iterator[experience_pb2.Transition]:
    """Every complete transition in `directory` with offset >= from_offset, in offset order (a record that
    is not one is skipped: `on_skip(offset, why)`)."""
    cursor = LogCursor(directory, from_offset, on_skip=on_skip)
    try:
        while True:
            batch = cursor.read(max_count=256, follow=False)
            if not batch:
                return
            yield from batch
    finally:
        cursor.close()


__all__ = ["LogCursor", "read_transitions"]
