"""The experience log acknowledges only what session ownership confirms (bridge.experience.log, "Ownership"):
one check per group commit; a stale epoch is written but not acknowledged (Fenced, counted, on_fenced); a
store that does not answer holds acknowledgements back until a later group of the same epoch is confirmed."""

from __future__ import annotations

import asyncio

import pytest

from bridge.experience import read_transitions
from bridge.experience.log import ExperienceLog, Fenced
from protos import experience_pb2


def _t(session: str, step: int, epoch: int) -> experience_pb2.Transition:
    return experience_pb2.Transition(session=session, step=step, owner_epoch=epoch)


def test_only_current_epochs_are_acknowledged(tmp_path):
    current = {"a": 1, "b": 1}
    checks: list[set] = []
    fenced: list[tuple[str, int]] = []
    down = False

    def stale(pairs):
        checks.append(set(pairs))
        if down:
            raise ConnectionError("the store is down")
        return {(s, e) for s, e in pairs if current[s] != e}

    async def run():
        nonlocal down
        async with ExperienceLog(tmp_path, fsync=False, ownership=stale,
                                 on_fenced=lambda s, e: fenced.append((s, e))) as log:
            await asyncio.gather(log.append(_t("a", 0, 1)), log.append(_t("b", 0, 1)))
            assert (log.durable_step("a"), log.durable_step("b")) == (0, 0)
            current["b"] = 2  # another gateway claimed b
            ok, gone = log.append(_t("a", 1, 1)), log.append(_t("b", 1, 1))
            await ok
            with pytest.raises(Fenced, match="ownership epoch 1 is stale"):
                await gone
            assert (log.durable_step("a"), log.durable_step("b")) == (1, 0) and fenced == [("b", 1)]
            down = True
            await log.append(_t("a", 2, 1))  # written; not acknowledged: durable_step stays
            assert log.durable_step("a") == 1
            down = False
            await log.append(_t("a", 3, 1))  # confirmed current now: covers step 2 too
            assert log.durable_step("a") == 3
            return log.stats

    stats = asyncio.run(run())
    assert (stats.fenced, stats.unconfirmed) == (1, 1)
    assert all(len({s for s, _ in c}) == len(c) for c in checks)  # one pair per session and epoch per check
    assert [(t.session, t.step, t.owner_epoch) for t in read_transitions(tmp_path)] == [
        ("a", 0, 1), ("b", 0, 1), ("a", 1, 1), ("b", 1, 1), ("a", 2, 1), ("a", 3, 1)]  # on disk, all of them
