"""The base error types, at the bottom of the layers: every package raises these (or subclasses),
none needs the gateway to do so.

Each type carries the gRPC status a servicer answers with (`status`, a class attribute read only at
the servicer edge: `await context.abort(exc.status, str(exc))`), its base's unless it names another:

    >>> class UnknownVersion(NotFound):
    ...     '''No such policy version.'''
    >>> class Superseded(TetherError, status=grpc.StatusCode.ABORTED):
    ...     '''Another took it over.'''
    >>> issubclass(UnknownVersion, TetherError), UnknownVersion.status.name, Superseded.status.name
    (True, 'NOT_FOUND', 'ABORTED')

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

    def __init_subclass__(cls, status: grpc.StatusCode | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status


class InvalidArgument(TetherError, status=grpc.StatusCode.INVALID_ARGUMENT):
    """A request or file that is malformed or out of range, whatever the state."""


class NotFound(TetherError, status=grpc.StatusCode.NOT_FOUND):
    """A named thing (policy, version, session, e-stop) that does not exist."""


class AlreadyExists(TetherError, status=grpc.StatusCode.ALREADY_EXISTS):
    """A create of something that exists already."""


class FailedPrecondition(TetherError, status=grpc.StatusCode.FAILED_PRECONDITION):
    """A well-formed request the current state refuses (an illegal move, a withdrawn version)."""


class Unavailable(TetherError, status=grpc.StatusCode.UNAVAILABLE):
    """A dependency that cannot be reached now (Triton, a disk); retrying may work."""


class Unauthenticated(TetherError, status=grpc.StatusCode.UNAUTHENTICATED):
    """No credentials, or credentials that do not verify (bridge.security)."""


class PermissionDenied(TetherError, status=grpc.StatusCode.PERMISSION_DENIED):
    """Verified credentials whose role does not allow the action (bridge.security)."""


class ResourceExhausted(TetherError, status=grpc.StatusCode.RESOURCE_EXHAUSTED):
    """A cap is reached (sessions per gateway, per source)."""


class CommandError(Exception):
    """A `tether` command that failed at run time, for a reason its user can act on (exit status 1).

    `prog` names a subcommand when the message is its own (default: `tether <command>`):

        >>> str(CommandError("no such file", prog="tether policy inspect")), CommandError("x").prog
        ('no such file', None)
    """

    def __init__(self, message: object, *, prog: str | None = None):
        super().__init__(str(message))
        self.prog = prog
