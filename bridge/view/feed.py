"""What `tether view` shows, from the gateway: its Experience stream (from the log's end) and its fleet status.

    feed = GatewayFeed("127.0.0.1:50051", Credentials.from_args(args), server=view_server)
    await feed.run()            # until cancelled: stream + Fleet polls, reconnecting with backoff

The stream starts at the log's current end (a subscription's first batch says where that is; one that starts
behind it jumps there) and every batch is acknowledged as soon as it arrives, before anything is translated or
sent, so the view never holds its subscription's window: a slow viewer costs that viewer its frames (counted
by the server), never the stream. Should the view itself fall more than `max_lag` transitions behind the log,
it jumps to the log's end (counted: `jumped`). Transitions are translated (bridge.experience.foxglove) only for
channels someone watches. E-stop state comes from `tether.v1.Fleet` status every `fleet_every_s`, sent at every
poll (a viewer that lost a frame sees it again); its log line only when it changes.
The gateway's Experience service needs the trainer role (or operator) when it checks tokens; Fleet status the
viewer role.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from bridge.client import Credentials
from bridge.client.experience import ExperienceClient
from bridge.client.fleet import FleetClient
from bridge.experience.foxglove import Translator
from bridge.view.server import ViewServer
from protos import experience_pb2, fleet_pb2

__all__ = ["GatewayFeed"]

log = logging.getLogger("tether.view")


class GatewayFeed:
    def __init__(self, address: str, credentials: Credentials | None = None, *, server: ViewServer,
                 policy: str = "", window: int = 1024, max_batch: int = 64, max_lag: int = 4096,
                 fleet_every_s: float = 1.0, backoff_s: tuple[float, float] = (0.1, 2.0)):
        self.address, self.credentials, self.server = address, credentials or Credentials(), server
        self.policy, self.window, self.max_batch, self.max_lag = policy, window, max_batch, max_lag
        self.fleet_every_s, self.backoff_s = fleet_every_s, backoff_s
        self.translator = Translator(wanted=server.wanted, estop_from_guard=False)
        self.acked_through = self.log_end = 0
        self.received = self.jumped = self.reconnects = self.fleet_polls = 0
        self.connected = False
        self.last_error = ""

    def status(self) -> dict:
        return {"gateway": self.address, "connected": self.connected, "acked_through": self.acked_through,
                "log_end": self.log_end, "received": self.received, "jumped": self.jumped,
                "reconnects": self.reconnects, "fleet_polls": self.fleet_polls, "last_error": self.last_error}

    async def run(self) -> None:
        await asyncio.gather(self._stream(), self._fleet())

    async def _stream(self) -> None:
        delay = self.backoff_s[0]
        resume: int | None = None  # None: the log's end, wherever that is
        async with ExperienceClient(self.address, self.credentials, aio=True, timeout_s=None) as client:
            while True:
                call, jump = client.subscribe(), False
                try:
                    start = experience_pb2.SubscribeStart(from_offset=resume or 0, window=self.window,
                                                          max_batch=self.max_batch, policy=self.policy)
                    await call.write(experience_pb2.SubscribeRequest(start=start))
                    while (batch := await call.read()) is not grpc.aio.EOF:
                        self.connected, delay = True, self.backoff_s[0]
                        self.log_end = batch.log_end
                        behind = batch.log_end - batch.next_offset
                        if resume is None or behind > self.max_lag:  # the first batch says where the end is
                            self.jumped += behind if resume is not None else 0
                            resume, jump = batch.log_end, True  # start over at the log's end
                            break
                        resume = batch.next_offset
                        await call.write(experience_pb2.SubscribeRequest(
                            ack=experience_pb2.SubscribeAck(through_offset=batch.next_offset)))
                        self.acked_through = batch.next_offset
                        self._show(batch.transitions)
                        await asyncio.sleep(0)
                    else:
                        self.last_error = "the gateway ended the stream"
                except grpc.aio.AioRpcError as exc:
                    self.last_error = f"Experience.Subscribe: {exc.code().name}: {exc.details()}"
                    log.warning("%s; again in %.1f s", self.last_error, delay)
                finally:
                    call.cancel()
                if jump:
                    continue
                self.connected = False
                self.reconnects += 1
                await asyncio.sleep(delay)
                delay = min(2 * delay, self.backoff_s[1])

    def _show(self, transitions) -> None:
        for t in transitions:
            self.received += 1
            messages = self.translator.translate(t)
            self.server.advertise(self.translator.topics.values())
            self.server.publish(messages)

    async def _fleet(self) -> None:
        async with FleetClient(self.address, self.credentials, aio=True, timeout_s=5.0) as fleet:
            while True:
                try:
                    status = await fleet.status()
                    self.fleet_polls += 1
                    self._estops(status)
                except grpc.aio.AioRpcError as exc:
                    self.last_error = f"Fleet.Status: {exc.code().name}: {exc.details()}"
                await asyncio.sleep(self.fleet_every_s)

    def _estops(self, status: fleet_pb2.FleetStatus) -> None:
        now = time.time_ns()
        for s in status.sessions:
            robot = s.labels.get("robot") or s.labels.get("node")
            ident = next((e.id for e in status.estops if e.all or e.session_id == s.session_id
                          or (robot and e.robot == robot)), "") if s.estopped else ""
            messages = self.translator.estop_state(s.session_id, estopped=s.estopped,
                                                   edge_estopped=s.edge_estopped, estop_id=ident, t_ns=now,
                                                   repeat=True)
            self.server.advertise(self.translator.topics.values())
            self.server.publish(messages)
