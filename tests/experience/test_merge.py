"""Merging several gateways' logs by ownership epoch (bridge.experience.merge): per (session, step) the newest
epoch's record, and nothing an older epoch wrote past where a newer one took the session over."""

from __future__ import annotations

from bridge.experience.merge import merge_transitions
from protos import experience_pb2


def _t(session: str, step: int, epoch: int, gateway: str = "") -> experience_pb2.Transition:
    return experience_pb2.Transition(session=session, step=step, owner_epoch=epoch, source=gateway)


def test_a_moved_session_keeps_each_step_once_from_its_newest_owner():
    # A (epoch 1) acknowledged 0..4, wrote 5..7 unacknowledged and 8 late (cut off); the client replayed 5..7 to B
    a = [_t("s", i, 1, "a") for i in range(9)]
    b = [_t("s", i, 2, "b") for i in range(5, 12)]
    merged = merge_transitions(a + b)
    assert [(t.step, t.owner_epoch) for t in merged.transitions] == [(i, 1) for i in range(5)] + [
        (i, 2) for i in range(5, 12)]
    assert merged.stale == 4 and merged.duplicates == 0   # A's 5..8: 5..7 replayed to B, 8 written late
    assert merged.epochs == {"s": [1, 2]}


def test_a_late_write_past_everything_the_new_owner_logged_is_still_dropped():
    merged = merge_transitions([_t("s", 0, 1), _t("s", 1, 1), _t("s", 1, 2), _t("s", 9, 1)])
    assert [(t.step, t.owner_epoch) for t in merged.transitions] == [(0, 1), (1, 2)]
    assert merged.stale == 2


def test_back_to_the_first_gateway_a_third_epoch_wins():
    merged = merge_transitions([_t("s", i, 1) for i in range(6)] + [_t("s", i, 2) for i in range(3, 8)]
                               + [_t("s", i, 3) for i in range(6, 10)])
    assert [(t.step, t.owner_epoch) for t in merged.transitions] == (
        [(i, 1) for i in range(3)] + [(i, 2) for i in range(3, 6)] + [(i, 3) for i in range(6, 10)])


def test_logs_without_ownership_merge_as_before_one_copy_per_step():
    merged = merge_transitions([_t("s", i, 0) for i in range(4)] + [_t("s", i, 0) for i in range(2, 6)]
                               + [_t("t", 0, 0)])
    assert [(t.session, t.step) for t in merged.transitions] == [("s", i) for i in range(6)] + [("t", 0)]
    assert merged.duplicates == 2 and merged.stale == 0


def test_tether_log_merge_writes_the_merged_log(tmp_path, capsys):
    import asyncio
    import json

    from bridge.experience import ExperienceLog, read_transitions
    from bridge.experience.tool import main

    async def write(directory, records):
        async with ExperienceLog(directory, fsync=False) as log:
            await asyncio.gather(*(log.append(t) for t in records))

    asyncio.run(write(tmp_path / "a", [_t("s", i, 1) for i in range(9)]))
    asyncio.run(write(tmp_path / "b", [_t("s", i, 2) for i in range(5, 12)]))
    main(["merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "merged"), "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert (summary["transitions"], summary["stale"], summary["moved_sessions"]) == (12, 4, 1)
    assert [(t.step, t.owner_epoch, t.offset) for t in read_transitions(tmp_path / "merged")] == (
        [(i, 1, i) for i in range(5)] + [(i, 2, i) for i in range(5, 12)])
