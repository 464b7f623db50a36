"""One clock: the robot-to-gateway clock offset, and every hop of a step's latency in the robot's clock.

Each Welcome and each Action is a clock sample (NTP's four times): the robot's send time `t_sent`, the
gateway's receive and send times, the robot's receive time `t_recv`. A sample's round trip is
`(t_recv - t_sent) - (gw_send - gw_recv)`; its offset estimate (gateway minus robot) is the midpoint
`((gw_recv - t_sent) + (gw_send - t_recv)) / 2`. Queueing adds delay to one direction at a time and biases
that sample by half of it, so the estimate is the offset of the minimum-round-trip sample in a window of
recent samples: the one that queued least (Mills' clock filter). What no two-way exchange can see is an
asymmetry present in every sample, the fastest included: it stays in the estimate as half its size.

    >>> clock = ClockOffset()
    >>> _ = clock.add(t_sent=1_000, gw_recv=51_100, gw_send=51_200, t_recv=1_400)  # 100 out, 200 back
    >>> _ = clock.add(t_sent=2_000, gw_recv=52_100, gw_send=52_200, t_recv=2_300)  # 100 each way
    >>> clock.offset_ns, clock.rtt_ns
    (50000, 200)
    >>> hops(Timing(t_sent_ns=2_000, gateway_recv_ns=52_100, infer_start_ns=52_110, batch_start_ns=52_120,
    ...             triton_start_ns=52_130, triton_end_ns=52_180, gateway_send_ns=52_200), 2_300, 50_000)
    Hops(observation_age=100, checks=10, queue=10, batch=10, triton=50, respond=20, reply=100)
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import astuple, dataclass

from protos.tether.v1.bridge_pb2 import Timing

__all__ = ["HOPS", "ClockOffset", "Hops", "Sample", "hops"]

HOPS = ("observation_age", "checks", "queue", "batch", "triton", "respond", "reply")


@dataclass(frozen=True)
class Sample:
    offset_ns: int   # gateway clock minus robot clock, as this sample sees it
    rtt_ns: int      # the network's round trip (the gateway's own time taken out)


class ClockOffset:
    """Minimum-round-trip offset over the last `window` samples (see the module doc)."""

    def __init__(self, window: int = 64):
        if window < 1:
            raise ValueError(f"window: expected >= 1, got {window}")
        self._samples: deque[Sample] = deque(maxlen=window)
        self._best: Sample | None = None
        self.count = 0

    def add(self, *, t_sent: int, gw_recv: int, gw_send: int, t_recv: int) -> Sample | None:
        """One exchange's four times (robot, gateway, gateway, robot clock); None if it is not a sample
        (a time missing, or the gateway's own time longer than the round trip: a clock stepped)."""
        if not (t_sent and gw_recv and gw_send and t_recv) or gw_send < gw_recv:
            return None
        rtt = (t_recv - t_sent) - (gw_send - gw_recv)
        if rtt < 0:
            return None
        sample = Sample(((gw_recv - t_sent) + (gw_send - t_recv)) // 2, rtt)
        if len(self._samples) == self._samples.maxlen and self._samples[0] is self._best:
            self._samples.append(sample)
            self._best = min(self._samples, key=lambda s: s.rtt_ns)
        else:
            self._samples.append(sample)
            if self._best is None or sample.rtt_ns <= self._best.rtt_ns:
                self._best = sample
        self.count += 1
        return sample

    @property
    def known(self) -> bool:
        return self._best is not None

    @property
    def offset_ns(self) -> int:
        """Gateway clock minus robot clock (0 before the first sample)."""
        return self._best.offset_ns if self._best is not None else 0

    @property
    def rtt_ns(self) -> int:
        """The round trip of the sample the offset comes from."""
        return self._best.rtt_ns if self._best is not None else 0


@dataclass(frozen=True)
class Hops:
    """One step's latency budget in nanoseconds, robot clock; the hops sum to the round trip."""

    observation_age: int   # robot send -> gateway receive
    checks: int            # receive -> into the batcher (spec checks, image decoding)
    queue: int             # waiting for a batch
    batch: int             # forming the batch (stacking rows)
    triton: int            # the Triton call
    respond: int           # rows back -> reply sent
    reply: int             # gateway send -> robot receive

    @property
    def total(self) -> int:
        return sum(astuple(self))


def hops(timing: Timing, t_recv: int, offset_ns: int) -> Hops:
    """A reply's hops, from its Timing, the robot's receive time and the clock offset (gateway - robot).
    A reply without batch or Triton times (a held or refused step) counts its gateway time as `checks`."""
    t = timing
    start, batch, triton, end = t.infer_start_ns, t.batch_start_ns, t.triton_start_ns, t.triton_end_ns
    if not (start and batch and triton and end):
        start = batch = triton = end = t.gateway_send_ns
    return Hops(observation_age=t.gateway_recv_ns - offset_ns - t.t_sent_ns, checks=start - t.gateway_recv_ns,
                queue=batch - start, batch=triton - batch, triton=end - triton, respond=t.gateway_send_ns - end,
                reply=t_recv - (t.gateway_send_ns - offset_ns))


def robot_clock(ahead_ns: int = 0) -> Callable[[], int]:
    """The robot's clock as a function: `time.time_ns`, or a clock `ahead_ns` ahead of it (tests, sims)."""
    return time.time_ns if not ahead_ns else (lambda: time.time_ns() + ahead_ns)
