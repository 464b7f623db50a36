"""The `tether.v1.Fleet` servicer: thin. Status for viewers; EStop and Release for operators, durable and audited
under the identity the caller authenticated as (a token's or client certificate's; never a name in the request)."""

from __future__ import annotations

import grpc

from bridge.console.fleet import Target
from bridge.gateway.errors import GatewayError
from protos import fleet_pb2, fleet_pb2_grpc


class FleetService(fleet_pb2_grpc.FleetServicer):
    def __init__(self, gateway):
        self._gateway = gateway

    async def Status(self, request, context: grpc.aio.ServicerContext) -> fleet_pb2.FleetStatus:
        try:
            await self._gateway.auth.require(context, "viewer")
            return self._gateway.fleet.status()
        except GatewayError as exc:
            await context.abort(exc.status, str(exc))

    async def EStop(self, request: fleet_pb2.EStopRequest, context) -> fleet_pb2.EStopReply:
        return await self._act(request, context, latch=True)

    async def Release(self, request: fleet_pb2.EStopRequest, context) -> fleet_pb2.EStopReply:
        return await self._act(request, context, latch=False)

    async def _act(self, request: fleet_pb2.EStopRequest, context, *, latch: bool) -> fleet_pb2.EStopReply:
        try:
            who = await self._gateway.auth.require(context, "operator")
            target = Target.from_proto(request)
            fleet = self._gateway.fleet
            act = fleet.estop if latch else fleet.release
            changed, held = await act(target, who=who, why=request.reason)
            return fleet_pb2.EStopReply(sessions=held, who=who, changed=changed)
        except GatewayError as exc:
            await context.abort(exc.status, str(exc))
