"""Who is calling the gateway, and may they? (Issue 10 replaces this open stub with TLS identities and tokens.)

    who = await gateway.auth.require(context, "operator")        # gRPC servicers: "operator:alice"
    who = gateway.auth.require_http(request.headers, "viewer")   # the console's HTTP handlers

Roles: "viewer" (read) and "operator" (act). A refusal raises a `GatewayError` whose `status` maps to
UNAUTHENTICATED / PERMISSION_DENIED (HTTP 401 / 403).
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc

OPERATOR_HEADER = "x-tether-operator"  # the name an operator acts under (audit log)


class Authorizer:
    """Open: everyone may do everything (the default on loopback until tokens are configured)."""

    async def require(self, context: grpc.aio.ServicerContext, role: str) -> str:
        metadata = dict(context.invocation_metadata() or ())
        return f"{role}:{metadata.get(OPERATOR_HEADER, 'anonymous')}"

    def require_http(self, headers: Mapping[str, str], role: str, peer_cert: dict | None = None) -> str:
        return f"{role}:{headers.get(OPERATOR_HEADER, 'anonymous')}"
