"""The `tether.v1.Bridge` servicer: thin. It reads the stream, lets `Gateway` open a `Session`,
and writes exactly one reply per observation, in order. Typed errors become gRPC statuses here.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc

from bridge.common.logs import log_context
from bridge.gateway.errors import Draining, GatewayError, InvalidHello, SessionSuperseded
from bridge.gateway.session.limits import IdleTimeout, StreamWatch, Undecodable, peer_key, within_idle
from protos import bridge_pb2, bridge_pb2_grpc


class BridgeService(bridge_pb2_grpc.BridgeServicer):
    def __init__(self, gateway):
        self._gateway = gateway

    async def Connect(self, request_iterator: AsyncIterator[bridge_pb2.ClientMessage],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[bridge_pb2.ServerMessage]:
        watch = StreamWatch(self._gateway.config.limits.idle_timeout_s)  # silence ends it, and a takeover
        messages = within_idle(request_iterator, watch.idle_s, watch=watch)
        try:
            first = await anext(messages, None)
            hello_recv_ns = time.time_ns()  # with the Welcome's send time: the client's first clock sample
            if first is None or first.WhichOneof("kind") != "hello":
                got = "nothing" if first is None else f"{first.WhichOneof('kind') or 'an empty message'}"
                raise InvalidHello(f"the first message of a Connect stream must be a Hello, got {got}")
            identity = await self._gateway.authorize_session(context)  # the robot role, when credentials are on
            session = await self._gateway.open_session(first.hello, peer=peer_key(context), identity=identity)
        except GatewayError as exc:
            await context.abort(exc.status, str(exc))
        # a new connection of this id from the same identity takes the session over: this stream then ends
        session.on_superseded = lambda why: watch.end(SessionSuperseded(why))
        session.on_drain = lambda why: watch.end(Draining(why))  # SIGTERM: UNAVAILABLE, the client moves on
        figures, estops = self._gateway.figures, self._gateway.estops  # bridge.gateway.session.figures, .holds
        figures.opened(session, first.hello)
        log_context.set(session)
        try:
            yield bridge_pb2.ServerMessage(welcome=self._gateway.welcome(session, hello_recv_ns=hello_recv_ns))
            async for msg in messages:
                kind = msg.WhichOneof("kind")
                if kind == "observation":
                    obs = msg.observation
                    reply = await estops.answer(session, obs)  # held by an operator's e-stop, or the session's
                elif kind == "replay":
                    obs, reply = None, session.replay(msg.replay)
                else:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        "after the Hello, a Connect stream carries only observations and replays")
                if session.superseded:  # taken over while it was answered: the reply goes nowhere
                    raise SessionSuperseded(session.superseded)
                reply.durable_through = session.recorder.durable_through
                yield reply
                # the reply is on its way: the bookkeeping it did not need (figures and metrics, the router's
                # per-version stats, deferred rewards), then the log appends what this step completed
                if obs is not None:
                    figures.observed(session, obs, reply)
                session.flush()
        except (IdleTimeout, Undecodable, SessionSuperseded, Draining) as exc:
            await context.abort(exc.status, str(exc))
        finally:
            figures.closed(session)
            self._gateway.close_session(session)
