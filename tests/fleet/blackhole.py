"""A TCP proxy on loopback that can blackhole the port behind it: no reset, no FIN, the connections stay open,
nothing is forwarded (what a cut network cable or a partitioned switch does). What arrives meanwhile is held
and, on `unblock`, delivered in the order it came, one read at a time with `gap_s` between them (TCP's
retransmissions when the partition heals).

    proxy = Blackhole(target_port=gateway_port)
    await proxy.start()                  # proxy.address: 127.0.0.1:PORT
    proxy.block()                        # silence, connections open
    await proxy.unblock(gap_s=0.2)       # the held bytes, in order, then forwarding again
    await proxy.close()
"""

from __future__ import annotations

import asyncio
import contextlib


class Blackhole:
    def __init__(self, *, target_port: int):
        self.target_port = target_port
        self.blocked = False
        self.held: list[tuple[asyncio.StreamWriter, bytes]] = []  # (where to, bytes), in arrival order
        self.held_bytes = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.address = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def block(self) -> None:
        self.blocked = True

    async def unblock(self, *, gap_s: float = 0.0) -> int:
        """Deliver what was held (in order, `gap_s` apart), then forward again; returns the chunks delivered."""
        delivered = 0
        while self.held:
            writer, data = self.held.pop(0)
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.write(data)
                await writer.drain()
            delivered += 1
            if gap_s:
                await asyncio.sleep(gap_s)
        self.blocked = False
        return delivered

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers += [writer, up_writer]
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await src.read(65536):
                if self.blocked or self.held:
                    self.held.append((dst, data))
                    self.held_bytes += len(data)
                    continue
                dst.write(data)
                await dst.drain()
        with contextlib.suppress(Exception):
            if not self.blocked:
                dst.close()
