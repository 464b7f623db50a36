"""Typed registry errors; the gateway's servicers map them to gRPC status codes at their edge.

They subclass bridge.common.errors' FailedPrecondition (the registry is below the gateway and never imports it).
"""

from __future__ import annotations

import grpc

from bridge.common.errors import FailedPrecondition


class RegistryError(FailedPrecondition):
    """A refused change: an illegal move, a bad argument, a pin on a withdrawn version, an unreadable file."""


class UnknownVersion(RegistryError, status=grpc.StatusCode.NOT_FOUND):
    """No such policy, or no such version of it."""


class DuplicateVersion(RegistryError, status=grpc.StatusCode.ALREADY_EXISTS):
    """`add` of a (policy, version) the registry already holds."""


class RegistryWriteFailed(RegistryError):
    """A change that could not be written (disk full, I/O error, a failed constraint): nothing of it is kept."""


class RegistryUnavailable(RegistryWriteFailed, status=grpc.StatusCode.UNAVAILABLE):
    """The registry's database cannot be reached ("registry unreachable: ..."): a change is refused (nothing of it
    is kept) and gateways serve the rollout they last read until it is back."""
