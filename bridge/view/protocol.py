"""The Foxglove WebSocket protocol (subprotocol `foxglove.websocket.v1`), the server's side of what `tether view`
speaks: JSON text messages for control, binary frames for message data.

    >>> server_info("tether view")["op"]
    'serverInfo'
    >>> message_data(7, 1_000, b"xy").hex()
    '0107000000e8030000000000007879'
    >>> parse_client('{"op": "subscribe", "subscriptions": [{"id": 1, "channelId": 3}]}')
    ('subscribe', {'op': 'subscribe', 'subscriptions': [{'id': 1, 'channelId': 3}]})
    >>> parse_client('{"op": "fly"}')
    Traceback (most recent call last):
    ...
    bridge.view.protocol.ProtocolError: unknown op 'fly' (this server takes subscribe, unsubscribe)

Server -> client: serverInfo (first), advertise / unadvertise (channels with their schemas), status (level 0 info,
1 warning, 2 error: what was wrong with a client's message), and binary MessageData: opcode 0x01, uint32
subscription id, uint64 log time (ns), the message bytes (all little-endian). Client -> server: subscribe
`{"op":"subscribe","subscriptions":[{"id":SUB,"channelId":CH}]}`, unsubscribe `{"op":"unsubscribe",
"subscriptionIds":[SUB]}`. Capabilities: none (no client publishing, parameters, services or time).
"""

from __future__ import annotations

import json
import struct

__all__ = ["MESSAGE_DATA", "SUBPROTOCOL", "ProtocolError", "advertise", "message_data", "parse_client",
           "server_info", "status", "unadvertise"]

SUBPROTOCOL = "foxglove.websocket.v1"
MESSAGE_DATA = 0x01
_HEADER = struct.Struct("<BIQ")
INFO, WARNING, ERROR = 0, 1, 2
CLIENT_OPS = ("subscribe", "unsubscribe")
MAX_TEXT = 1 << 16  # a client's control message is small; anything bigger is refused


class ProtocolError(ValueError):
    """A client message this server does not take; the client gets it back as a status message."""


def server_info(name: str, *, session_id: str = "", metadata: dict[str, str] | None = None) -> dict:
    return {"op": "serverInfo", "name": name, "capabilities": [], "supportedEncodings": [],
            "metadata": metadata or {}, "sessionId": session_id}


def advertise(channels: list[dict]) -> dict:
    return {"op": "advertise", "channels": channels}


def unadvertise(ids: list[int]) -> dict:
    return {"op": "unadvertise", "channelIds": ids}


def status(level: int, message: str, *, ident: str | None = None) -> dict:
    out = {"op": "status", "level": level, "message": message}
    if ident is not None:
        out["id"] = ident
    return out


def message_data(subscription: int, log_time_ns: int, payload: bytes) -> bytes:
    return _HEADER.pack(MESSAGE_DATA, subscription & 0xFFFFFFFF, max(log_time_ns, 0)) + payload


def parse_message_data(frame: bytes) -> tuple[int, int, bytes]:
    """(subscription id, log time ns, payload) of a MessageData frame (for clients and tests)."""
    if len(frame) < _HEADER.size or frame[0] != MESSAGE_DATA:
        raise ProtocolError(f"not a MessageData frame ({len(frame)} bytes, opcode {frame[:1].hex() or 'none'})")
    _, sub, log_time = _HEADER.unpack_from(frame)
    return sub, log_time, bytes(frame[_HEADER.size:])


def _ints(items, what: str) -> list[int]:
    if not isinstance(items, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 32
                                              for i in items):
        raise ProtocolError(f"{what}: expected a list of ids (integers 0..2^32-1)")
    return items


def parse_client(message: str | bytes) -> tuple[str, dict]:
    """(op, the message) of a client's message, checked; ProtocolError naming what is wrong otherwise."""
    if isinstance(message, bytes):
        raise ProtocolError("binary client messages (client publishing) are not supported by this server")
    if len(message) > MAX_TEXT:
        raise ProtocolError(f"a control message of {len(message)} characters (at most {MAX_TEXT})")
    try:
        msg = json.loads(message)
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise ProtocolError("expected a JSON object with an \"op\"")
    op = msg["op"]
    if op not in CLIENT_OPS:
        raise ProtocolError(f"unknown op {op[:64]!r} (this server takes {', '.join(CLIENT_OPS)})")
    if op == "subscribe":
        subs = msg.get("subscriptions")
        if not isinstance(subs, list) or not all(isinstance(s, dict) for s in subs):
            raise ProtocolError("subscribe: expected \"subscriptions\": [{\"id\": SUB, \"channelId\": CH}, ...]")
        for s in subs:
            _ints([s.get("id"), s.get("channelId")], "subscribe: id and channelId")
    else:
        _ints(msg.get("subscriptionIds"), "unsubscribe: subscriptionIds")
    return op, msg
