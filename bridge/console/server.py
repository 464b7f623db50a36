"""The operator console: HTTP inside the gateway process, on its asyncio loop (aiohttp).

    console = Console(gateway, host="127.0.0.1", port=0)     # the gateway starts it (--console-port)
    await console.start(); console.url                       # http://127.0.0.1:PORT/
    await console.stop()

Routes (reads need the "viewer" role, actions "operator": `gateway.auth.check_http`; a refusal is
HTTP 401/403 with the reason):
    GET  /                  the page (HTML + JS + CSS from bridge/console/static, nothing from the internet)
    GET  /api/state         fleet, versions, rollout, e-stops, audit trail, chart series (the page polls it)
    GET  /metrics           Prometheus text format
    POST /api/estop         {"target": {"session_id"|"robot"|"all": ...}, "why": "..."}
    POST /api/release       the same
    POST /api/promote       {"policy", "version", "to": "shadow"|"canary"|"live", "fraction"?, "labels"?, "why"}
    POST /api/rollback      {"policy", "version"?: int (default: the live one), "why"}
    POST /api/canary        {"policy", "fraction"?, "labels"?, "why"}
    POST /api/pin           {"policy", "selector": "session=ID"|"KEY=VALUE", "version": int | null, "why"}
Every action is audited with the operator's name (`who` from the credentials). With `ssl_context` it
serves HTTPS, and a verified client certificate (mTLS) is an identity as on gRPC.

Cross-site requests (a web page in the operator's browser, DNS rebinding) are refused before any handler
runs, each with a JSON error naming what was wrong:
    421  the Host is not the console's own: the bound host:port; for a loopback or wildcard bind also
         localhost, 127.0.0.1 and [::1] with the port; and the names in `allowed_hosts` (a console
         behind a proxy: `tether gateway --console-allowed-host console.example.com`)
    403  an Origin that is not one of those (scheme included), or a state-changing call (POST) without
         the header `X-Tether-Console: 1` (a form or a simple cross-site fetch cannot send it)
    415  a state-changing call whose body is not `Content-Type: application/json`
Open access (no credentials) is for a console bound to loopback only: on any other address the console
refuses to start (`ExposedConsole`) unless the gateway has tokens or client certificates, whatever the
gRPC bind.

/api/state never waits on a database: on a shared (PostgreSQL) registry it reads the follower's snapshot
(`gateway.fleet.view`, bridge.registry.view); e-stops, sessions and figures are in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import ssl
import time
from collections import Counter, deque
from pathlib import Path
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

import grpc
import numpy as np
from aiohttp import web

from bridge.console.fleet import BadTarget, Fleet, Target
from bridge.gateway.config import GatewayConfig
from bridge.gateway.errors import GatewayError
from bridge.metrics import CONTENT_TYPE, MetricsSource
from bridge.registry.newest import newest_versions, version_lags
from bridge.security import Authorizer
from bridge.security.hosts import allowed_host, check_console_bind
from bridge.security.tls import is_loopback

log = logging.getLogger("tether.console")
STATIC = Path(__file__).parent / "static"
HTTP_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.UNAUTHENTICATED: 401,
               grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.NOT_FOUND: 404,
               grpc.StatusCode.ALREADY_EXISTS: 409, grpc.StatusCode.FAILED_PRECONDITION: 409,
               grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.UNIMPLEMENTED: 501,
               grpc.StatusCode.UNAVAILABLE: 503}
MAX_BODY = 64 << 10
HISTORY = 600  # chart points (one a second)
STATE_MAX_AGE_S = 0.5  # /api/state is computed at most twice a second, whoever asks
CONSOLE_HEADER = "X-Tether-Console"  # "1" on every state-changing call: a cross-site form or simple fetch cannot
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
WILDCARDS = ("", "0.0.0.0", "::", "[::]")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


@runtime_checkable
class ConsoleSource(MetricsSource, Protocol):
    """What the console's HTTP server reads and forwards to (bridge.console.server.Console)."""

    @property
    def auth(self) -> Authorizer: ...

    @property
    def config(self) -> GatewayConfig: ...

    @property
    def address(self) -> str: ...

    @property
    def server_version(self) -> str: ...

    @property
    def fleet(self) -> Fleet: ...

    def logging_state(self) -> str: ...


