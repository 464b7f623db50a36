"""The gateway's side of session ownership (bridge.registry.ownership): claim on Hello, fence on a stale ack.

    owners = SessionOwners(gateway)          # the store beside gateway.registry (None for an in-memory registry)
    owners.name = "gw-a"                     # --gateway-id, default HOST:PORT
    epoch = await owners.claim("robot-1", ["robot-1"], identity="robot:arm_1")   # on Hello (SessionFactory): one
                                             # transaction bumps the epoch; another identity: PermissionDenied
    ExperienceLog(dir, **owners.log_hooks())  # the log asks before each group commit's ack; stale -> owners.fenced

A claim whose previous epoch was another gateway's (the client moved here and may come back) makes this
gateway's log forget what it held of the session: those records are another epoch's, the client replays
what is not durable and it is logged again under the new epoch (readers keep the newest epoch per step,
bridge.experience.merge). A session whose epoch went stale (another gateway claimed its id: this gateway
was cut off, not dead) is fenced like a takeover: what it has pending is dropped and counted, nothing more
of it is logged, its stream ends ABORTED. With an in-memory registry (one gateway, nothing shared) there
is no store: epoch 0, nothing checked, the log behaves exactly as before.

Identity: `claim(..., identity="robot:arm_1")` binds the id to the identity that proved itself at the Hello
(`Authorizer.require`); a claim by another identity is refused with PERMISSION_DENIED before any epoch moves (the
store checks it in the statement that would bump, on every gateway sharing it; without a store, this gateway
remembers the newest BOUND_IDS ids' identities). With open access (identity None) nothing is bound, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from bridge.gateway.errors import PermissionDenied, SessionsUnavailable
from bridge.registry.ownership import Ownership, OwnershipRefused, OwnershipUnavailable, open_ownership, refusal

__all__ = ["SessionOwners"]

log = logging.getLogger("tether.gateway")
BOUND_IDS = 65_536  # without a store: the newest ids whose identity this gateway remembers
CLAIM_TIMEOUT_S = 5.0  # a Hello waits this long for the store's answer, then is refused UNAVAILABLE


class SessionOwners:
    def __init__(self, gateway, store: Ownership | None = None):
        self._gateway = gateway
        target = getattr(gateway.registry, "path", None)
        shared = target is not None and str(target) != ":memory:"
        self.store: Ownership | None = store if store is not None else (open_ownership(target) if shared else None)
        self.name = gateway.config.gateway_id or f"{gateway.config.host}:{gateway.config.port}"
        self._bound: OrderedDict[str, str] = OrderedDict()  # without a store: session id -> identity
        self.fenced_sessions = 0  # sessions ended because another gateway claimed them
        self._ids: dict[str, str] = {}  # a vector session's log keys ("<id>/<env>") -> its session id

    async def claim(self, session_id: str, log_keys: list[str], *, identity: str | None = None) -> int:
        """Claim `session_id` for this gateway under `identity` (None: open access): its new epoch (0 without a
        store). PermissionDenied when the id is bound to another identity (nothing changed); SessionsUnavailable
        when the store cannot be reached or does not answer within CLAIM_TIMEOUT_S."""
        if self.store is None:
            self._bind(session_id, identity)
            return 0
        try:
            claim = await asyncio.wait_for(asyncio.to_thread(self.store.claim, session_id, owner=self.name,
                                                             identity=identity), CLAIM_TIMEOUT_S)
        except OwnershipRefused as exc:
            log.warning("session %s: Hello from %s refused: %s", session_id, identity or "open access", exc)
            raise
        except OwnershipUnavailable as exc:
            raise SessionsUnavailable(f"session {session_id!r}: {exc}") from None
        except TimeoutError:
            raise SessionsUnavailable(f"session {session_id!r}: the ownership store did not answer within "
                                      f"{CLAIM_TIMEOUT_S:g} s (registry unreachable?)") from None
        for key in log_keys:
            if key != session_id:
                self._ids[key] = session_id
        if claim.previous is not None and not claim.continues():
            experience = self._gateway.experience
            if experience is not None:
                for key in log_keys:
                    experience.forget(key)
            log.info("session %s claimed by %s at epoch %d (was %s at epoch %d)", session_id, self.name, claim.epoch,
                     *claim.previous)
        return claim.epoch

    def _bind(self, session_id: str, identity: str | None) -> None:
        """Without a store: this gateway's own memory of which identity holds an id (the newest BOUND_IDS)."""
        bound = self._bound.get(session_id, "")
        if (why := refusal(session_id, bound, identity)) is not None:
            log.warning("session %s: Hello from %s refused: %s", session_id, identity or "open access", why)
            raise PermissionDenied(why)
        if identity is not None and not bound:
            self._bound[session_id] = identity
        if session_id in self._bound:
            self._bound.move_to_end(session_id)
            while len(self._bound) > BOUND_IDS:
                self._bound.popitem(last=False)

    def log_hooks(self) -> dict:
        """The experience log's `ownership` and `on_fenced` (none without a store)."""
        return {} if self.store is None else {"ownership": self.stale, "on_fenced": self.fenced}

    def stale(self, pairs: set[tuple[str, int]]) -> set[tuple[str, int]]:
        """The log's check (its writer thread): log keys mapped to their session ids, one query."""
        ids = self._ids
        by_id = {(ids.get(key, key), epoch) for key, epoch in pairs}
        stale = self.store.stale(by_id)
        return {(key, epoch) for key, epoch in pairs if (ids.get(key, key), epoch) in stale}

    def fenced(self, log_key: str, epoch: int) -> None:
        """The log found `log_key`'s epoch stale at an ack (nothing of it acknowledged): fence the session if it
        still runs at that epoch."""
        session = self._gateway.sessions.get(self._ids.get(log_key, log_key))
        live = session is not None and session.recorder.epoch == epoch and not session.superseded
        log.warning("session %s: epoch %d is stale, another gateway claimed it: its writes here are not "
                    "acknowledged (fenced)%s", log_key, epoch, "; the session is ended" if live else "")
        if not live:
            return
        self.fenced_sessions += 1
        session.supersede(f"session {session.id!r} moved to another gateway: this gateway's epoch {epoch} is "
                          "stale (fenced)")
        self._gateway.close_session(session)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
