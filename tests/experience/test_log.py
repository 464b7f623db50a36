"""The experience log on real files: crash safety with kill -9, torn tails, rotation, duplicates, images."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bridge.experience import ExperienceLog, LogError, read_transitions
from bridge.experience.segment import is_finished, list_segments
from protos import codec, experience_pb2
from tests.experience.helpers import mcap_transitions, transition

APPENDER = Path(__file__).with_name("appender.py")


def run(coro):
    return asyncio.run(coro)


async def write_log(directory: Path, n: int, **kw) -> list[int]:
    async with ExperienceLog(directory, **kw) as log:
        futs = [log.append(transition(f"s{i % 3}", i // 3)) for i in range(n)]
        return list(await asyncio.gather(*futs))


def all_segments_readable(directory: Path) -> list:
    out = []
    for _, path in list_segments(directory):
        assert is_finished(path), path
        out += mcap_transitions(path)
    return out


def message_ends(path: Path) -> list[int]:
    """End positions of the Message records in a segment, parsed here independently of the log's code."""
    data = path.read_bytes()
    pos, ends = 8, []
    while pos + 9 <= len(data):
        opcode, length = struct.unpack_from("<BQ", data, pos)
        if opcode == 0x0F:  # DataEnd
            break
        pos += 9 + length
        if opcode == 0x05:
            ends.append(pos)
    return ends


def test_kill_9_mid_stream_keeps_every_acknowledged_transition_exactly_once(tmp_path):
    log_dir = tmp_path / "log"
    proc = subprocess.Popen([sys.executable, str(APPENDER), str(log_dir), str(48 << 10)],
                            stdout=subprocess.PIPE, text=True)
    acked: list[tuple[int, str, int]] = []
    try:
        assert proc.stdout.readline().strip() == "ready"
        while len(acked) < 3000:
            line = proc.stdout.readline()
            assert line, f"appender ended early with {proc.poll()}"
            off, session, step = line.split()
            acked.append((int(off), session, int(step)))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
    for line in rest.splitlines(keepends=True):  # acknowledged before the kill, still in the pipe
        if not line.endswith("\n"):
            break  # a line cut by the kill
        assert len(line.split()) == 3, repr(line)
        off, session, step = line.split()
        acked.append((int(off), session, int(step)))
    assert proc.returncode == -signal.SIGKILL

    async def restart():
        async with ExperienceLog(log_dir) as log:
            last = {s: log.last_step(s) for s in ("s0", "s1", "s2", "s3")}
            durable = log.durable_offset
            fut = log.append(transition("s0", last["s0"] + 1))
            dup = log.append(transition("s1", last["s1"]))
            return last, durable, await fut, dup, log.stats

    last, durable, new_offset, dup, stats = run(restart())
    logged = list(read_transitions(log_dir))
    keys = [(t.session, t.step) for t in logged]
    assert len(keys) == len(set(keys)), "a transition is present twice"
    assert [t.offset for t in logged] == list(range(len(logged))), "offsets are not 0..n-1"
    by_offset = {t.offset: (t.session, t.step) for t in logged}
    for off, session, step in acked:
        assert by_offset.get(off) == (session, step), f"acknowledged offset {off} ({session}, {step}) lost"
    assert durable == len(logged) - 1 and new_offset == durable, "offsets continue after the last durable one"
    assert dup is None and stats.duplicates == 1
    for s in ("s0", "s1", "s2", "s3"):
        assert last[s] == max(t.step for t in logged[:-1] if t.session == s)
    assert stats.recovered == durable
    assert len(list_segments(log_dir)) > 2, "the crash test should span rotated segments"
    assert [t.offset for t in all_segments_readable(log_dir)] == list(range(len(logged)))


@pytest.mark.parametrize("where", ["in_magic", "in_schema", "first_message", "mid_message", "record_boundary",
                                   "in_footer", "middle_segment"])
def test_truncated_segment_is_cut_back_to_its_last_complete_record(tmp_path, where):
    src = tmp_path / "src"
    run(write_log(src, 300, segment_bytes=16 << 10))
    segments = list_segments(src)
    assert len(segments) >= 3
    target = segments[1][1] if where == "middle_segment" else segments[-1][1]
    ends = message_ends(target)
    size = target.stat().st_size
    rng = np.random.default_rng(len(where))
    cut = {"in_magic": 5, "in_schema": 60, "first_message": ends[0] - 3,
           "mid_message": int(rng.integers(ends[2] + 1, ends[-2] - 1)), "record_boundary": ends[4],
           "in_footer": size - 20, "middle_segment": int(rng.integers(ends[1] + 1, ends[-1] - 1))}[where]
    before = {t.offset: t for t in read_transitions(src)}
    with open(target, "r+b") as f:
        f.truncate(cut)
    kept_in_target = sum(1 for e in ends if e <= cut)

    async def reopen():
        async with ExperienceLog(src) as log:
            return log.durable_offset, await log.append(transition("s0", 10_000))

    durable, next_off = run(reopen())
    after = all_segments_readable(src)
    offsets = [t.offset for t in after]
    assert len(offsets) == len(set(offsets)) and offsets == sorted(offsets)
    lost = len(ends) - kept_in_target
    assert len(after) == len(before) - lost + 1
    for t in after[:-1]:
        assert before[t.offset] == experience_pb2.Transition.FromString(t.SerializeToString())
    if where == "middle_segment":
        assert durable == len(before)          # later segments are intact: offsets continue after them
    else:
        assert durable == len(before) - lost
    assert next_off == durable
    if kept_in_target == 0:
        assert not target.exists(), "a segment without a complete message is removed"


