"""A plain Foxglove WebSocket client (on `websockets`, no Tether code), for tests and benchmarks of `tether view`:

    async with FoxgloveClient.connect(url, token=None) as c:     # serverInfo read; c.channels by topic
        await c.wait_channels(lambda topics: "/arm_1/state" in topics)
        await c.subscribe(["/arm_1/state", "/arm_1/camera/top"])
        topic, log_time, payload = await c.next_message()
    async with slow_viewer(url) as c:                            # subscribes to everything, then never reads
        ...
    python -m tests.support.foxglove_client ws://127.0.0.1:8765 --viewers 4 [--slow] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect

__all__ = ["FoxgloveClient", "run_viewers", "slow_viewer"]

SUBPROTOCOL = "foxglove.websocket.v1"
_HEADER = struct.Struct("<BIQ")


class FoxgloveClient:
    def __init__(self, ws: ClientConnection):
        self.ws = ws
        self.server_info: dict | None = None
        self.channels: dict[str, dict] = {}          # topic -> its advertisement
        self.statuses: list[dict] = []               # status messages from the server
        self.by_sub: dict[int, str] = {}             # subscription id -> topic
        self.received = 0
        self._next_sub = 1

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, url: str, token: str | None = None, *, header: bool = False, max_queue: int = 64,
                      sock: socket.socket | None = None, **kw) -> AsyncIterator[FoxgloveClient]:
        """Connects (the token as `?token=` or, with `header`, `Authorization: Bearer`) and reads serverInfo;
        `kw`: more of websockets' `connect` (origin=, ssl=)."""
        headers = {"Authorization": f"Bearer {token}"} if token and header else None
        target = f"{url}/?token={token}" if token and not header else url
        async with connect(target, subprotocols=[SUBPROTOCOL], additional_headers=headers, max_size=64 << 20,
                           max_queue=max_queue, sock=sock, compression=None, open_timeout=30,
                           close_timeout=1, **kw) as ws:
            client = cls(ws)
            assert ws.subprotocol == SUBPROTOCOL, ws.subprotocol
            first = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert first["op"] == "serverInfo", first
            client.server_info = first
            yield client

    def _take(self, frame: str | bytes):
        """A data frame as (topic, log time, payload); a control message is recorded and gives None."""
        if isinstance(frame, bytes):
            op, sub, log_time = _HEADER.unpack_from(frame)
            assert op == 1, op
            self.received += 1
            return self.by_sub[sub], log_time, frame[_HEADER.size:]
        msg = json.loads(frame)
        if msg["op"] == "advertise":
            self.channels.update({c["topic"]: c for c in msg["channels"]})
        elif msg["op"] == "unadvertise":
            gone = set(msg["channelIds"])
            self.channels = {t: c for t, c in self.channels.items() if c["id"] not in gone}
        elif msg["op"] == "status":
            self.statuses.append(msg)
        return None

    async def pump(self, timeout: float = 30.0):
        """Reads one frame: (topic, log time, payload) for data, else None."""
        return self._take(await asyncio.wait_for(self.ws.recv(), timeout))

    async def wait_channels(self, ready: Callable[[dict[str, dict]], bool], timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while not ready(self.channels):
            left = deadline - time.monotonic()
            assert left > 0, f"channels never got ready: {sorted(self.channels)}"
            await self.pump(left)
        return self.channels

    async def wait_status(self, timeout: float = 30.0) -> dict:
        seen = len(self.statuses)
        deadline = time.monotonic() + timeout
        while len(self.statuses) == seen:
            left = deadline - time.monotonic()
            assert left > 0, "no status message came"
            await self.pump(left)
        return self.statuses[-1]

    async def subscribe(self, topics) -> list[int]:
        subs = []
        for topic in topics:
            sid, self._next_sub = self._next_sub, self._next_sub + 1
            self.by_sub[sid] = topic
            subs.append({"id": sid, "channelId": self.channels[topic]["id"]})
        await self.ws.send(json.dumps({"op": "subscribe", "subscriptions": subs}))
        return [s["id"] for s in subs]

    async def send_raw(self, data: str | bytes) -> None:
        await self.ws.send(data)

    async def next_message(self, timeout: float = 30.0, topic: str | None = None) -> tuple[str, int, bytes]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no message{f' on {topic}' if topic else ''} within {timeout} s"
            got = await self.pump(left)
            if got is not None and (topic is None or got[0] == topic):
                return got


@contextlib.asynccontextmanager
async def slow_viewer(url: str, token: str | None = None, *, ready: Callable[[dict], bool] = bool,
                      rcvbuf: int = 4096) -> AsyncIterator[FoxgloveClient]:
    """A viewer that subscribes to every channel advertised once `ready(channels)` holds and then never reads: a
    small receive buffer, and the client library stops reading after one queued frame."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, port))
    async with FoxgloveClient.connect(url, token, max_queue=1, sock=sock) as c:
        await c.wait_channels(ready)
        await c.subscribe(list(c.channels))
        yield c


async def run_viewers(url: str, count: int, *, seconds: float, slow: bool = False, token: str | None = None,
                      enough: int | None = None) -> list[int]:
    """`count` viewers subscribed to every channel for `seconds` (reading: channels advertised later too; or
    `slow`: the channels there once connected, never read), a reader leaving early once it has `enough` frames;
    the frames each received."""
    async def one() -> int:
        if slow:
            async with slow_viewer(url, token):
                await asyncio.sleep(seconds)
                return 0
        async with FoxgloveClient.connect(url, token) as c:
            await c.wait_channels(bool)
            subscribed = set(c.channels)
            await c.subscribe(sorted(subscribed))
            deadline = time.monotonic() + seconds
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                while time.monotonic() < deadline and (enough is None or c.received < enough):
                    await c.pump(max(deadline - time.monotonic(), 0.001))
                    if new := set(c.channels) - subscribed:  # robots that appeared since: watched too
                        subscribed |= new
                        await c.subscribe(sorted(new))
            return c.received

    return list(await asyncio.gather(*(one() for _ in range(count))))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="N Foxglove viewers of a `tether view`")
    p.add_argument("url")
    p.add_argument("--viewers", type=int, default=1)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--slow", action="store_true", help="viewers that never read")
    p.add_argument("--token")
    a = p.parse_args()
    print(json.dumps({"received": asyncio.run(run_viewers(a.url, a.viewers, seconds=a.seconds, slow=a.slow,
                                                          token=a.token))}))
