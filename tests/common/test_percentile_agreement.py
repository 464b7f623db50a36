"""The console's p99, `tether sim`'s p99 and the edge's p99 are one definition: same samples, same figures.

The issue found them differing (the console took nearest rank over its window, `tether sim` and the
edge numpy's linear interpolation). The samples below are chosen so the two definitions disagree.
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import numpy as np

from bridge.common.percentiles import summary_ms
from bridge.gateway.session.figures import FleetFigures
from bridge.metrics import GatewayMetrics
from bridge.ros2.edge_stats import EdgeStats
from protos.tether.v1 import bridge_pb2
from sim.client import SimStats

# 98 quick steps and two slow ones, in ns: numpy's linear p99 is 50.5 ms, nearest rank 50 ms
SAMPLES_NS = [1_000_000 + 1000 * i for i in range(98)] + [50_000_000, 100_000_000]


def _console_row(samples_ns: list[int]) -> dict:
    """The row the console (and `tether status`) shows, fed through the gateway's real FleetFigures."""
    figures = FleetFigures(GatewayMetrics())
    guard = SimpleNamespace(clamped=0, rate_limited=0, watchdog=0, estop=0, estopped=False)
    session = SimpleNamespace(id="s-1", source="127.0.0.1", policy=SimpleNamespace(name="hopper", version=1),
                              stats=SimpleNamespace(steps=len(samples_ns), episodes=0, guard=guard))
    figures.opened(session, bridge_pb2.Hello(session_id="s-1"))
    for ns in samples_ns:
        reply = bridge_pb2.ServerMessage(action=bridge_pb2.Action(
            timing=bridge_pb2.Timing(t_sent_ns=10, gateway_recv_ns=10, infer_start_ns=10, infer_end_ns=10,
                                     gateway_send_ns=10 + ns)))
        figures.observed(session, bridge_pb2.Observation(), reply)
    (row,) = figures.rows({"s-1": session}, held=lambda s: False)
    return row


def test_console_sim_and_edge_report_the_same_p50_p99():
    row = _console_row(SAMPLES_NS)
    sim = SimStats(rtt_ns=deque(SAMPLES_NS)).rtt_ms()
    edge = EdgeStats()
    edge.rtt_ns.extend(SAMPLES_NS)
    expected = summary_ms(SAMPLES_NS)
    assert expected == {"p50": 1.049, "p99": 50.0}
    assert {"p50": row["latency_p50_ms"], "p99": row["latency_p99_ms"]} == expected
    assert sim == expected
    assert edge.rtt_ms() == expected
    assert round(float(np.percentile(SAMPLES_NS, 99)) / 1e6, 3) != expected["p99"]  # the samples do tell them apart