def test_rotation_by_size_and_by_age(tmp_path):
    async def main():
        async with ExperienceLog(tmp_path / "size", segment_bytes=8 << 10) as log:
            await asyncio.gather(*(log.append(transition("a", i)) for i in range(200)))
        sizes = [p.stat().st_size for _, p in list_segments(tmp_path / "size")]
        assert len(sizes) > 3 and max(sizes) < (8 << 10) + 8192  # + the summary (schema repeated)

        async with ExperienceLog(tmp_path / "age", segment_seconds=0.2) as log:
            await log.append(transition("a", 0))
            first = list_segments(tmp_path / "age")[0][1]
            for _ in range(200):  # the writer finishes the aged segment while idle
                if is_finished(first):
                    break
                await asyncio.sleep(0.05)
            assert is_finished(first)
            await log.append(transition("a", 1))
            assert len(list_segments(tmp_path / "age")) == 2

    run(main())
    assert [t.step for t in read_transitions(tmp_path / "age")] == [0, 1]
    assert len(all_segments_readable(tmp_path / "size")) == 200


def test_duplicates_are_dropped_and_counted(tmp_path):
    async def main():
        async with ExperienceLog(tmp_path, fsync=False) as log:
            assert log.last_step("a") is None
            futs = [log.append(transition("a", s)) for s in (0, 1, 2)]
            assert log.append(transition("a", 2)) is None
            assert log.append(transition("a", 1, episode=1)) is None
            futs.append(log.append(transition("b", 0)))
            assert await asyncio.gather(*futs) == [0, 1, 2, 3]
            assert (log.stats.duplicates, log.stats.appended, log.last_step("a")) == (2, 4, 2)
        async with ExperienceLog(tmp_path) as log:
            assert log.append(transition("a", 2)) is None
            assert await log.append(transition("a", 3)) == 4

    run(main())
    assert [(t.session, t.step) for t in read_transitions(tmp_path)] == [("a", 0), ("a", 1), ("a", 2), ("b", 0),
                                                                          ("a", 3)]


def test_camera_images_are_logged_whole(tmp_path):
    async def main():
        async with ExperienceLog(tmp_path) as log:
            t0 = time.perf_counter()
            futs = [log.append(transition("cam", i, image=(224, 224, 3))) for i in range(20)]
            futs.append(log.append(transition("cam", 20, image=(1080, 1920, 3))))
            await asyncio.gather(*futs)
            return time.perf_counter() - t0

    run(main())
    logged = list(read_transitions(tmp_path))
    assert len(logged) == 21
    for t in logged:
        shape = (1080, 1920, 3) if t.step == 20 else (224, 224, 3)
        expect = transition("cam", t.step, image=shape).observation[1]
        image = codec.decode(t.observation[1])
        assert image.shape == shape and image.tobytes() == expect.data
    disk = sum(p.stat().st_size for _, p in list_segments(tmp_path))
    raw = 20 * 224 * 224 * 3 + 1080 * 1920 * 3
    assert raw < disk < raw * 1.05


def test_bad_config_and_misuse_are_named(tmp_path):
    with pytest.raises(ValueError, match="segment_bytes"):
        ExperienceLog(tmp_path, segment_bytes=10)
    with pytest.raises(ValueError, match="fsync_interval_s"):
        ExperienceLog(tmp_path, fsync_interval_s=-1)
    log = ExperienceLog(tmp_path)
    with pytest.raises(LogError, match="start"):
        log.append(transition("a", 0))

    async def two_writers():
        async with ExperienceLog(tmp_path / "shared"):
            with pytest.raises(LogError, match="another experience log"):
                await ExperienceLog(tmp_path / "shared").start()

    run(two_writers())
    (tmp_path / "segment-000001.mcap").write_bytes(b"not an mcap file at all")
    with pytest.raises(ValueError, match="segment-000001.mcap"):
        run(log.start())


def test_reader_tolerates_the_open_segment(tmp_path):
    async def main():
        async with ExperienceLog(tmp_path) as log:
            await asyncio.gather(*(log.append(transition("a", i)) for i in range(10)))
            seg = list_segments(tmp_path)[-1][1]
            with open(seg, "ab") as f:  # a record being written: a header promising more bytes than there are
                f.write(struct.pack("<BQ", 0x05, 1000) + b"\0" * 10)
            assert [t.step for t in read_transitions(tmp_path)] == list(range(10))
            assert [t.step for t in read_transitions(tmp_path, from_offset=7)] == [7, 8, 9]

    run(main())


def test_reading_while_the_log_writes_and_rotates_sees_a_gapless_prefix(tmp_path):
    problems: list[str] = []
    reads: list[int] = []

    def reader(stop):
        while not stop.is_set() and len(reads) < 10_000:
            offsets = [t.offset for t in read_transitions(tmp_path)]
            if offsets != list(range(len(offsets))):
                problems.append(f"gap: {len(offsets)} read, first missing "
                                f"{next(i for i, o in enumerate(offsets) if o != i)}")
            reads.append(len(offsets))

    async def main():
        import threading

        stop = threading.Event()
        async with ExperienceLog(tmp_path, segment_bytes=8 << 10, fsync=False) as log:
            thread = threading.Thread(target=reader, args=(stop,))
            thread.start()
            for i in range(0, 3000, 50):
                await asyncio.gather(*(log.append(transition("a", k)) for k in range(i, i + 50)))
        stop.set()
        await asyncio.to_thread(thread.join)

    run(main())
    assert not problems, problems[:3]
    assert len(reads) > 1 and reads == sorted(reads)
    assert len(list(read_transitions(tmp_path))) == 3000
