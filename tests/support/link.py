"""A shaped network link on loopback: a TCP proxy that delays and rate-limits each direction.

    with Link("127.0.0.1:50051", up=Shape(delay_s=0.05, rate_bps=20e6), down=Shape(delay_s=0.05)) as link:
        session = Session(link.address, hello)      # every byte crosses the link

Each direction is a FIFO link: a chunk read at time t occupies the wire for len * 8 / rate_bps after the
previous one leaves it (a token bucket of depth one chunk: the serialisation delay a slow link adds), then
arrives `delay_s` later (a number, or a function called per chunk: jitter). Deliveries never overtake each
other. The proxy runs on a thread of its own, binds 127.0.0.1 on a free port and stops with the block; the
loops are bounded by the connections the test makes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Link", "Shape"]


@dataclass(frozen=True)
class Shape:
    delay_s: float | Callable[[], float] = 0.0   # one-way delay per chunk (a function: drawn per chunk)
    rate_bps: float | None = None                # bits per second; None: as fast as loopback

    def delay(self) -> float:
        return max(0.0, self.delay_s() if callable(self.delay_s) else self.delay_s)


class Link:
    def __init__(self, target: str, *, up: Shape = Shape(), down: Shape = Shape()):
        self.target, self.up, self.down = target, up, down
        self.address = ""
        self.bytes_up = self.bytes_down = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="link", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    def __enter__(self) -> Link:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = f"{host}:{port}"

    async def _stop(self) -> None:
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        host, port = self.target.rsplit(":", 1)
        try:
            server_r, server_w = await asyncio.open_connection(host, int(port))
        except OSError:
            client_w.close()
            return
        for args in ((client_r, server_w, self.up, "bytes_up"), (server_r, client_w, self.down, "bytes_down")):
            task = asyncio.get_running_loop().create_task(self._carry(*args))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, shape: Shape,
                     counter: str) -> None:
        """Read chunks, deliver each at its arrival time on the shaped wire, in order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        deliver = asyncio.get_running_loop().create_task(self._deliver(queue, writer))
        wire_free = delivered = 0.0
        try:
            while chunk := await reader.read(65536):
                now = time.monotonic()
                wire_free = max(wire_free, now) + (len(chunk) * 8 / shape.rate_bps if shape.rate_bps else 0.0)
                delivered = max(delivered, wire_free + shape.delay())
                queue.put_nowait((delivered, chunk))
                setattr(self, counter, getattr(self, counter) + len(chunk))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            queue.put_nowait((0.0, b""))
            try:
                await deliver
            except asyncio.CancelledError:
                deliver.cancel()

    @staticmethod
    async def _deliver(queue: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                at, chunk = await queue.get()
                if not chunk:
                    break
                if (wait := at - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                writer.write(chunk)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
