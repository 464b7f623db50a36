"""Audit reads are paginated from the newest end: RolloutStatus and the console ask for the newest N
events (one indexed read), never the whole log."""

from __future__ import annotations

import pytest

from bridge.registry import Registry, RegistryError
from tests.registry.helpers import POLICY, serving


def test_the_newest_events_come_in_pages_from_the_end(tmp_path):
    with Registry(tmp_path / "registry.sqlite") as registry:
        serving(registry)
        first = len(registry.events(POLICY))
        for i in range(1500):  # two policies' events interleaved: the pages keep to one policy
            registry.record_event(kind="estop", policy=POLICY if i % 3 else "walker", who="operator:alice",
                                  why=f"drill {i}")
        every = registry.events(POLICY, limit=10_000)
        assert len(every) == first + 1000

        page = registry.latest_events(POLICY, limit=20)
        assert page == every[-20:] and page[-1].why == "drill 1499"
        pages, before = [], None
        while batch := registry.latest_events(POLICY, limit=300, before_id=before):
            pages = batch + pages
            before = batch[0].id
        assert pages == every  # paging back reaches the first event, each once, in order
        assert registry.latest_events(limit=5) == registry.events(limit=10_000)[-5:]  # every policy
        assert registry.latest_events("nobody", limit=5) == []
        for bad in ({"limit": 0}, {"limit": 10_001}, {"before_id": 0}, {"before_id": True}, {"limit": 2.5}):
            with pytest.raises(RegistryError, match="events (limit|before_id)"):
                registry.latest_events(POLICY, **bad)


def test_the_newest_page_is_one_indexed_read(tmp_path):
    """The query walks the (policy, id) index backwards: its plan names the index and no sort step."""
    with Registry(tmp_path / "registry.sqlite") as registry:
        serving(registry)
        traced: list[str] = []
        registry._db.set_trace_callback(traced.append)
        registry.latest_events(POLICY, limit=20)
        registry._db.set_trace_callback(None)
        query = next(q for q in traced if "FROM events" in q)
        plan = " ".join(str(row[-1]) for row in registry._db.execute("EXPLAIN QUERY PLAN " + query))
        assert "events_policy" in plan and "TEMP B-TREE" not in plan, plan
