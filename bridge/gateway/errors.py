"""Typed gateway errors. The servicer maps them to gRPC status codes at its edge; nothing logs
and swallows them.

The root is `bridge.common.errors.TetherError` (`GatewayError` names it here, for the gateway's code
and old imports), so the registry's, security's and the gateway's errors share one base without any
package below the gateway importing it. `Unauthenticated` and `PermissionDenied` live in
bridge.common.errors (bridge.security raises them) and are re-exported here.
"""

from __future__ import annotations

import grpc

from bridge.common.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    TetherError,
    Unauthenticated,
    Unavailable,
)

GatewayError = TetherError  # one root for every typed error a servicer maps (see bridge.common.errors)

__all__ = ["Draining", "DuplicateSession", "GatewayError", "InvalidHello", "PermissionDenied", "PolicyUnavailable",
           "SessionSuperseded", "SessionsUnavailable", "TooManySessions", "Unauthenticated", "UnknownPolicy"]


class InvalidHello(InvalidArgument):
    """The first message is not a usable Hello (missing, malformed spec, spec/policy mismatch)."""


class UnknownPolicy(NotFound):
    """A policy the gateway does not serve."""


class DuplicateSession(AlreadyExists):
    """The Hello names a session id that another identity holds (the same identity takes it over)."""


class SessionSuperseded(GatewayError, status=grpc.StatusCode.ABORTED):
    """A new connection of the same identity took this stream's session over (a robot back from a power loss,
    before keepalive noticed the old connection was dead): the old stream ends with this status."""


class PolicyUnavailable(Unavailable):
    """Triton is unreachable or serves no ready version of the policy."""


class TooManySessions(ResourceExhausted):
    """The gateway's session cap or a source's cap is reached (bridge.gateway.session.limits)."""


class Draining(Unavailable):
    """The gateway is shutting down (SIGTERM): it takes no new session and ends its streams with UNAVAILABLE, so
    clients move to another gateway at once and replay what is not durable."""


class SessionsUnavailable(Unavailable):
    """The session ownership store (bridge.registry.ownership) cannot be reached: no claim, no session here."""
