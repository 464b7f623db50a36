"""One MCAP segment file of the experience log: write, scan, repair.

A segment is a plain, unchunked MCAP file: magic, Header, the `tether.v1.Transition` protobuf
Schema (a FileDescriptorSet, so any MCAP tool decodes it), one Channel, a `tether.segment`
Metadata record naming the segment's first offset, then one Message per transition (offsets
consecutive from there). Finishing appends a `tether.sessions` Metadata record (each session's
highest logged step, cumulative over the log), DataEnd, the summary and the footer.

    w = SegmentWriter.create(path, first_offset=0)
    w.append_many([(log_time_ns, data), ...])   # writev, no copies of the payloads
    w.sync()                                    # fdatasync: the bytes covering them are durable
    w.mark_synced()                             # what `rollback` cuts back to after a failed write
    w.rollback()                                # truncate to the last synced size (ENOSPC mid-record)
    w.finish({"robot-1": 41})                   # summary + footer: a complete MCAP file

    scan = scan_segment(path)   # read-only: first offset, complete messages, where the torn tail starts
    repair_segment(path, scan, sessions)        # cut the torn tail and finish it in place

Fault injection (tests): with `TETHER_LOG_FAULTS=<file>` in the environment, every write and fsync
of a segment fails while that file exists, with the errno it names (`ENOSPC`, `EIO`; empty: EIO),
after writing half of the first buffer (a torn record, as a full disk leaves).
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

from google.protobuf import descriptor_pb2
from mcap.data_stream import ReadDataStream, RecordBuilder
from mcap.opcode import Opcode
from mcap.records import (
    Channel,
    DataEnd,
    Footer,
    Header,
    Metadata,
    MetadataIndex,
    Schema,
    Statistics,
    SummaryOffset,
)

from bridge.common.files import fsync_dir
from protos import experience_pb2

MAGIC = b"\x89MCAP0\r\n"
TOPIC = "/tether/transitions"
SCHEMA_NAME = "tether.v1.Transition"
SEGMENT_META = "tether.segment"
SESSIONS_META = "tether.sessions"
LIBRARY = "tether-experience/1"
_MSG_HEAD = struct.Struct("<BQHIQQ")  # opcode, record length, channel id, sequence, log time, publish time
_REC_HEAD = struct.Struct("<BQ")
_FOOTER_LEN = 9 + 20 + len(MAGIC)
_IOV_MAX = 512
_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
_FAULTS = os.environ.get("TETHER_LOG_FAULTS") or None  # tests: a file whose existence fails writes (module doc)


def _injected_fault(fd: int, bufs: Sequence[bytes] = ()) -> None:
    """Raises the OSError that `_FAULTS` names while its file exists (after writing half a buffer)."""
    if _FAULTS is None:
        return
    try:
        with open(_FAULTS) as f:
            name = f.read().strip() or "EIO"
    except FileNotFoundError:
        return
    code = getattr(errno, name, errno.EIO)
    if bufs and len(bufs[0]) > 1:
        os.write(fd, bytes(bufs[0][:len(bufs[0]) // 2]))
    raise OSError(code, f"{os.strerror(code)} (injected by TETHER_LOG_FAULTS)")


class SegmentError(ValueError):
    """A segment file that is not a Tether experience segment; the message names the file."""


def file_descriptor_set() -> bytes:
    """The FileDescriptorSet of `tether.v1.Transition` with its imports, dependencies first."""
    fds = descriptor_pb2.FileDescriptorSet()
    seen: set[str] = set()

    def add(fd) -> None:
        if fd.name in seen:
            return
        seen.add(fd.name)
        for dep in fd.dependencies:
            add(dep)
        fd.CopyToProto(fds.file.add())

    add(experience_pb2.Transition.DESCRIPTOR.file)
    return fds.SerializeToString()


_SCHEMA = Schema(id=1, name=SCHEMA_NAME, encoding="protobuf", data=file_descriptor_set())
_CHANNEL = Channel(id=1, schema_id=1, topic=TOPIC, message_encoding="protobuf", metadata={})


def _records(*records) -> bytes:
    b = RecordBuilder()
    for r in records:
        r.write(b)
    return b.end()


def segment_name(index: int) -> str:
    return f"segment-{index:06d}.mcap"


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(index, path) of every `segment-NNNNNN.mcap` in `directory`, in index order."""
    out = []
    for p in Path(directory).glob("segment-*.mcap"):
        stem = p.stem.removeprefix("segment-")
        if stem.isdigit():
            out.append((int(stem), p))
    return sorted(out)


@dataclass
class SegmentScan:
    """What a read-only scan of one segment found."""

    path: Path
    first_offset: int | None = None    # None: not even the opening records are complete
    count: int = 0                     # complete messages
    finished: bool = False             # has a valid footer
    good_end: int = 0                  # byte after the last complete record before any torn tail
    segment_meta_at: tuple[int, int] = (0, 0)  # (offset, length) of the tether.segment record
    start_ns: int = 0
    end_ns: int = 0
    sessions: dict[str, int] = field(default_factory=dict)  # highest step per session

    @property
    def end_offset(self) -> int:
        return (self.first_offset or 0) + self.count


class SegmentWriter:
    """Appends transitions to a new segment file through a raw file descriptor (no user-space buffer)."""

    def __init__(self, path: Path, fd: int, first_offset: int, size: int, meta_at: tuple[int, int]):
        self.path, self.first_offset = path, first_offset
        self._fd, self.size, self._meta_at = fd, size, meta_at
        self.count = 0
        self.start_ns = self.end_ns = 0
        self._synced = (size, 0, 0, 0)  # (size, count, start_ns, end_ns) at the last sync (create fsyncs)

    @classmethod
    def create(cls, path: Path, *, first_offset: int) -> SegmentWriter:
        """Creates `path` (refusing to overwrite) and writes the opening records."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            head = MAGIC + _records(Header(profile="", library=LIBRARY), _SCHEMA, _CHANNEL)
            meta = _records(Metadata(name=SEGMENT_META, metadata={"first_offset": str(first_offset)}))
            _write_all(fd, [head, meta])
            _injected_fault(fd)
            _fdatasync(fd)
            fsync_dir(path.parent)
        except BaseException:
            os.close(fd)
            try:  # a half-created segment (ENOSPC) goes: a reader would wait at its incomplete opening
                path.unlink()
                fsync_dir(path.parent)
            except OSError:
                pass  # recovery removes it (no complete opening or no message)
            raise
        return cls(path, fd, first_offset, len(head) + len(meta), (len(head), len(meta)))

    @staticmethod
    def record_size(data: bytes) -> int:
        return _MSG_HEAD.size + len(data)

    def append_many(self, items: Sequence[tuple[int, bytes]]) -> int:
        """Writes one Message per (log_time_ns, serialized Transition); returns the bytes written."""
        bufs: list[bytes] = []
        count, start_ns, end_ns = self.count, self.start_ns, self.end_ns
        for log_time, data in items:
            seq = (self.first_offset + count) & 0xFFFFFFFF
            bufs.append(_MSG_HEAD.pack(Opcode.MESSAGE, 22 + len(data), 1, seq, log_time, log_time))
            bufs.append(data)
            if count == 0:
                start_ns = log_time
            start_ns, end_ns = min(start_ns, log_time), max(end_ns, log_time)
            count += 1
        _injected_fault(self._fd, bufs)
        n = _write_all(self._fd, bufs)  # an OSError midway: the caller rolls back (the counts are not moved)
        self.size += n
        self.count, self.start_ns, self.end_ns = count, start_ns, end_ns
        return n

    def sync(self) -> None:
        _injected_fault(self._fd)
        _fdatasync(self._fd)

    def mark_synced(self) -> None:
        """What is written now is durable: `rollback` cuts back to here."""
        self._synced = (self.size, self.count, self.start_ns, self.end_ns)

    def rollback(self) -> None:
        """Truncates the file to its size at the last `mark_synced` (after a failed write or fsync:
        no half-written record, and nothing whose fsync failed, stays), and resets the counts."""
        size = self._synced[0]
        os.ftruncate(self._fd, size)
        os.lseek(self._fd, size, os.SEEK_SET)
        self.size, self.count, self.start_ns, self.end_ns = self._synced

    def finish(self, sessions: dict[str, int], *, fsync: bool = True) -> None:
        """Writes the closing metadata, summary and footer, and closes the file. On an OSError the
        file stays open (with whatever part of the tail got written): `rollback`, then retry."""
        tail = _finish_bytes(self.size, self._meta_at, sessions, self.count, self.start_ns, self.end_ns)
        _injected_fault(self._fd, [tail])
        _write_all(self._fd, [tail])
        if fsync:
            _injected_fault(self._fd)
            os.fsync(self._fd)
        os.close(self._fd)

    def abandon(self) -> None:
        os.close(self._fd)


def _write_all(fd: int, bufs: list[bytes]) -> int:
    total = 0
    for i in range(0, len(bufs), _IOV_MAX):
        views = [memoryview(b) for b in bufs[i:i + _IOV_MAX]]
        while views:
            n = os.writev(fd, views)
            total += n
            while views and n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            if views and n:
                views[0] = views[0][n:]
    return total


def _finish_bytes(data_end_at: int, meta_at: tuple[int, int], sessions: dict[str, int], count: int,
                  start_ns: int, end_ns: int) -> bytes:
    """Closing Metadata + DataEnd + summary + footer + magic, for a data section ending at `data_end_at`."""
    closing = _records(Metadata(name=SESSIONS_META, metadata={k: str(v) for k, v in sessions.items()}))
    meta_index = [MetadataIndex(offset=meta_at[0], length=meta_at[1], name=SEGMENT_META),
                  MetadataIndex(offset=data_end_at, length=len(closing), name=SESSIONS_META)]
    data_end = _records(DataEnd(data_section_crc=0))
    summary_start = data_end_at + len(closing) + len(data_end)
    stats = Statistics(message_count=count, schema_count=1, channel_count=1, attachment_count=0,
                       metadata_count=2, chunk_count=0, message_start_time=start_ns, message_end_time=end_ns,
                       channel_message_counts={1: count} if count else {})
    groups = [(Opcode.SCHEMA, [_SCHEMA]), (Opcode.CHANNEL, [_CHANNEL]), (Opcode.STATISTICS, [stats]),
              (Opcode.METADATA_INDEX, meta_index)]
    summary = BytesIO()
    offsets = []
    for opcode, recs in groups:
        blob = _records(*recs)
        offsets.append(SummaryOffset(group_opcode=opcode, group_start=summary_start + summary.tell(),
                                     group_length=len(blob)))
        summary.write(blob)
    summary_offset_start = summary_start + summary.tell()
    summary.write(_records(*offsets))
    body = summary.getvalue()
    crc = zlib.crc32(body)
    crc = zlib.crc32(struct.pack("<BQQQ", Opcode.FOOTER, 20, summary_start, summary_offset_start), crc)
    footer = _records(Footer(summary_start=summary_start, summary_offset_start=summary_offset_start,
                             summary_crc=crc))
    return closing + data_end + body + footer + MAGIC


def is_finished(path: Path) -> bool:
    """True when the file ends with a valid footer whose summary checksum matches."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size < len(MAGIC) * 2 + _FOOTER_LEN:
            return False
        f.seek(size - _FOOTER_LEN)
        tail = f.read(_FOOTER_LEN)
        opcode, length, summary_start, summary_offset_start, crc = struct.unpack("<BQQQI", tail[:29])
        if tail[29:] != MAGIC or opcode != Opcode.FOOTER or length != 20 or not 0 < summary_start < size:
            return False
        f.seek(summary_start)
        body = f.read(size - _FOOTER_LEN - summary_start)
        expect = zlib.crc32(struct.pack("<BQQQ", Opcode.FOOTER, 20, summary_start, summary_offset_start),
                            zlib.crc32(body))
        return crc == 0 or crc == expect


