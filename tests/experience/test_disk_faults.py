"""The experience log under disk faults (issue 14, point 5): a write error degrades, never aborts;
the writer retries and resumes with nothing lost or torn; the queue is bounded; retention prunes."""

from __future__ import annotations

import asyncio
import os
import time
from types import SimpleNamespace

import pytest

from bridge.experience import ExperienceLog, read_transitions, segment
from bridge.experience.log import LogFull
from bridge.experience.segment import is_finished, list_segments
from bridge.metrics import GatewayMetrics
from tests.experience.helpers import mcap_transitions, transition
from tests.support.waiting import until


@pytest.fixture
def fault(tmp_path, monkeypatch):
    """A file that, while it exists, fails every segment write and fsync with the errno it names."""
    path = tmp_path / "fault"
    monkeypatch.setattr(segment, "_FAULTS", str(path))
    return path


def test_enospc_degrades_keeps_accepting_and_resumes_with_every_transition_in_order(tmp_path, fault):
    log_dir = tmp_path / "log"

    async def scenario():
        async with ExperienceLog(log_dir, segment_bytes=16 << 10, fsync_interval_s=0.001,
                                 retry_min_s=0.01, retry_max_s=0.05) as log:
            futs = [log.append(transition(f"s{i % 2}", i // 2)) for i in range(40)]
            await asyncio.gather(*futs)
            assert log.degraded is None and log.durable_step("s0") == 19
            fault.write_text("ENOSPC")
            during = [log.append(transition(f"s{i % 2}", i // 2)) for i in range(40, 400)]  # spans rotations
            await until(lambda: log.degraded is not None, "degraded")
            assert log.degraded.startswith("ENOSPC"), log.degraded
            frozen = log.durable_offset
            await until(lambda: log.stats.write_errors >= 3, "several retries failing")
            assert log.durable_offset == frozen <= 40 and not any(f.done() for f in during[-10:])
            assert log.durable_step("s0") <= 19 + (frozen - 40) and log.stats.write_errors >= 3
            assert log.stats.degraded and log.stats.pending == 400 - frozen
            scraped = GatewayMetrics(_gateway_of(log)).exposition().decode()
            assert "tether_experience_degraded 1.0" in scraped and "tether_experience_write_errors_total" in scraped
            fault.unlink()
            offsets = await asyncio.wait_for(asyncio.gather(*during), 30)
            assert offsets == list(range(40, 400)) and log.degraded is None
            assert (log.durable_step("s0"), log.durable_step("s1")) == (199, 199)
            scraped = GatewayMetrics(_gateway_of(log)).exposition().decode()
            assert "tether_experience_degraded 0.0" in scraped and "tether_experience_pending 0.0" in scraped

    asyncio.run(scenario())
    logged = list(read_transitions(log_dir))
    assert [t.offset for t in logged] == list(range(400))
    assert [(t.session, t.step) for t in logged] == [(f"s{i % 2}", i // 2) for i in range(400)]
    files = [p for _, p in list_segments(log_dir)]
    assert len(files) > 2 and all(is_finished(p) for p in files)  # no torn record left in any segment
    assert sum(len(mcap_transitions(p)) for p in files) == 400    # and an MCAP reader agrees


def test_a_fault_at_close_loses_only_what_was_never_durable_and_the_directory_recovers(tmp_path, fault):
    log_dir = tmp_path / "log"

    async def scenario():
        log = ExperienceLog(log_dir, fsync_interval_s=0.001, retry_min_s=0.01)
        await log.start()
        await asyncio.gather(*[log.append(transition("a", i)) for i in range(10)])
        fault.write_text("EIO")
        late = [log.append(transition("a", i)) for i in range(10, 15)]
        await until(lambda: log.degraded is not None, "degraded")
        await log.close()  # gives up on what the disk refused: their futures fail, close does not hang
        assert all(f.done() and f.exception() is not None for f in late)
        fault.unlink()
        async with ExperienceLog(log_dir) as again:
            assert again.last_step("a") == 9 and again.durable_offset == 10
            await again.append(transition("a", 10))

    asyncio.run(scenario())
    assert [t.step for t in read_transitions(log_dir)] == list(range(11))


def test_at_the_bound_a_session_is_refused_in_order_until_it_resumes(tmp_path, fault):
    async def scenario():
        async with ExperienceLog(tmp_path / "log", max_pending=5, fsync_interval_s=0.001,
                                 retry_min_s=0.01) as log:
            fault.write_text("ENOSPC")
            kept = [log.append(transition("a", i)) for i in range(5)]
            with pytest.raises(LogFull, match="session 'a' is not logged from step 5"):
                log.append(transition("a", 5))
            with pytest.raises(LogFull):
                log.append(transition("b", 0))
            fault.unlink()
            await asyncio.gather(*kept)
            with pytest.raises(LogFull):  # room again, but 'a' would have a hole at 5: still refused
                log.append(transition("a", 6))
            assert log.durable_step("a") == 4 and log.stats.refused == 3
            log.resume("a")  # it connected again and replays from step 5
            await log.append(transition("a", 5))
            await log.append(transition("a", 6))
            assert log.last_step("b") is None
            log.resume("b")
            await log.append(transition("b", 0))
        return log.stats

    stats = asyncio.run(scenario())
    assert stats.refused == 3
    assert [(t.session, t.step) for t in read_transitions(tmp_path / "log")] == \
        [("a", i) for i in range(7)] + [("b", 0)]


def test_the_bound_in_bytes(tmp_path, fault):
    async def scenario():
        sizes = [_as_logged(transition("a", i), offset=i).ByteSize() for i in range(3)]
        # two measured stay under the bound, three reach it: whether or not the writer thread measured
        # the first ones before the third was appended
        async with ExperienceLog(tmp_path / "log", max_pending_bytes=sum(sizes), retry_min_s=0.01) as log:
            fault.write_text("ENOSPC")
            kept = [log.append(transition("a", i)) for i in range(3)]
            await until(lambda: log.stats.pending_bytes >= sum(sizes), "the writer measured them")
            with pytest.raises(LogFull):
                log.append(transition("b", 0))
            fault.unlink()
            await asyncio.gather(*kept)
            assert log.stats.pending_bytes == 0

    asyncio.run(scenario())


def test_retention_prunes_finished_segments_oldest_first_by_size_and_by_age(tmp_path):
    log_dir = tmp_path / "log"

    async def fill(n: int, start: int = 0, **kw):
        async with ExperienceLog(log_dir, segment_bytes=8 << 10, fsync_interval_s=0, **kw) as log:
            for i in range(start, start + n):
                await log.append(transition("a", i))
        return log.stats  # after close: the writer prunes from its loop

    asyncio.run(fill(300))
    before = [p for _, p in list_segments(log_dir)]
    total = sum(p.stat().st_size for p in before)
    assert len(before) >= 8
    stats = asyncio.run(fill(1, start=300, retention_bytes=total // 2))  # pruned at start, and as it rotates
    after = [p for _, p in list_segments(log_dir)]
    assert stats.pruned >= 3 and stats.pruned_bytes > 0
    assert sum(p.stat().st_size for p in after) <= total // 2 + (8 << 10) * 2
    kept = [p for p in after if p in before]
    assert kept and kept == before[len(before) - len(kept):]  # the oldest went, the newest stayed
    assert before[0] not in after and before[-1] in after
    logged = [t.step for t in read_transitions(log_dir)]
    assert logged == list(range(logged[0], 301)) and logged[0] > 0   # a suffix, in order, still readable

    old = time.time() - 3 * 3600
    for p in after[:-1]:
        os.utime(p, (old, old))

    async def by_age():
        async with ExperienceLog(log_dir, retention_s=3600) as log:
            assert log.last_step("a") == 300  # the newest finished segment (every session's last step) stays
            await until(lambda: log.stats.pruned == len(after) - 1, "age pruning")
    asyncio.run(by_age())
    assert [p for _, p in list_segments(log_dir)] == after[-1:]
    with pytest.raises(ValueError, match="retention_s"):
        ExperienceLog(log_dir, retention_s=0)


def _gateway_of(log) -> SimpleNamespace:
    """A MetricsSource (bridge.gateway.views) with nothing but the log: no sessions, registry or rollout."""
    return SimpleNamespace(sessions={}, experience=log, registry=None, rollout=None)


def _as_logged(t, *, offset: int):
    """The transition as the log serializes it (append assigns its offset)."""
    t.offset = offset
    return t
