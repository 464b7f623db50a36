"""Typed registry errors; the gateway's servicers map them to gRPC status codes at their edge.

They subclass bridge.common.errors.TetherError (the registry is below the gateway and never imports it).
"""

from __future__ import annotations

import grpc

from bridge.common.errors import TetherError


class RegistryError(TetherError):
    """A refused change: an illegal move, a bad argument, a pin on a withdrawn version, an unreadable file."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class UnknownVersion(RegistryError):
    """No such policy, or no such version of it."""

    status = grpc.StatusCode.NOT_FOUND


class DuplicateVersion(RegistryError):
    """`add` of a (policy, version) the registry already holds."""

    status = grpc.StatusCode.ALREADY_EXISTS


class RegistryWriteFailed(RegistryError):
    """A change that could not be written (disk full, I/O error, a failed constraint): nothing of it is kept."""


class RegistryUnavailable(RegistryWriteFailed):
    """The registry's database cannot be reached ("registry unreachable: ..."): a change is refused (nothing of it
    is kept) and gateways serve the rollout they last read until it is back."""

    status = grpc.StatusCode.UNAVAILABLE