def iter_records(f, size: int) -> Iterator[tuple[int, int, int]]:
    """(opcode, record start, record end) of each complete record from the current position, up
    to the first incomplete one (a torn tail) or the end of the data section."""
    pos = f.tell()
    while pos + _REC_HEAD.size <= size:
        head = f.read(_REC_HEAD.size)
        opcode, length = _REC_HEAD.unpack(head)
        end = pos + _REC_HEAD.size + length
        if end > size:
            return
        yield opcode, pos, end
        f.seek(end)
        pos = end


def read_opening(f, path: Path) -> tuple[int, int, tuple[int, int]] | None:
    """Reads magic and the opening records; returns (first_offset, position after them, metadata
    record span), or None when they are not all there (a segment torn at creation)."""
    size = f.seek(0, os.SEEK_END)
    f.seek(0)
    if f.read(len(MAGIC)) != MAGIC:
        if size < len(MAGIC):
            return None
        raise SegmentError(f"{path}: not an MCAP file (bad magic)")
    for opcode, start, end in iter_records(f, size):
        if opcode == Opcode.METADATA:
            f.seek(start + _REC_HEAD.size)
            meta = Metadata.read(ReadDataStream(f))
            if meta.name != SEGMENT_META:
                raise SegmentError(f"{path}: first metadata record is {meta.name!r}, not {SEGMENT_META!r}")
            f.seek(end)
            return int(meta.metadata["first_offset"]), end, (start, end - start)
        if opcode not in (Opcode.HEADER, Opcode.SCHEMA, Opcode.CHANNEL):
            raise SegmentError(f"{path}: unexpected record opcode {opcode} before {SEGMENT_META}")
    return None


