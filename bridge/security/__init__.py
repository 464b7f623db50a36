"""Who is calling the gateway, and may they? Identities come from operator tokens (stored hashed, see
`bridge.security.tokens`) and from verified client certificates (mTLS, see `bridge.security.certs`).

    who = await gateway.auth.require(context, "operator")        # gRPC servicers: "operator:alice"
    who = gateway.auth.require_http(request.headers, "viewer")   # the console's HTTP handlers
    who = await gateway.auth.check_http(request.headers, "viewer")   # the same, scrypt off the event loop

Roles: "viewer" (read), "trainer" (publish weights; viewer too), "operator" (act; trainer, viewer and
robot too), "robot" (run sessions: `Bridge.Connect` needs it whenever tokens or client certificates
are configured). Credentials: the header
`authorization: Bearer NAME.SECRET` (a token from `tether token add`), or a client certificate whose
subject says CN=NAME, OU=ROLE (from `tether certs init`). The identity returned is "ROLE:NAME".

Open access (no tokens file, no client CA, bound to loopback or `--insecure`): everyone may do
everything, under the name in the `x-tether-operator` header or "anonymous". Otherwise a call without
credentials is refused with UNAUTHENTICATED (HTTP 401), except read-only viewing while
`anonymous_viewers` holds; credentials without the role get PERMISSION_DENIED (HTTP 403). Both are
`TetherError`s (bridge.common.errors), which the servicers map to their status.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import secrets
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import grpc

from bridge.common.errors import PermissionDenied, Unauthenticated
from bridge.security.certs import Identity, identity_from_peercert, identity_from_pem
from bridge.security.tokens import TokenEntry, TokenStore

OPERATOR_HEADER = "x-tether-operator"  # the name an operator acts under with open access (audit log)
AUTH_HEADER = "authorization"          # "Bearer NAME.SECRET"
GRANTS = {"viewer": frozenset({"viewer"}), "trainer": frozenset({"viewer", "trainer"}),
          "operator": frozenset({"viewer", "trainer", "operator", "robot"}), "robot": frozenset({"robot"})}
_DECLARED = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
TOKEN_THREADS = 2  # scrypt checks run on these, never on the event loop nor the default executor

__all__ = ["AUTH_HEADER", "GRANTS", "OPERATOR_HEADER", "Authorizer", "Identity", "TokenStore", "peer_identity"]


def peer_identity(context: grpc.aio.ServicerContext) -> Identity | None:
    """The identity in the peer's verified client certificate (mTLS), or None (no TLS, no cert)."""
    try:
        auth = context.auth_context() or {}
    except Exception:  # a context without transport security information
        return None
    pems = auth.get("x509_pem_cert") or ()
    return identity_from_pem(bytes(pems[0])) if pems else None


def _refuse(kind: str, message: str) -> Unauthenticated | PermissionDenied:
    return (Unauthenticated if kind == "unauthenticated" else PermissionDenied)(message)


