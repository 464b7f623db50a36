"""What the client sessions of one run counted: steps, episodes, errors, round trips, versions, replays.

    stats = ClientStats()
    stats.rtt_ns.append(1_200_000)       # one send -> Action round trip
    stats.summary()["rtt_ms"]            # {"p50": 1.2, "p99": 1.2}: nearest rank (bridge.common.percentiles)

The percentiles are `bridge.common.percentiles`', the one definition the console, the edge and the
benchmarks also print.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from statistics import fmean

from bridge.common.percentiles import summary_ms

__all__ = ["ClientStats"]


@dataclass
class ClientStats:
    """Counters shared by all sessions of one run (one event loop: no locks)."""

    steps: int = 0                 # env steps answered (one per reply to a FIRST/MID observation; N per vector step)
    episodes: int = 0              # episodes ended with a LAST observation
    errors: Counter[str] = field(default_factory=Counter)        # StepError code names, INVALID_ACTION
    rtt_ns: deque[int] = field(default_factory=lambda: deque(maxlen=200_000))  # send -> Action
    policy_versions: Counter[int] = field(default_factory=Counter)
    returns: deque[float] = field(default_factory=lambda: deque(maxlen=1000))  # client-side returns
    sessions: int = 0              # sessions welcomed by a gateway
    reconnects: int = 0            # reconnects after a gateway went away (to it again or the next one)
    cut_episodes: int = 0          # episodes ended early (truncated LAST) because the budget ran out
    replayed: int = 0              # steps resent as Replay after a reconnect
    held: int = 0                  # env steps answered with the safe action under an operator e-stop
    idle_ticks: int = 0            # chunks: env steps that found no queued action (the chunk came too late)
    chunk_delays: Counter[int] = field(default_factory=Counter)  # chunks: measured delays d (ticks) -> count
    elapsed_s: float = 0.0

    def rtt_ms(self) -> dict[str, float | None]:
        return summary_ms(self.rtt_ns)

    @property
    def newest_version(self) -> int | None:
        return max(self.policy_versions, default=None)

    def recent_return(self, episodes: int = 20) -> float | None:
        """The mean return of the last `episodes` episodes."""
        recent = list(self.returns)[-episodes:]
        return fmean(recent) if recent else None

    def summary(self) -> dict:
        recent = self.recent_return()
        return {"steps": self.steps,
                "steps_per_s": round(self.steps / self.elapsed_s, 1) if self.elapsed_s > 0 else 0.0,
                "sessions": self.sessions, "episodes": self.episodes,
                "mean_return": round(fmean(self.returns), 3) if self.returns else None,
                "rtt_ms": self.rtt_ms(), "errors": dict(self.errors),
                "policy_versions": {str(v): n for v, n in sorted(self.policy_versions.items())},
                "recent_return": None if recent is None else round(recent, 3),
                "reconnects": self.reconnects, "replayed": self.replayed, "held": self.held,
                "elapsed_s": round(self.elapsed_s, 3),
                **({"idle_ticks": self.idle_ticks, "chunk_delays": {str(d): n for d, n in sorted(
                    self.chunk_delays.items())}} if self.chunk_delays else {})}

    def status_line(self, name: str = "sim") -> str:
        s, rtt = self.summary(), self.rtt_ms()
        rtt_text = "-" if rtt["p50"] is None else f"{rtt['p50']:.2f}/{rtt['p99']:.2f} ms"
        recent = self.recent_return()
        versions = sorted(self.policy_versions) or ["-"]
        version_text = f"v{versions[0]}" if len(versions) == 1 else f"v{versions[0]}..v{versions[-1]}"
        return (f"{name} {s['elapsed_s']:7.1f}s  sessions {s['sessions']}  steps {s['steps']} "
                f"({s['steps_per_s']:.0f}/s)  episodes {s['episodes']}  "
                f"return(last 20) {'-' if recent is None else f'{recent:.1f}'}  rtt p50/p99 {rtt_text}  "
                f"errors {sum(self.errors.values())}  versions {version_text}")
