"""The client of `tether.v1.Fleet`: the fleet's status, e-stops and their release (an operator's calls).

    with FleetClient("127.0.0.1:50051", Credentials.from_args(args), operator="alice") as fleet:
        status = fleet.status()                               # FleetStatus: sessions, versions, latched e-stops
        fleet.estop(robot="arm_1", reason="person in the cell")   # EStopReply: who, changed, sessions held
        fleet.release(robot="arm_1", reason="cell clear")

A target is one of `session_id`, `robot` (sessions labelled robot=NAME) or `all` (every session, and those
that connect later). Calls fail at once when no gateway answers (default deadline 10 s).
"""

from __future__ import annotations

from bridge.client.channel import Credentials, ServiceClient
from protos import fleet_pb2, fleet_pb2_grpc

__all__ = ["FleetClient"]


class FleetClient(ServiceClient):
    STUB = fleet_pb2_grpc.FleetStub

    def __init__(self, address: str, credentials: Credentials | None = None, *, timeout_s: float | None = 10.0, **kw):
        super().__init__(address, credentials, timeout_s=timeout_s, **kw)

    def status(self) -> fleet_pb2.FleetStatus:
        return self._call("Status", fleet_pb2.StatusRequest())

    def estop(self, *, session_id: str | None = None, robot: str | None = None, all: bool = False,
              reason: str = "") -> fleet_pb2.EStopReply:
        """Latch an e-stop on the target (durable: it survives the gateway's restart)."""
        return self._call("EStop", _request(session_id, robot, all, reason))

    def release(self, *, session_id: str | None = None, robot: str | None = None, all: bool = False,
                reason: str = "") -> fleet_pb2.EStopReply:
        """Release the target's e-stop (only the same target releases it)."""
        return self._call("Release", _request(session_id, robot, all, reason))


def _request(session_id: str | None, robot: str | None, all: bool, reason: str) -> fleet_pb2.EStopRequest:
    request = fleet_pb2.EStopRequest(reason=reason)
    if all:
        request.all = True
    elif robot is not None:
        request.robot = robot
    elif session_id is not None:
        request.session_id = session_id
    return request