class Authorizer:
    """`Authorizer()` is open access; `Authorizer(tokens=TokenStore(path), client_certs=True)` checks."""

    def __init__(self, *, tokens: TokenStore | None = None, client_certs: bool = False,
                 open_access: bool | None = None, anonymous_viewers: bool = True):
        self.tokens = tokens
        self.client_certs = client_certs
        self.open_access = (tokens is None and not client_certs) if open_access is None else open_access
        self.anonymous_viewers = anonymous_viewers
        self._issued: dict[str, TokenEntry] = {}  # secret -> entry: tokens this process issued itself
        self._token_pool: ThreadPoolExecutor | None = None  # verify_token's threads, made at first use

    @property
    def checks(self) -> bool:
        """Whether credentials are configured (tokens or client certificates) and so checked."""
        return self.tokens is not None or self.client_certs

    def issue(self, name: str, role: str) -> str:
        """A token for this process's own clients (the gate's `tether sim` sessions), never written to a
        file: it verifies as ROLE:NAME until the process ends. `auth.issue("gate", "robot")`."""
        if role not in GRANTS:
            raise ValueError(f"unknown role {role!r}; roles: {', '.join(GRANTS)}")
        secret = secrets.token_urlsafe(32)
        self._issued[secret] = TokenEntry(name=name, role=role, salt=b"", digest=b"", created_unix=time.time())
        return f"{name}.{secret}"

    def _issued_entry(self, token: str | None) -> TokenEntry | None:
        _, _, secret = (token or "").partition(".")
        for known, entry in self._issued.items():
            if hmac.compare_digest(known.encode(), secret.encode()) and token == f"{entry.name}.{known}":
                return entry
        return None

    def describe(self) -> str:
        if self.open_access:
            return "open access (no tokens, no client certificates: everyone may act)"
        ways = ([f"tokens from {self.tokens.path}"] if self.tokens else []) + \
               (["client certificates"] if self.client_certs else [])
        viewers = "anonymous viewing allowed" if self.anonymous_viewers else "viewing needs credentials"
        return f"operators need {' or '.join(ways) or 'credentials (none configured: operator actions refused)'}; " \
               f"{viewers}"

    async def require(self, context: grpc.aio.ServicerContext, role: str) -> str:
        """The caller's identity ("ROLE:NAME") if it may act as `role`; raises Unauthenticated or
        PermissionDenied otherwise. A token is checked off the event loop (scrypt) unless cached."""
        metadata = {k.lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        token = _bearer(metadata.get(AUTH_HEADER))
        entry = self._issued_entry(token) if self._issued else None
        if entry is None and token is not None and self.tokens is not None:
            entry = await self.verify_token(token)
        return self._decide(role, token, entry, peer_identity(context), metadata.get(OPERATOR_HEADER))

    async def verify_token(self, token: str) -> TokenEntry | None:
        """`TokenStore.verify` (scrypt, tens of ms, unless cached) on this authorizer's own threads: never on
        the event loop, and a flood of tokens to check never queues ahead of the registry commits and model
        loads that use the default executor."""
        if self._token_pool is None:
            self._token_pool = ThreadPoolExecutor(max_workers=TOKEN_THREADS, thread_name_prefix="tether-tokens")
        return await asyncio.get_running_loop().run_in_executor(self._token_pool, self.tokens.verify, token)

    async def check_http(self, headers: Mapping[str, str], role: str, peer_cert: dict | None = None) -> str:
        """`require_http` for a handler on the event loop (the console): the token is checked off the loop."""
        lowered = {str(k).lower(): v for k, v in headers.items()}
        token = _bearer(lowered.get(AUTH_HEADER))
        entry = await self.verify_token(token) if token is not None and self.tokens is not None else None
        cert = identity_from_peercert(peer_cert) if self.client_certs else None
        return self._decide(role, token, entry, cert, lowered.get(OPERATOR_HEADER))

    def require_http(self, headers: Mapping[str, str], role: str, peer_cert: dict | None = None) -> str:
        """As `require`, for HTTP: `headers` of the request, `peer_cert` from the TLS socket's
        `getpeercert()` (the console's server verifies it against the client CA)."""
        lowered = {str(k).lower(): v for k, v in headers.items()}
        token = _bearer(lowered.get(AUTH_HEADER))
        entry = self.tokens.verify(token) if token is not None and self.tokens is not None else None
        cert = identity_from_peercert(peer_cert) if self.client_certs else None
        return self._decide(role, token, entry, cert, lowered.get(OPERATOR_HEADER))

    def _decide(self, role: str, token: str | None, entry: TokenEntry | None, cert: Identity | None,
                declared: str | None) -> str:
        if role not in GRANTS:
            raise ValueError(f"unknown role {role!r}; roles: {', '.join(GRANTS)}")
        if token is not None and (self.tokens is not None or self._issued) and entry is None:
            raise _refuse("unauthenticated", "the bearer token does not verify (unknown, revoked or mistyped)")
        held = [f"{entry.role}:{entry.name}"] if entry is not None else []
        if entry is not None and role in GRANTS[entry.role]:
            return held[0]
        if cert is not None:
            if role in GRANTS.get(cert.role, ()):
                return str(cert)
            held.append(str(cert))
        if self.open_access:
            name = declared if isinstance(declared, str) and _DECLARED.fullmatch(declared) else "anonymous"
            return f"{role}:{name}"
        if role == "viewer" and self.anonymous_viewers:
            return "viewer:anonymous"
        if held:
            raise _refuse("denied", f"{' / '.join(held)} may not act as {role}")
        ways = ([f"'{AUTH_HEADER}: Bearer NAME.SECRET' (tether token add NAME --role {role})"] if self.tokens else []) \
            + ([f"a client certificate with OU={role}"] if self.client_certs else [])
        if not ways:
            raise _refuse("denied", f"the {role} role needs credentials and this gateway has none configured "
                                    f"(start it with --tokens FILE or --tls-client-ca)")
        raise _refuse("unauthenticated", f"the {role} role needs credentials: {' or '.join(ways)}")


def _bearer(value: str | None) -> str | None:
    if not isinstance(value, str):
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None