class Console:
    def __init__(self, gateway: ConsoleSource, *, host: str = "127.0.0.1", port: int = 0, sample_s: float = 1.0,
                 ssl_context: ssl.SSLContext | None = None, allowed_hosts: tuple[str, ...] = ()):
        self._gw = gateway
        self.host, self.port, self.sample_s = host, port, sample_s
        self.ssl_context = ssl_context  # HTTPS (bridge.security.tls.http_ssl_context); client certs are identities
        self.configured_hosts = tuple(allowed_host(h) for h in allowed_hosts)  # e.g. the proxy's name
        self.allowed_hosts: frozenset[str] = frozenset()  # every Host (and Origin host) accepted, once bound
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._sampler: asyncio.Task | None = None
        self._cached: tuple[float, bytes] | None = None
        self._events: deque[dict] = deque(maxlen=500)   # the registry's newest audit events
        self._event_id = 0
        self.history: dict[str, deque] = {"steps_per_s": deque(maxlen=HISTORY), "lag_versions": deque(maxlen=HISTORY),
                                          "lag_s": deque(maxlen=HISTORY)}
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._same_site])
        app.router.add_get("/", self._index)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/api/state", self._state)
        app.router.add_get("/metrics", self._metrics)
        for name in ("estop", "release", "promote", "rollback", "canary", "pin"):
            app.router.add_post(f"/api/{name}", self._action(name))
        self.app = app

    async def start(self) -> None:
        check_console_bind(self.host, self._gw.auth)
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_port=False, ssl_context=self.ssl_context)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise OSError(f"cannot bind the console to {self.host}:{self.port}: {exc}") from exc
        port = site._server.sockets[0].getsockname()[1]
        self.port = port
        self.url = f"{self.scheme}://{self.host}:{port}/"
        self.allowed_hosts = self._allowed(port)
        self._sampler = asyncio.create_task(self._sample())

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context else "http"

    def _allowed(self, port: int) -> frozenset[str]:
        """The Host values this console answers to (see the module docstring)."""
        bound = self.host.lower()
        names = {f"[{bound}]" if ":" in bound and not bound.startswith("[") else bound} - set(WILDCARDS)
        if is_loopback(self.host) or self.host in WILDCARDS:
            names |= set(LOOPBACK_NAMES)
        allowed = {f"{n}:{port}" for n in names}
        if port == (443 if self.ssl_context else 80):
            allowed |= names  # browsers leave the default port out
        for entry in self.configured_hosts:
            has_port = entry.rpartition(":")[2].isdigit() and not entry.endswith("]")
            allowed |= {entry} if has_port else {entry, f"{entry}:{port}"}
        return frozenset(allowed)

    @web.middleware
    async def _same_site(self, request: web.Request, handler) -> web.StreamResponse:
        """Middleware: Host (421), Origin (403), and for state-changing calls the JSON body (415) and
        the console header (403), before any handler runs."""
        host = (request.headers.get("Host") or "").strip().lower()
        if host not in self.allowed_hosts:
            return _refusal(421, f"Host {host or '(none)'!r} is not this console's (it answers to "
                                 f"{', '.join(sorted(self.allowed_hosts))}; behind a proxy, start the gateway "
                                 f"with --console-allowed-host NAME)")
        origin = request.headers.get("Origin")
        if origin is not None and not self._own_origin(origin):
            return _refusal(403, f"Origin {origin!r} is not this console ({self.scheme}://{host}): "
                                 f"cross-site requests are refused")
        if request.method not in SAFE_METHODS:
            if request.content_type != "application/json":
                return _refusal(415, f"the body of {request.method} {request.path} must be application/json, "
                                     f"got Content-Type {request.headers.get('Content-Type') or '(none)'!r}")
            if request.headers.get(CONSOLE_HEADER) != "1":
                return _refusal(403, f"{request.method} {request.path} needs the header '{CONSOLE_HEADER}: 1' "
                                     f"(the console page sends it; a cross-site form cannot)")
        return await handler(request)

    def _own_origin(self, origin: str) -> bool:
        try:
            parts = urlsplit(origin.strip())
            netloc = (parts.netloc or "").lower()
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or parts.path not in ("", "/") or "@" in netloc:
            return False
        if parts.scheme == self.scheme and netloc in self.allowed_hosts:
            return True
        return any(netloc in (e, f"{e}:{self.port}") for e in self.configured_hosts)  # a TLS proxy's https

    # -- pages and reads --------------------------------------------------------------------------

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html", headers=_NO_CACHE)

    async def _static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in ("app.js", "style.css"):
            raise web.HTTPNotFound(text=f"no static file {name!r}")
        return web.FileResponse(STATIC / name, headers=_NO_CACHE)

    async def _metrics(self, request: web.Request) -> web.Response:
        if (refused := await self._refused(request, "viewer")) is not None:
            return refused
        return web.Response(body=self._gw.fleet.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def _state(self, request: web.Request) -> web.Response:
        if (refused := await self._refused(request, "viewer")) is not None:
            return refused
        now = time.monotonic()
        if self._cached is None or now - self._cached[0] > STATE_MAX_AGE_S:  # many viewers: one computation
            self._cached = (now, _dumps(self.state()).encode())
        return web.Response(body=self._cached[1], content_type="application/json", headers=_NO_CACHE)

    def state(self) -> dict:
        gw, fleet = self._gw, self._gw.fleet
        lat = fleet.latencies_ms()
        edges = [0.0, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 25, 50, 100, 1e9]
        counts = np.histogram(lat, bins=edges)[0].tolist() if lat.size else [0] * (len(edges) - 1)
        returns = {f"{p} v{v}": list(series)[-200:] for (p, v), series in sorted(fleet.returns.items())}
        return {
            "t": time.time(),
            "gateway": {"address": gw.address, "triton": gw.server_version, "default_policy": gw.config.policy,
                        "console": self.url, "switch": gw.config.switch, "rollout": _rollout_mode(gw),
                        "logging": gw.logging_state()},  # "ok", "off", "degraded: <why>"
            "sessions": self._sessions(),
            "versions": self._versions(),
            "estops": [{"target": key, "who": e.who, "why": e.why, "t_ns": e.t_ns} for key, e in fleet.estops.items()],
            "audit": self._audit(),
            "charts": {"steps_per_s": list(self.history["steps_per_s"]),
                       "lag_versions": list(self.history["lag_versions"]), "lag_s": list(self.history["lag_s"]),
                       "returns": returns, "latency": {"edges_ms": edges[:-1], "counts": counts}},
        }

    def _sessions(self) -> list[dict]:
        rows = self._gw.fleet.sessions()
        fresh = freshness(self._gw)
        for row in rows:
            lag = ((fresh or {}).get("sessions") or {}).get(row["session_id"]) or {}
            row["version_lag"], row["time_lag_s"] = lag.get("version_lag"), lag.get("time_lag_s")
        return rows

    def _versions(self) -> list[dict]:
        """Per policy: its versions (lineage, gate checks, state, runtime figures) and its rollout."""
        gw = self._gw
        registry, rollout = _view(gw), gw.rollout
        acting = Counter((s.policy.name, s.policy.version) for s in list(gw.sessions.values()))
        policies = sorted(set(registry.policies()) if registry is not None else {p for p, _ in acting} |
                          ({gw.config.policy} if gw.config.policy else set()))
        out = []
        for policy in policies:
            stats = _safe(lambda p=policy: rollout.version_stats(p)) if rollout is not None else None
            entry = {"policy": policy, "rollout": None, "versions": []}
            if registry is not None:
                entry["rollout"] = _safe(lambda p=policy: _shallow(registry.rollout(p)))
                for rec in registry.versions(policy):
                    d = _shallow(rec)
                    d["state"] = str(rec.state)
                    d["sessions"] = acting.get((policy, rec.version), 0)
                    d["stats"] = (stats or {}).get(rec.version)
                    entry["versions"].append(d)
            else:
                for (p, v), n in sorted(acting.items()):
                    if p == policy:
                        entry["versions"].append({"policy": p, "version": v, "state": "serving", "sessions": n,
                                                  "lineage": {}, "gate": [], "stats": (stats or {}).get(v)})
            out.append(entry)
        return out

    def _audit(self, limit: int = 100) -> list[dict]:
        """The registry's events and the fleet's operator actions, newest first."""
        registry = _view(self._gw)
        if registry is not None:  # registry.events pages oldest first: follow it with a cursor, keep the newest
            if self._event_id == 0:  # at first, the newest page only (one indexed read), never the whole log
                first = _safe(lambda: registry.latest_events(limit=self._events.maxlen)) or []
                self._events.extend({**_shallow(e), "source": "registry"} for e in first)
                self._event_id = first[-1].id if first else 0
            while batch := _safe(lambda: registry.events(since_id=self._event_id, limit=1000)) or []:
                for e in batch:
                    self._events.append({**_shallow(e), "source": "registry"})
                self._event_id = batch[-1].id
                if len(batch) < 1000:
                    break
        events = list(self._events)[-limit:]
        events += [{**e, "source": "gateway"} for e in self._gw.fleet.audit_events(limit) if not e["in_registry"]]
        events.sort(key=lambda e: e["t_ns"], reverse=True)
        return events[:limit]

    async def _sample(self) -> None:
        """One chart point a second: fleet steps/s and policy freshness."""
        fleet = self._gw.fleet
        last_rows, last_t = fleet.total_rows, time.monotonic()
        while True:
            await asyncio.sleep(self.sample_s)
            now, rows = time.monotonic(), fleet.total_rows
            t = round(time.time(), 3)
            self.history["steps_per_s"].append([t, round((rows - last_rows) / max(now - last_t, 1e-9), 2)])
            last_rows, last_t = rows, now
            lag_v, lag_s = _freshness(self._gw)
            self.history["lag_versions"].append([t, lag_v])
            if lag_s is not None:
                self.history["lag_s"].append([t, lag_s])

    # -- actions ----------------------------------------------------------------------------------

    async def _refused(self, request: web.Request, role: str) -> web.Response | None:
        try:
            await self._who(request, role)
        except GatewayError as exc:
            return _error(exc)
        return None

    async def _who(self, request: web.Request, role: str) -> str:
        """The caller's identity for `role` (tokens, or a verified client certificate over HTTPS); a token's
        scrypt check runs off the event loop (`Authorizer.check_http`)."""
        peer_cert = None
        if self.ssl_context is not None and request.transport is not None:
            ssl_object = request.transport.get_extra_info("ssl_object")
            peer_cert = ssl_object.getpeercert() if ssl_object is not None else None
        auth = self._gw.auth
        if auth.open_access and not is_loopback(self.host):
            raise _Refused(f"this console is bound to {self.host!r}, not loopback: open access is off here; "
                           f"the gateway needs --tokens or --tls-client-ca")
        return await auth.check_http(request.headers, role, peer_cert=peer_cert or None)

    def _action(self, name: str):
        async def handler(request: web.Request) -> web.Response:
            try:
                who = await self._who(request, "operator")
                try:
                    body = await request.json()
                except (ValueError, UnicodeDecodeError) as exc:
                    raise BadTarget(f"the request body is not JSON: {exc}") from None
                if not isinstance(body, dict):
                    raise BadTarget(f"the request body must be a JSON object, got {type(body).__name__}")
                why = body.get("why") or ""
                if not isinstance(why, str) or len(why) > 512:
                    raise BadTarget("why must be a string of at most 512 characters")
                do = getattr(self, f"_do_{name}")
                result = _plain(await do(body, who=who, why=why or f"{name} from the console"))
                log.info("console: %s by %s: %s", name, who, why)
                return web.json_response({"ok": True, "who": who, "result": result}, dumps=_dumps)
            except GatewayError as exc:
                return _error(exc)
            except (ValueError, TypeError, KeyError) as exc:
                return web.json_response({"ok": False, "error": f"{name}: {exc}"}, status=400)
        return handler

    async def _do_estop(self, body: dict, *, who: str, why: str):
        changed, held = await self._gw.fleet.estop(_target(body), who=who, why=why)
        return {"changed": changed, "held": held}

    async def _do_release(self, body: dict, *, who: str, why: str):
        changed, held = await self._gw.fleet.release(_target(body), who=who, why=why)
        return {"changed": changed, "held": held}

    async def _do_promote(self, body: dict, *, who: str, why: str):
        from bridge.registry import State

        return await self._controller().promote(
            _str(body, "policy"), _int(body, "version"), State(_str(body, "to")), who=who, why=why,
            fraction=_opt_float(body, "fraction"), labels=_opt_labels(body))

    async def _do_rollback(self, body: dict, *, who: str, why: str):
        version = body.get("version")
        return await self._controller().rollback(_str(body, "policy"), None if version is None else
                                                 _int(body, "version"), who=who, why=why)

    async def _do_canary(self, body: dict, *, who: str, why: str):
        return await self._controller().set_canary(_str(body, "policy"), fraction=_opt_float(body, "fraction"),
                                                   labels=_opt_labels(body), who=who, why=why)

    async def _do_pin(self, body: dict, *, who: str, why: str):
        version = body.get("version")
        return await self._controller().pin(_str(body, "policy"), _str(body, "selector"),
                                            None if version is None else _int(body, "version"), who=who, why=why)

    def _controller(self):
        rollout = self._gw.rollout
        if rollout is None:
            raise _NoRollout("this gateway has no rollout controller (promote, rollback, canary and pin need one)")
        return rollout


class _NoRollout(GatewayError, status=grpc.StatusCode.UNIMPLEMENTED):
    """A rollout change asked of a gateway without a rollout controller."""


class _Refused(GatewayError, status=grpc.StatusCode.PERMISSION_DENIED):
    """A console request whose credentials may not do what it asks (or none, off loopback)."""


_NO_CACHE = {"Cache-Control": "no-store"}


def _refusal(status: int, error: str) -> web.Response:
    log.warning("console: refused (%d): %s", status, error)
    return web.json_response({"ok": False, "error": error}, status=status)


def _error(exc: GatewayError) -> web.Response:
    return web.json_response({"ok": False, "error": str(exc)}, status=HTTP_STATUS.get(exc.status, 500))


def _target(body: dict) -> Target:
    target = body.get("target")
    if not isinstance(target, dict):
        raise BadTarget(f"target must be an object naming session_id, robot or all, got {target!r}")
    unknown = set(target) - {"session_id", "robot", "all"}
    if unknown:
        raise BadTarget(f"unknown target field(s) {sorted(unknown)}")
    return Target(session_id=str(target.get("session_id") or ""), robot=str(target.get("robot") or ""),
                  all=target.get("all") is True)


def _str(body: dict, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value or len(value) > 256:
        raise BadTarget(f"{key} must be a non-empty string, got {value!r}")
    return value


def _int(body: dict, key: str) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadTarget(f"{key} must be an integer, got {value!r}")
    return value


def _opt_float(body: dict, key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadTarget(f"{key} must be a number, got {value!r}")
    return float(value)


def _opt_labels(body: dict) -> dict[str, str] | None:
    labels = body.get("labels")
    if labels is None:
        return None
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise BadTarget(f"labels must be an object of strings, got {labels!r}")
    return labels


def _shallow(record) -> dict:
    """A dataclass record's fields as a dict (no deep copy: dataclasses.asdict costs 10x; JSON does the rest)."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


def _plain(value):
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def _view(gw):
    """What the page reads of the registry: the fleet's view (a shared registry's snapshot), else the registry."""
    view = getattr(getattr(gw, "fleet", None), "view", None)
    return view if view is not None else gw.registry


def _rollout_mode(gw) -> str:
    plan = gw.config.rollout
    return str(plan.mode or "") if plan is not None else ""


def _freshness(gw) -> tuple[int, float | None]:
    """(version lag, time lag in s or None) of the fleet: the rollout controller's when it has one."""
    fresh = freshness(gw)
    if fresh is not None:
        policies = fresh.get("policies") or {}
        return (max((int(p.get("max_version_lag", 0)) for p in policies.values()), default=0),
                max((float(p.get("max_time_lag_s", 0.0)) for p in policies.values()), default=0.0))
    acting = [(s.policy.name, s.policy.version) for s in list(gw.sessions.values())]
    policies = {p for p, _ in acting}  # the lag of the policies sessions act with (bridge.registry.newest)
    newest = (_safe(lambda: newest_versions(_view(gw), acting, policies=policies))
              or newest_versions(None, acting))
    return max(version_lags(newest, acting).values(), default=0), None


def freshness(gw) -> dict | None:
    """The rollout controller's freshness ({"sessions": {id: {...}}, "policies": {name: {...}}}), or None."""
    rollout = gw.rollout
    fresh = _safe(rollout.freshness) if rollout is not None else None
    return fresh if isinstance(fresh, dict) and isinstance(fresh.get("policies"), dict) else None


def _safe(fn):
    try:
        return fn()
    except Exception as exc:  # a read for the page never breaks the page; the error shows in the log
        log.debug("console read failed: %s", exc)
        return None


def _dumps(value) -> str:
    return json.dumps(_finite(value), default=_json_default, allow_nan=False)


def _finite(value):
    """NaN and infinities (e.g. in gate figures) become null: the page gets valid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)
