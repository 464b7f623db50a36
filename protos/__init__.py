"""`tether.v1`: the one vocabulary every Tether package shares.

    from protos import bridge_pb2, bridge_pb2_grpc, codec
    from protos import experience_pb2, experience_pb2_grpc, policies_pb2, policies_pb2_grpc
    from protos import fleet_pb2, fleet_pb2_grpc
"""

from protos import codec
from protos.tether.v1 import (
    bridge_pb2,
    bridge_pb2_grpc,
    experience_pb2,
    experience_pb2_grpc,
    fleet_pb2,
    fleet_pb2_grpc,
    policies_pb2,
    policies_pb2_grpc,
    tensor_pb2,
)

__all__ = ["bridge_pb2", "bridge_pb2_grpc", "codec", "experience_pb2", "experience_pb2_grpc", "fleet_pb2",
           "fleet_pb2_grpc", "policies_pb2", "policies_pb2_grpc", "tensor_pb2"]
