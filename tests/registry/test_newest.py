"""bridge.registry.newest: the one "newest version per policy" the metrics and the console share."""

from __future__ import annotations

from bridge.registry import Registry, State
from bridge.registry.newest import newest_record, newest_versions, version_lags
from tests.registry.helpers import POLICY, add, reach, serving


def test_newest_over_registry_and_sessions(tmp_path):
    with Registry(tmp_path / "registry.sqlite") as registry:
        serving(registry)
        reach(registry, State.REJECTED)        # v2 rejected
        add(registry, 3)                        # v3 a candidate
        acting = [(POLICY, 1), (POLICY, 1), ("ant", 4)]   # "ant" only a session knows (no registry entry)
        assert newest_versions(registry, acting) == {POLICY: 3, "ant": 4}
        assert version_lags(newest_versions(registry, acting), acting) == {POLICY: 2, "ant": 0}
        registry.move(POLICY, 3, State.REJECTED, who="gate", why="failed")
        # rejected versions count as "newest" for the trainer's lag, not for the rollout's freshness
        assert newest_versions(registry, acting)[POLICY] == 3
        assert newest_versions(registry, acting, rejected=False)[POLICY] == 1
        assert newest_record(registry.versions(POLICY), rejected=False).version == 1
        assert newest_versions(registry, [], policies=["nobody"]) == {}


def test_the_console_and_metrics_report_the_same_lag(tmp_path):
    from types import SimpleNamespace

    from bridge.console.server import _freshness
    from bridge.metrics import GatewayMetrics

    with Registry(tmp_path / "registry.sqlite") as registry:
        serving(registry)
        add(registry, 2)
        add(registry, 5)
        sessions = {f"s{v}": SimpleNamespace(policy=SimpleNamespace(name=POLICY, version=v)) for v in (1, 2)}
        gw = SimpleNamespace(sessions=sessions, registry=registry, rollout=None, experience=None)
        scraped = GatewayMetrics(gw).exposition().decode()
        assert f'tether_policy_lag_versions{{policy="{POLICY}"}} 4.0' in scraped
        assert _freshness(gw) == (4, None)
