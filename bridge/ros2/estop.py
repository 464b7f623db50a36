"""E-stop on the ROS 2 wire: latch on a Bool, release only with a credential, confirmed by the edge node.

Three topics, all reliable:

    /tether/estop          std_msgs/Bool    True latches the edge's guard; False does nothing
                                            (the topic map's `estop` entry names this one)
    /tether/estop_release  std_msgs/String  "operator|node|t_ns|why|mac": releases the latch of
                                            node `node` if the MAC verifies against the node's
                                            release tokens file (`bridge.ros2.release_auth`:
                                            signed with the operator's token, fresh, never reused)
    /tether/estop_state    std_msgs/Bool    the edge node's latch, published on every e-stop or
                                            release message it receives and once a second

`request_estop` / `request_release` are the operator's side (`tether edge estop|release`): they
publish, and re-publish every `resend_s`, until an edge node reports the requested state on
/tether/estop_state (an e-stop is idempotent; each release resent is signed anew, so the node
never sees the same MAC twice), or raise `EstopError` after `timeout_s`.

    with open_transport("dds", domain_id=0, node_name="tether_operator") as transport:
        request_estop(transport, estop_topic="/tether/estop")
        request_release(transport, operator="ada", token=read_token(token_file=path), node="tether_edge")

The token never travels: the message carries an HMAC keyed by a hash of it. The helpers below
are kept for the unauthenticated "name: why" form, which a node no longer accepts as a release:

    >>> check_operator("  ")
    Traceback (most recent call last):
    ...
    ValueError: operator: expected a non-empty name without ':', got '  '
    >>> release_text("ada", "arm cleared"), parse_release(" ada: arm cleared "), parse_release("bob")
    ('ada: arm cleared', ('ada', 'arm cleared'), ('bob', ''))
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from bridge.ros2 import messages
from bridge.ros2.release_auth import (
    DEFAULT_NODE,
    ReleaseAuthority,
    ReleaseError,
    ReleaseSigner,
    make_release,
    read_token,
)
from bridge.ros2.transport import Transport, TransportError

ESTOP_TOPIC = "/tether/estop"
RELEASE_TOPIC = "/tether/estop_release"
STATE_TOPIC = "/tether/estop_state"

__all__ = ["DEFAULT_NODE", "ESTOP_TOPIC", "RELEASE_TOPIC", "STATE_TOPIC", "EstopError", "ReleaseAuthority",
           "ReleaseError", "check_operator", "make_release", "parse_release", "read_token", "release_text",
           "request_estop", "request_release"]


class EstopError(TransportError):
    """No edge node confirmed an e-stop or release in time; the message says what was seen."""


def check_operator(operator: object) -> str:
    """The operator's name, stripped; ValueError for an empty or non-string one, or one with ':'."""
    if not isinstance(operator, str) or not operator.strip() or ":" in operator:
        raise ValueError(f"operator: expected a non-empty name without ':', got {operator!r}")
    return operator.strip()


def release_text(operator: str, reason: str = "") -> str:
    """The release message's text: `name` or `name: why`."""
    operator = check_operator(operator)
    return f"{operator}: {reason.strip()}" if reason.strip() else operator


def parse_release(text: str) -> tuple[str, str]:
    """(name, why) from a release message's text; name is "" if there is none."""
    name, _, why = text.partition(":")
    return name.strip(), why.strip()


def request_estop(transport: Transport, *, estop_topic: str = ESTOP_TOPIC, state_topic: str = STATE_TOPIC,
                  reliable: bool = True, timeout_s: float = 5.0, resend_s: float = 0.2) -> None:
    """Publish True on `estop_topic` until an edge node reports its guard latched. The writer is
    transient-local (depth 1): a node that starts while this runs gets the True at once."""
    publish = transport.publisher(estop_topic, messages.BOOL, reliable=reliable, durable=True, depth=1)
    _until_state(transport, publish, messages.bool_msg(True), latched=True, state_topic=state_topic,
                 what=f"an e-stop on {estop_topic}", timeout_s=timeout_s, resend_s=resend_s)


def request_release(transport: Transport, *, operator: str, token: str, node: str = DEFAULT_NODE, reason: str = "",
                    release_topic: str = RELEASE_TOPIC, state_topic: str = STATE_TOPIC, timeout_s: float = 5.0,
                    resend_s: float = 0.2) -> None:
    """Publish a release of node `node` by `operator` (and why), signed with the operator's `token`,
    on `release_topic` until an edge node reports its latch released. A node that cannot verify it
    (another node, a wrong or revoked token, clocks more than 30 s apart) refuses and logs why:
    this then times out. ValueError for a bad operator, token, node or reason, before anything is sent."""
    signer = ReleaseSigner(operator, token)        # one scrypt; every resend is a fresh MAC
    reason = reason.strip()
    signer.sign(node=node, why=reason)             # checks node and reason now, not at the first publish
    publish = transport.publisher(release_topic, messages.STRING, reliable=True)
    _until_state(transport, publish, lambda: messages.string_msg(signer.sign(node=node, why=reason)),
                 latched=False, state_topic=state_topic,
                 what=f"a release of {node!r} by {signer.operator!r} on {release_topic}", timeout_s=timeout_s,
                 resend_s=resend_s)


def _until_state(transport: Transport, publish, msg: object | Callable[[], object], *, latched: bool,
                 state_topic: str, what: str, timeout_s: float, resend_s: float) -> None:
    confirmed = threading.Event()
    sent = threading.Event()
    seen: list[bool] = []

    def on_state(state: object) -> None:
        seen.append(bool(state.data))
        if sent.is_set() and bool(state.data) == latched:
            confirmed.set()

    transport.subscribe(state_topic, messages.BOOL, on_state, reliable=True)
    deadline = time.monotonic() + timeout_s
    while True:
        if publish.subscriber_count() > 0:
            publish(msg() if callable(msg) else msg)
            sent.set()
        if confirmed.wait(min(resend_s, max(deadline - time.monotonic(), 0.0))):
            return
        if time.monotonic() >= deadline:
            raise EstopError(f"no edge node confirmed {what} within {timeout_s:g} s "
                             f"({publish.subscriber_count()} subscriber(s) matched; "
                             f"states seen on {state_topic}: {seen[-5:] or 'none'})")
