"""The Foxglove WebSocket server of `tether view`: channels, viewers with bounded queues, access rules, counts.

    server = ViewServer(host="127.0.0.1", port=8765, auth=Authorizer())    # open access: loopback only
    await server.start()                               # server.url: ws://127.0.0.1:8765
    server.advertise(topics)                           # bridge.experience.foxglove.Topic: new channels for everyone
    server.publish(messages)                           # Message: to each viewer subscribed to its channel
    server.stats()                                     # what GET /stats answers (JSON)
    await server.close()

Why not foxglove-sdk's own server (`foxglove.start_server`): it has no hook to check a token in the upgrade
request, and a slow viewer's backlog is the SDK's (`message_backlog_size`) with no count of what it dropped.
Here the protocol (bridge.view.protocol) runs on `websockets`; the SDK gives the schemas.

Each viewer has one sender task and one queue: data frames beyond `max_queue` waiting are dropped and counted
(per viewer and in total), so `publish` never waits for a viewer and the experience stream's consumer never
stalls. The log channel's lines (episodes, versions, e-stops: rare events) wait beyond `max_queue`, up to
`MAX_EVENTS` more, so a lagging viewer still sees every e-stop; the e-stop state is resent at every Fleet poll
(bridge.view.feed). Control messages (serverInfo, advertise, status) are never dropped; a viewer with more than
`MAX_CONTROL` of them waiting (it sends garbage and never reads) is disconnected. A client message that is not
the protocol gets a status message back; nothing a client sends stops the server or another viewer.

Cross-site requests (a web page in the operator's browser, DNS rebinding) are refused before anything else, as
the console refuses them: a Host that is not the view's own (the bound host:port; for a loopback or wildcard bind
also localhost, 127.0.0.1 and [::1] with the port; and `allowed_hosts`) gets 421; an Origin header that is not
one of `allowed_origins` (default Foxglove's web app, https://app.foxglove.dev) nor the view's own gets 403.
Clients that send no Origin (Foxglove's desktop app, scripts) pass.

Access: with a tokens file (`Authorizer(tokens=TokenStore(path), anonymous_viewers=False)`) a viewer presents a
token with the viewer role (operator and trainer tokens hold it too) as `Authorization: Bearer NAME.SECRET` or
`?token=NAME.SECRET` in the upgrade request: none or a bad one is HTTP 401, a token without the role 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import secrets
import socket
import ssl
from collections.abc import Iterable
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

import websockets
from websockets.asyncio.server import ServerConnection, serve

import bridge.view.protocol as protocol
from bridge.common.errors import PermissionDenied, Unauthenticated
from bridge.experience.foxglove import LOG_TOPIC, Message, Topic
from bridge.security import AUTH_HEADER, Authorizer
from bridge.security.hosts import allowed_host
from bridge.security.tls import InsecureBind, is_loopback

__all__ = ["ExposedView", "ViewServer", "Viewer", "check_view_bind"]

log = logging.getLogger("tether.view")
MAX_CONTROL = 1000
MAX_EVENTS = 256  # log lines that may wait beyond a viewer's max_queue
DEFAULT_MAX_QUEUE = 64
SEND_BUFFER = 1 << 20  # bytes of a viewer's socket send buffer
FOXGLOVE_WEB = "https://app.foxglove.dev"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
WILDCARDS = ("", "0.0.0.0", "::", "[::]")


class ExposedView(InsecureBind):
    """A view on a non-loopback address without a tokens file."""


def check_view_bind(host: str, auth: Authorizer) -> None:
    """The console's rule (bridge.security.hosts.check_console_bind): open access only on loopback.

    >>> check_view_bind("127.0.0.1", Authorizer())
    >>> check_view_bind("0.0.0.0", Authorizer())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    bridge.view.server.ExposedView: refusing to serve the view on '0.0.0.0', which is not a loopback address, ...
    """
    if is_loopback(host):
        return
    if auth.open_access or auth.tokens is None:
        raise ExposedView(f"refusing to serve the view on {host!r}, which is not a loopback address, without "
                          f"viewer tokens: give --tokens FILE (tether token add NAME --role viewer), or bind "
                          f"127.0.0.1 (--host)")


class Viewer:
    """One connected viewer: its subscriptions, its queue and its counts."""

    def __init__(self, ident: int, ws: ServerConnection, who: str, max_queue: int):
        self.ident, self.ws, self.who, self.max_queue = ident, ws, who, max_queue
        self.subscriptions: dict[int, int] = {}   # subscription id -> channel id
        self.by_channel: dict[int, int] = {}      # channel id -> subscription id
        self.queue: asyncio.Queue[tuple[bool, str | bytes] | None] = asyncio.Queue()
        self.data_waiting = self.control_waiting = 0
        self.sent = self.dropped = self.bad_messages = 0

    def offer(self, channel_id: int, log_time_ns: int, payload: bytes, *, event: bool = False) -> None:
        sub = self.by_channel.get(channel_id)
        if sub is None:
            return
        if self.data_waiting >= self.max_queue + (MAX_EVENTS if event else 0):
            self.dropped += 1
            return
        self.data_waiting += 1
        self.queue.put_nowait((True, protocol.message_data(sub, log_time_ns, payload)))

    def control(self, message: dict) -> None:
        if self.control_waiting >= MAX_CONTROL:
            self.queue.put_nowait(None)  # the sender closes the connection
            return
        self.control_waiting += 1
        self.queue.put_nowait((False, json.dumps(message)))

    async def send_loop(self) -> None:
        while (item := await self.queue.get()) is not None:
            is_data, frame = item
            if not is_data:
                self.control_waiting -= 1
            await self.ws.send(frame)  # waits while the viewer does not read: the frame still counts as waiting
            if is_data:
                self.data_waiting -= 1
                self.sent += 1
        await self.ws.close(1008, "too many control messages waiting: the viewer does not read")

    def summary(self) -> dict:
        return {"id": self.ident, "who": self.who, "subscriptions": len(self.subscriptions),
                "waiting": self.data_waiting, "sent": self.sent, "dropped": self.dropped,
                "bad_messages": self.bad_messages}


class ViewServer:
    """The server (module docstring). `status`: a callable giving more of the stats (the feed's)."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 8765, auth: Authorizer | None = None,
                 max_queue: int = DEFAULT_MAX_QUEUE, name: str = "tether view",
                 ssl_context: ssl.SSLContext | None = None, status=None, allowed_hosts: Iterable[str] = (),
                 allowed_origins: Iterable[str] = (FOXGLOVE_WEB,)):
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        self.auth = auth or Authorizer()
        check_view_bind(host, self.auth)
        self.host, self.port, self.max_queue, self.name = host, port, max_queue, name
        self.ssl_context, self._status = ssl_context, status
        self.configured_hosts = tuple(allowed_host(h) for h in allowed_hosts)
        self.allowed_origins = frozenset(_origin(o) for o in allowed_origins)
        self.allowed_hosts: frozenset[str] = frozenset()  # once bound (the port is known)
        self.channels: dict[str, tuple[int, Topic]] = {}
        self._ids = itertools.count(1)
        self._viewer_ids = itertools.count(1)
        self.viewers: set[Viewer] = set()
        self.watched: dict[int, int] = {}   # channel id -> viewers subscribed to it
        self.dropped = self.sent_closed = self.viewers_total = self.refused = 0
        self.published = 0
        self.session_id = secrets.token_hex(8)
        self._server = None

    @property
    def url(self) -> str:
        return f"{'wss' if self.ssl_context else 'ws'}://{self.host}:{self.port}"

    async def start(self) -> ViewServer:
        self._server = await serve(self._handle, self.host, self.port, subprotocols=[protocol.SUBPROTOCOL],
                                   process_request=self._process_request, ssl=self.ssl_context,
                                   max_size=protocol.MAX_TEXT, max_queue=16, compression=None,
                                   close_timeout=1)
        self.port = self._server.sockets[0].getsockname()[1]
        bound = self.host.lower()
        names = {f"[{bound}]" if ":" in bound and not bound.startswith("[") else bound} - set(WILDCARDS)
        if is_loopback(self.host) or self.host in WILDCARDS:
            names |= set(LOOPBACK_NAMES)
        hosts = {f"{n}:{self.port}" for n in names}
        for entry in self.configured_hosts:
            has_port = entry.rpartition(":")[2].isdigit() and not entry.endswith("]")
            hosts |= {entry} if has_port else {entry, f"{entry}:{self.port}"}
        self.allowed_hosts = frozenset(hosts)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    # -- the feed's side ------------------------------------------------------------------------------------

    def wanted(self, topic: str) -> bool:
        """Whether a viewer watching `topic` has room for its next message: the translator makes none that nobody
        watches, nor one every watcher would drop (counted here as dropped for each of them)."""
        found = self.channels.get(topic)
        if found is None or not self.watched.get(found[0]):
            return False
        if topic == LOG_TOPIC:  # events: offered past a full queue (Viewer.offer)
            return True
        watchers = [v for v in self.viewers if found[0] in v.by_channel]
        if any(v.data_waiting < v.max_queue for v in watchers):
            return True
        for v in watchers:
            v.dropped += 1
        return False

    def advertise(self, topics: Iterable[Topic]) -> None:
        new = []
        for topic in topics:
            if topic.topic not in self.channels:
                cid = next(self._ids)
                self.channels[topic.topic] = (cid, topic)
                new.append(topic.advertisement(cid))
        if new:
            for v in self.viewers:
                v.control(protocol.advertise(new))

    def publish(self, messages: Iterable[Message]) -> None:
        for m in messages:
            found = self.channels.get(m.topic.topic)
            if found is None:
                self.advertise([m.topic])
                found = self.channels[m.topic.topic]
            self.published += 1
            for v in self.viewers:
                v.offer(found[0], m.log_time_ns, m.data, event=m.topic.topic == LOG_TOPIC)

    def stats(self) -> dict:
        viewers = sorted((v.summary() for v in self.viewers), key=lambda s: s["id"])
        return {"url": self.url, "viewers": viewers, "viewers_total": self.viewers_total, "refused": self.refused,
                "channels": len(self.channels), "published": self.published,
                "sent": self.sent_closed + sum(v["sent"] for v in viewers),
                "dropped": self.dropped + sum(v["dropped"] for v in viewers),
                **(self._status() if self._status else {})}

    # -- the viewers' side -----------------------------------------------------------------------------------

    async def _process_request(self, connection: ServerConnection, request):
        url = urlsplit(request.path)
        headers = {k.lower(): v for k, v in request.headers.raw_items()}
        host = headers.get("host", "").strip().lower()
        if host not in self.allowed_hosts:
            self.refused += 1
            return connection.respond(HTTPStatus.MISDIRECTED_REQUEST, f"Host {host or '(none)'!r} is not this view's "
                                      f"(it answers to {', '.join(sorted(self.allowed_hosts))}; behind a proxy or "
                                      f"by another name: --allowed-host NAME)\n")
        origin = headers.get("origin")
        scheme = "https" if self.ssl_context else "http"
        if origin is not None and _origin(origin) not in self.allowed_origins | {f"{scheme}://{host}"}:
            self.refused += 1
            return connection.respond(HTTPStatus.FORBIDDEN, f"Origin {origin[:200]!r} may not open this view "
                                      f"(allowed: {', '.join(sorted(self.allowed_origins)) or 'none'}; "
                                      f"--allowed-origin URL adds one)\n")
        token = parse_qs(url.query).get("token", [None])[0]
        if token:
            headers[AUTH_HEADER] = f"Bearer {token}"
        try:
            connection.username = await self.auth.check_http(headers, "viewer")
        except (Unauthenticated, PermissionDenied) as exc:
            self.refused += 1
            code = HTTPStatus.UNAUTHORIZED if isinstance(exc, Unauthenticated) else HTTPStatus.FORBIDDEN
            return connection.respond(code, f"{exc}\n")
        if url.path.rstrip("/") == "/stats":
            response = connection.respond(HTTPStatus.OK, json.dumps(self.stats()) + "\n")
            response.headers["Content-Type"] = "application/json"
            return response
        if "upgrade" not in headers.get("connection", "").lower():
            return connection.respond(HTTPStatus.OK, f"{self.name}: a Foxglove WebSocket server "
                                      f"({protocol.SUBPROTOCOL}) at {self.url}; GET /stats for its counts\n")
        offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]
        if protocol.SUBPROTOCOL not in offered:
            return connection.respond(HTTPStatus.BAD_REQUEST, f"expected the WebSocket subprotocol "
                                      f"{protocol.SUBPROTOCOL}\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        viewer = Viewer(next(self._viewer_ids), ws, getattr(ws, "username", "viewer:anonymous"), self.max_queue)
        sock = ws.transport.get_extra_info("socket")
        if sock is not None:  # what the kernel holds for a viewer is bounded too (no autotuning to megabytes)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        self.viewers.add(viewer)
        self.viewers_total += 1
        viewer.control(protocol.server_info(self.name, session_id=self.session_id))
        if self.channels:
            viewer.control(protocol.advertise([t.advertisement(cid) for cid, t in self.channels.values()]))
        sender = asyncio.create_task(viewer.send_loop())
        log.info("viewer %d (%s) connected from %s", viewer.ident, viewer.who, ws.remote_address)
        try:
            async for message in ws:
                self._on_message(viewer, message)
        except websockets.ConnectionClosed:
            pass
        finally:
            self.viewers.discard(viewer)
            for cid in viewer.by_channel:
                self.watched[cid] -= 1
            self.dropped += viewer.dropped
            self.sent_closed += viewer.sent
            sender.cancel()
            with contextlib.suppress(BaseException):
                await sender
            log.info("viewer %d left: %d sent, %d dropped", viewer.ident, viewer.sent, viewer.dropped)

    def _on_message(self, viewer: Viewer, message: str | bytes) -> None:
        try:
            op, msg = protocol.parse_client(message)
            if op == "subscribe":
                self._subscribe(viewer, msg["subscriptions"])
            else:
                self._unsubscribe(viewer, msg["subscriptionIds"])
        except protocol.ProtocolError as exc:
            viewer.bad_messages += 1
            viewer.control(protocol.status(protocol.ERROR, str(exc)))

    def _subscribe(self, viewer: Viewer, subs: list[dict]) -> None:
        known = {cid for cid, _ in self.channels.values()}
        wrong = []
        for s in subs:
            sid, cid = s["id"], s["channelId"]
            if cid not in known:
                wrong.append(f"channel {cid} is not advertised")
            elif sid in viewer.subscriptions:
                wrong.append(f"subscription {sid} is already in use")
            elif cid in viewer.by_channel:
                wrong.append(f"channel {cid} is already subscribed (subscription {viewer.by_channel[cid]})")
            else:
                viewer.subscriptions[sid], viewer.by_channel[cid] = cid, sid
                self.watched[cid] = self.watched.get(cid, 0) + 1
        if wrong:
            raise protocol.ProtocolError("subscribe: " + "; ".join(wrong))

    def _unsubscribe(self, viewer: Viewer, ids: list[int]) -> None:
        wrong = []
        for sid in ids:
            cid = viewer.subscriptions.pop(sid, None)
            if cid is None:
                wrong.append(str(sid))
                continue
            del viewer.by_channel[cid]
            self.watched[cid] -= 1
        if wrong:
            raise protocol.ProtocolError(f"unsubscribe: no subscription {', '.join(wrong)}")


def _origin(value: str) -> str:
    """An Origin as compared: lower case, no trailing slash ("https://app.foxglove.dev")."""
    return value.strip().lower().rstrip("/")
