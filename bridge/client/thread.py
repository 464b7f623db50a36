"""A `Session` on its own thread and event loop, for blocking callers (the edge node's control loop).

    link = SessionThread(["10.0.0.1:50051", "10.0.0.2:50051"], hello, credentials=creds,
                         on_up=lambda welcome: ..., on_down=lambda reason: ...)
    link.start()
    link.wait_up(timeout_s=5.0)                  # True once a gateway welcomed the session
    future = link.submit(observation)            # concurrent.futures.Future[ServerMessage], or None while down
    reply = future.result(timeout=0.05)          # the caller keeps its own deadline (the edge's watchdog)
    link.close()

`submit` never blocks: while no stream is up it returns None (the observation is not sent, the caller
acts safely). Steps are sent in order, one at a time. A broken stream is taken over by the session: it
moves to the next address, says Hello with the same id and replays what the gateway's log lacks, for as
long as `reconnect_s` (default: until `close`); `on_down` and `on_up` fire on the link's thread as that
happens (keep them short: post an event). A step in flight across a failover is answered by the new
gateway, or its future fails with the session's error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import threading
from collections.abc import Callable, Sequence

from bridge.client.channel import Credentials
from bridge.client.session import Session, SessionError
from protos.tether.v1 import bridge_pb2

__all__ = ["SessionThread"]


class SessionThread:
    """One session kept up by a thread; the caller only calls `submit`, `wait_up` and `close`."""

    def __init__(self, addresses: str | Sequence[str], hello: bridge_pb2.Hello, *,
                 credentials: Credentials | None = None, connect_timeout_s: float = 2.0,
                 reply_timeout_s: float = 10.0, reconnect_s: float = math.inf,
                 on_up: Callable[[bridge_pb2.Welcome], None] | None = None,
                 on_down: Callable[[str], None] | None = None, name: str = "tether-session"):
        self._up = threading.Event()
        self._user_up, self._user_down = on_up, on_down
        self.session = Session(addresses, hello, credentials=credentials, connect_timeout_s=connect_timeout_s,
                               reply_timeout_s=reply_timeout_s, reconnect_s=reconnect_s,
                               on_up=self._went_up, on_down=self._went_down)
        self.error: BaseException | None = None   # why the session ended, if it failed
        self._loop = asyncio.new_event_loop()
        self._queue: asyncio.Queue | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def up(self) -> bool:
        return self._up.is_set()

    def wait_up(self, timeout_s: float | None = None) -> bool:
        return self._up.wait(timeout_s)

    def submit(self, observation: bridge_pb2.Observation) -> concurrent.futures.Future | None:
        """Queue one observation; a future of its reply, or None (not sent) while no stream is up."""
        if not self._up.is_set() or self._queue is None or self._stopping:
            return None
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (observation, future))
        except RuntimeError:  # the link thread ended (its loop closed) since the check above
            return None
        return future

    def close(self, *, timeout_s: float = 5.0) -> None:
        """Half-close the stream (the gateway ends it cleanly) and stop the thread."""
        self._stopping = True
        if self._thread.is_alive() and self._queue is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the thread is ending anyway
                self._loop.call_soon_threadsafe(self._queue.put_nowait, None)
        self._thread.join(timeout_s)

    # -- the link thread ---------------------------------------------------------------------------

    def _went_up(self, welcome: bridge_pb2.Welcome) -> None:
        self._up.set()
        if self._user_up is not None:
            self._user_up(welcome)

    def _went_down(self, reason: str) -> None:
        self._up.clear()
        if self._user_down is not None:
            self._user_down(reason)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            pending = asyncio.all_tasks(self._loop)  # e.g. the session's reader: cancelled, not left to warn
            for task in pending:
                task.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def _main(self) -> None:
        self._queue = asyncio.Queue()
        try:
            while not self._stopping:  # the first Hello: keep trying every address until one answers
                try:
                    await self.session.open()
                    break
                except ConnectionError as e:
                    self._went_down(str(e))
            while (item := await self._queue.get()) is not None:
                observation, future = item
                try:
                    reply = await self.session.step(observation)
                except (ConnectionError, SessionError, TimeoutError) as e:
                    future.set_exception(e)
                    raise
                future.set_result(reply)
            await self.session.close()
        except (ConnectionError, SessionError, TimeoutError) as e:
            self.error = e
            self._went_down(f"session ended: {e}")
        finally:
            self._up.clear()
            while not self._queue.empty():
                item = self._queue.get_nowait()
                if item is not None:
                    item[1].set_exception(ConnectionError("the session closed"))
            await self.session.aclose()
