"""What an edge node counts and times (`EdgeStats`): the control thread writes it, anyone reads it.

Latencies are kept as the last 10,000 samples in nanoseconds and read as percentiles in ms
(nearest rank, bridge.common.percentiles: the console's and `tether sim`'s definition):

    >>> stats = EdgeStats()
    >>> stats.rtt_ms()
    {'p50': None, 'p99': None}
    >>> stats.rtt_ns.extend([1_000_000, 2_000_000, 3_000_000])
    >>> stats.rtt_ms()
    {'p50': 2.0, 'p99': 3.0}
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from bridge.common.percentiles import summary_ms

__all__ = ["EdgeStats"]


@dataclass
class EdgeStats:
    """Counters of one node (written by the control thread; read them from anywhere)."""

    observations: int = 0          # sent to the gateway
    actions: int = 0               # policy actions passed to the guard
    commands: int = 0              # command sets published, policy or safe
    safe_commands: int = 0         # of which the guard's safe action (watchdog, e-stop)
    connects: int = 0              # streams welcomed
    disconnects: int = 0           # welcomed streams lost
    overruns: int = 0              # control periods that started late by a whole period
    ticks: int = 0                 # control periods run
    starved: int = 0               # chunk mode: periods that found no queued action (after the first chunk)
    chunk_delays: Counter[int] = field(default_factory=Counter)  # chunk mode: measured delays d (ticks) -> count
    person_commands: int = 0       # of the commands, a person's (the intervention topic), through the guard
    overridden: int = 0            # policy actions not sent because a person's command held
    interventions: int = 0         # observations sent reporting a person's applied command (GuardReport.interventions)
    errors: Counter[str] = field(default_factory=Counter)   # StepError codes and the node's own
    skipped: Counter[str] = field(default_factory=Counter)  # periods without an observation, why
    rtt_ns: deque[int] = field(default_factory=lambda: deque(maxlen=10_000))  # observation -> reply
    # Of an action's round trip, the part inside the gateway (receive -> send) and, of that, Triton's
    # inference: differences of the gateway's own timestamps (Action.timing), so no clock is compared
    # with another machine's. rtt - gateway = the edge itself plus the network, both ways.
    gateway_ns: deque[int] = field(default_factory=lambda: deque(maxlen=10_000))
    inference_ns: deque[int] = field(default_factory=lambda: deque(maxlen=10_000))
    policy_version: int = 0

    def rtt_ms(self) -> dict[str, float | None]:
        return _percentiles_ms(self.rtt_ns)

    def gateway_ms(self) -> dict[str, float | None]:
        return _percentiles_ms(self.gateway_ns)

    def inference_ms(self) -> dict[str, float | None]:
        return _percentiles_ms(self.inference_ns)


def _percentiles_ms(samples_ns: deque[int]) -> dict[str, float | None]:
    return summary_ms(list(samples_ns))  # list(): one C call, safe while the control thread appends