def read_summary(f, size: int) -> tuple[dict[str, int] | None, Statistics | None]:
    """The `tether.sessions` metadata and the Statistics of a finished segment, through its summary."""
    f.seek(size - _FOOTER_LEN)
    _, _, summary_start, _, _ = struct.unpack("<BQQQI", f.read(29))
    f.seek(summary_start)
    index, stats = None, None
    for opcode, start, end in iter_records(f, size - _FOOTER_LEN):
        f.seek(start + _REC_HEAD.size)
        if opcode == Opcode.METADATA_INDEX:
            found = MetadataIndex.read(ReadDataStream(f))
            if found.name == SESSIONS_META:
                index = found
        elif opcode == Opcode.STATISTICS:
            stats = Statistics.read(ReadDataStream(f))
        f.seek(end)
    sessions = None
    if index is not None:
        f.seek(index.offset + _REC_HEAD.size)
        sessions = {k: int(v) for k, v in Metadata.read(ReadDataStream(f)).metadata.items()}
    return sessions, stats


def scan_segment(path: Path, *, decode_messages: bool | None = None) -> SegmentScan:
    """Scans a segment without changing it. Messages are decoded (to collect each session's
    highest step and to reject garbage) when the segment is unfinished or lacks its sessions record."""
    scan = SegmentScan(path=Path(path))
    scan.finished = is_finished(path)
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        opening = read_opening(f, scan.path)
        if opening is None:
            return scan
        scan.first_offset, scan.good_end, scan.segment_meta_at = opening
        if scan.finished and not decode_messages:
            sessions, stats = read_summary(f, size)
            if sessions is not None and stats is not None:
                scan.sessions, scan.count = sessions, stats.message_count
                scan.start_ns, scan.end_ns = stats.message_start_time, stats.message_end_time
                return scan
            f.seek(scan.good_end)
        _scan_messages(f, size, scan, decode=decode_messages is not False)
    return scan


def _scan_messages(f, size: int, scan: SegmentScan, *, decode: bool) -> None:
    """Counts (and optionally decodes) the complete Message records from scan.good_end, in a memory map."""
    if size <= scan.good_end:
        return
    fields = struct.Struct("<HIQQ")
    first = scan.first_offset
    sessions = scan.sessions
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        pos = scan.good_end
        while pos + _MSG_HEAD.size <= size:
            opcode, length = _REC_HEAD.unpack_from(mm, pos)
            end = pos + _REC_HEAD.size + length
            if opcode != Opcode.MESSAGE or end > size or length < 22:
                break  # closing metadata / DataEnd, or the torn tail
            channel, _seq, log_time, _pub = fields.unpack_from(mm, pos + _REC_HEAD.size)
            if channel != 1:
                break
            if decode:
                try:
                    t = experience_pb2.Transition.FromString(mm[pos + _MSG_HEAD.size:end])
                except Exception:  # noqa: BLE001 - a garbled record is where the torn tail starts
                    break
                if t.offset != first + scan.count:
                    break
                if t.step > sessions.get(t.session, -1):
                    sessions[t.session] = t.step
            if scan.count == 0:
                scan.start_ns = log_time
            scan.start_ns, scan.end_ns = min(scan.start_ns, log_time), max(scan.end_ns, log_time)
            scan.count += 1
            scan.good_end = pos = end


def repair_segment(scan: SegmentScan, sessions: dict[str, int]) -> None:
    """Cuts an unfinished segment back to its last complete message and finishes it in place, so
    it is a complete MCAP file. A segment without a single complete message is removed."""
    if scan.finished:
        return
    if scan.first_offset is None or scan.count == 0:
        scan.path.unlink()
        fsync_dir(scan.path.parent)
        return
    fd = os.open(scan.path, os.O_WRONLY)
    try:
        os.ftruncate(fd, scan.good_end)
        os.lseek(fd, scan.good_end, os.SEEK_SET)
        tail = _finish_bytes(scan.good_end, scan.segment_meta_at, sessions, scan.count, scan.start_ns, scan.end_ns)
        _write_all(fd, [tail])
        os.fsync(fd)
    finally:
        os.close(fd)
    scan.finished = True
