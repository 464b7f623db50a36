"""Two experience sinks as one: a transition is durable once both have it (the local MCAP log and the
JetStream stream, `tether gateway --experience-dir DIR --experience nats://...`).

    log = TeeLog(local, stream)           # both started and closed by their owner
    fut = log.append(t)                   # resolves when both acknowledged; None when both had it
    log.durable_step("robot-1")           # the lower of the two
"""

from __future__ import annotations

import asyncio

from protos import experience_pb2

__all__ = ["TeeLog"]


class TeeLog:
    """`append` to both sinks; durable where both are (see the module docstring)."""

    def __init__(self, first, second):
        """`first`: the local log (its figures are `stats`); `second`: a JetStreamLog (serializes in `append`)."""
        self.first, self.second = first, second

    def append(self, transition: experience_pb2.Transition) -> asyncio.Future | None:
        later = self.second.append(transition)  # the stream serializes it now: then the local log may own it
        futures = [f for f in (self.first.append(transition), later) if f is not None]
        if not futures:
            return None
        return futures[0] if len(futures) == 1 else asyncio.gather(*futures)

    def resume(self, session: str) -> None:
        self.first.resume(session)
        self.second.resume(session)

    def forget(self, session: str) -> None:
        """Another gateway owned `session` since: both sinks take its steps again (ExperienceLog.forget)."""
        self.first.forget(session)
        self.second.forget(session)

    def last_step(self, session: str) -> int | None:
        steps = [s for s in (self.first.last_step(session), self.second.last_step(session)) if s is not None]
        return max(steps) if steps else None

    def durable_step(self, session: str) -> int | None:
        a, b = self.first.durable_step(session), self.second.durable_step(session)
        return None if a is None or b is None else min(a, b)

    async def prepare(self, sessions) -> None:
        for sink in (self.first, self.second):
            if (prepare := getattr(sink, "prepare", None)) is not None:
                await prepare(sessions)

    @property
    def degraded(self) -> str | None:
        whys = [w for w in (self.first.degraded, self.second.degraded) if w]
        return "; ".join(whys) or None

    @property
    def stats(self):
        return self.first.stats  # the local log's figures (the stream's: `second.stats`)

    async def close(self) -> None:
        try:
            await self.first.close()
        finally:
            await self.second.close()
