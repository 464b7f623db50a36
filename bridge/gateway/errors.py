"""Typed gateway errors. The servicer maps them to gRPC status codes at its edge; nothing logs
and swallows them."""

from __future__ import annotations

import grpc


class GatewayError(Exception):
    status = grpc.StatusCode.INTERNAL


class InvalidHello(GatewayError):
    """The first message is not a usable Hello (missing, malformed spec, spec/policy mismatch)."""

    status = grpc.StatusCode.INVALID_ARGUMENT


class UnknownPolicy(GatewayError):
    status = grpc.StatusCode.NOT_FOUND


class DuplicateSession(GatewayError):
    status = grpc.StatusCode.ALREADY_EXISTS


class PolicyUnavailable(GatewayError):
    """Triton is unreachable or serves no ready version of the policy."""

    status = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(GatewayError):
    """No credentials, or credentials that do not verify (bridge.security)."""

    status = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(GatewayError):
    """Verified credentials whose role does not allow the action (bridge.security)."""

    status = grpc.StatusCode.PERMISSION_DENIED


class TooManySessions(GatewayError):
    """The gateway's session cap or a source's cap is reached (bridge.gateway.limits)."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED
