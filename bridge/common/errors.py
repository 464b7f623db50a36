"""The base error types, at the bottom of the layers: every package raises these (or subclasses),
none needs the gateway to do so.

Each type carries the gRPC status a servicer answers with (`status`, a class attribute read only at
the servicer edge: `await context.abort(exc.status, str(exc))`).

    >>> class UnknownVersion(NotFound):
    ...     '''No such policy version.'''
    >>> issubclass(UnknownVersion, TetherError), UnknownVersion.status.name
    (True, 'NOT_FOUND')

`CommandError` is the command line's: a command that failed while running (a peer that refused, a file
that does not load). The `tether` entry (tether/cli.py) prints `tether <command>: <message>` on stderr and
exits 1; flags that are wrong or contradict each other are the parser's (`parser.error`: usage, exit 2).
"""

from __future__ import annotations

import grpc

__all__ = ["AlreadyExists", "CommandError", "FailedPrecondition", "InvalidArgument", "NotFound", "PermissionDenied",
           "ResourceExhausted", "TetherError", "Unauthenticated", "Unavailable"]


class TetherError(Exception):
    """The root of Tether's typed errors; an unexpected failure inside a call (INTERNAL)."""

    status = grpc.StatusCode.INTERNAL


class InvalidArgument(TetherError):
    """A request or file that is malformed or out of range, whatever the state."""

    status = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(TetherError):
    """A named thing (policy, version, session, e-stop) that does not exist."""

    status = grpc.StatusCode.NOT_FOUND


class AlreadyExists(TetherError):
    """A create of something that exists already."""

    status = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(TetherError):
    """A well-formed request the current state refuses (an illegal move, a withdrawn version)."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(TetherError):
    """A dependency that cannot be reached now (Triton, a disk); retrying may work."""

    status = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(TetherError):
    """No credentials, or credentials that do not verify (bridge.security)."""

    status = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(TetherError):
    """Verified credentials whose role does not allow the action (bridge.security)."""

    status = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(TetherError):
    """A cap is reached (sessions per gateway, per source)."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class CommandError(Exception):
    """A `tether` command that failed at run time, for a reason its user can act on (exit status 1).

    `prog` names a subcommand when the message is its own (default: `tether <command>`):

        >>> str(CommandError("no such file", prog="tether policy inspect")), CommandError("x").prog
        ('no such file', None)
    """

    def __init__(self, message: object, *, prog: str | None = None):
        super().__init__(str(message))
        self.prog = prog
