"""`tether.v1`: the one vocabulary every Tether package shares.

    from protos import bridge_pb2, bridge_pb2_grpc, codec
"""

from protos import codec
from protos.tether.v1 import bridge_pb2, bridge_pb2_grpc, tensor_pb2

__all__ = ["bridge_pb2", "bridge_pb2_grpc", "codec", "tensor_pb2"]
