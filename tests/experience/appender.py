"""A child process for the crash test: appends transitions and prints each acknowledged one.

    python tests/experience/appender.py LOG_DIR [SEGMENT_BYTES]

Prints `offset session step` once each append is durable; runs until killed (bounded by 10^6 steps).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bridge.experience import ExperienceLog  # noqa: E402
from tests.experience.helpers import transition  # noqa: E402


async def main(directory: str, segment_bytes: int) -> None:
    log = ExperienceLog(directory, segment_bytes=segment_bytes, fsync_interval_s=0.001)
    await log.start()
    start = {f"s{i}": (log.last_step(f"s{i}") or -1) + 1 for i in range(4)}

    def acked(fut, session, step):  # one write(2) of < PIPE_BUF bytes: a line is never split, even by a kill
        os.write(1, f"{fut.result()} {session} {step}\n".encode())

    os.write(1, b"ready\n")
    for n in range(1_000_000):
        session = f"s{n % 4}"
        step = start[session] + n // 4
        image = (32, 32, 3) if n % 5 == 0 else None
        fut = log.append(transition(session, step, image=image))
        fut.add_done_callback(lambda f, s=session, k=step: acked(f, s, k))
        if log.next_offset - log.durable_offset > 512:
            await log.wait_durable(log.next_offset - 256)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20))
