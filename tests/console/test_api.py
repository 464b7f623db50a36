"""The console's JSON API on a live gateway: bad requests get 4xx naming the bad value and change nothing;
the page and its two static files are served from the package, nothing else; cross-site requests (a
foreign Host, a foreign Origin, a body that is not JSON, no console header) are refused before anything
changes; a console off loopback does not start without credentials."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
import pytest

from bridge.client import FleetClient
from bridge.security.hosts import ExposedConsole, allowed_host
from tests.support.gateways import running_gateway

OWN = {"X-Tether-Console": "1"}  # what the console page sends with every action


async def held(address: str) -> list:
    """The e-stops the gateway reports through tether.v1.Fleet (what `tether status` shows)."""
    async with FleetClient(address, aio=True) as fleet:
        return list((await fleet.status()).estops)


def test_bad_requests_are_refused_with_the_reason(triton):
    async def scenario():
        async with running_gateway(triton.url, policy="tiny", console_port=0) as gw, aiohttp.ClientSession() as http:
            url = gw.console.url

            async def post(name: str, data) -> tuple[int, str]:
                kw = {"data": data, "headers": {**OWN, "Content-Type": "application/json"}} \
                    if isinstance(data, str | bytes) else {"json": data, "headers": OWN}
                async with http.post(url + "api/" + name, **kw) as reply:
                    return reply.status, (await reply.json())["error"] if reply.status != 200 else ""

            cases = [
                ("estop", "{not json", 400, "not JSON"),
                ("estop", [1, 2], 400, "JSON object"),
                ("estop", {"target": "all"}, 400, "target must be an object"),
                ("estop", {"target": {"all": True, "robot": "a"}}, 400, "exactly one"),
                ("estop", {"target": {"everyone": True}}, 400, "unknown target field(s) ['everyone']"),
                ("estop", {"target": {"robot": "a"}, "why": 7}, 400, "why must be a string"),
                ("promote", {"policy": "tiny", "version": "2", "to": "live"}, 400,
                 "version must be an integer, got '2'"),
                ("promote", {"policy": "tiny", "version": 1, "to": "sideways"}, 400, "sideways"),
                ("canary", {"policy": "tiny", "fraction": "half"}, 400, "fraction must be a number, got 'half'"),
                ("pin", {"policy": "", "selector": "robot=a", "version": 1}, 400, "policy must be a non-empty string"),
            ]
            for name, body, status, message in cases:
                got, error = await post(name, body)
                assert got == status and message in error, (name, body, got, error)
            assert not await held(gw.address) and not gw.fleet.audit_events()
            for path, status in (("", 200), ("static/app.js", 200), ("static/style.css", 200),
                                 ("static/index.html", 404), ("static/..%2fserver.py", 404), ("nope", 404)):
                async with http.get(url + path) as reply:
                    assert reply.status == status, (path, reply.status)
            async with http.get(url) as reply:
                page = await reply.text()
            assert "http://" not in page and "https://" not in page  # nothing from the internet
            async with http.get(url + "static/app.js") as reply:  # the page sends what the server asks for
                script = await reply.text()
            assert '"X-Tether-Console": "1"' in script and '"Content-Type": "application/json"' in script

    asyncio.run(scenario())


def test_cross_site_requests_are_refused_and_change_nothing(triton):
    """Open access on loopback (what `tether demo` runs): a page on evil.example in the operator's browser
    posts text/plain (no CORS preflight) or JSON, or rebinds DNS so its Host is evil.example. Each is
    refused with its code and a JSON error naming what was wrong; the same request from the console's own
    origin with its header is done."""

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", console_port=0) as gw, aiohttp.ClientSession() as http:
            url, own = gw.console.url, gw.console.url.rstrip("/")
            port = gw.console.port
            estop = '{"target": {"all": true}, "why": "drive-by"}'
            promote = '{"policy": "tiny", "version": 1, "to": "live", "why": "drive-by"}'
            evil = "http://evil.example"

            async def send(method: str, path: str, body: str | None, headers: dict) -> tuple[int, str]:
                async with http.request(method, url + path, data=body, headers=headers) as reply:
                    data = await reply.json(content_type=None)
                    return reply.status, data.get("error", "") if isinstance(data, dict) else ""

            probes = [  # (method, path, body, headers, status, what the error names)
                *[("POST", f"api/{name}", body, {"Content-Type": "text/plain", "Origin": evil}, 403,
                   "Origin 'http://evil.example'") for name, body in
                  (("estop", estop), ("release", estop), ("promote", promote))],
                ("POST", "api/estop", estop, {"Content-Type": "application/json", "Origin": evil, **OWN}, 403,
                 "cross-site"),
                ("POST", "api/estop", estop, {"Content-Type": "application/json", "Origin": "null", **OWN}, 403,
                 "Origin 'null'"),
                ("POST", "api/estop", estop, {"Content-Type": "application/json",
                                              "Origin": f"http://127.0.0.1.evil.example:{port}", **OWN}, 403,
                 "is not this console"),
                ("POST", "api/estop", estop, {"Content-Type": "text/plain", "Origin": own, **OWN}, 415,
                 "must be application/json, got Content-Type 'text/plain'"),
                ("POST", "api/estop", estop, {"Content-Type": "application/x-www-form-urlencoded", **OWN}, 415,
                 "application/x-www-form-urlencoded"),
                ("POST", "api/release", estop, {"Content-Type": "application/json", "Origin": own}, 403,
                 "needs the header 'X-Tether-Console: 1'"),
                ("POST", "api/estop", estop, {"Content-Type": "application/json", "X-Tether-Console": "yes"}, 403,
                 "X-Tether-Console"),
                ("GET", "api/state", None, {"Host": f"evil.example:{port}"}, 421,
                 f"Host 'evil.example:{port}' is not this console's"),
                ("GET", "api/state", None, {"Host": "evil.example"}, 421, "--console-allowed-host"),
                ("GET", "metrics", None, {"Host": "evil.example"}, 421, "is not this console's"),
                ("GET", "", None, {"Host": f"127.0.0.1:{port + 1}"}, 421, "is not this console's"),
                ("POST", "api/estop", estop, {"Host": f"evil.example:{port}", "Content-Type": "application/json",
                                              "Origin": f"http://evil.example:{port}", **OWN}, 421, "Host"),
            ]
            for method, path, body, headers, status, message in probes:
                got, error = await send(method, path, body, headers)
                assert got == status and message in error, (method, path, headers, got, error)
            assert not await held(gw.address) and not gw.fleet.audit_events()

            for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):  # loopback names are its own
                async with http.get(url + "api/state", headers={"Host": host}) as reply:
                    assert reply.status == 200 and "sessions" in await reply.json(), host
            status, error = await send("POST", "api/estop", estop,
                                       {"Content-Type": "application/json; charset=utf-8", "Origin": own,
                                        "Host": f"localhost:{port}", **OWN})
            assert status == 200, error
            assert [e.all for e in await held(gw.address)] == [True]
            assert [(e["kind"], e["who"]) for e in gw.fleet.audit_events()] == [("estop", "operator:anonymous")]

    asyncio.run(scenario())


def test_a_console_behind_a_proxy_answers_to_the_names_it_is_given(triton):
    async def scenario():
        async with running_gateway(triton.url, policy="tiny", console_port=0,
                                   console_allowed_hosts=("Console.Example.com",)) as gw, \
                aiohttp.ClientSession() as http:
            url, port = gw.console.url, gw.console.port
            for host, origin, status in (("console.example.com", "https://console.example.com", 200),
                                         (f"console.example.com:{port}", f"http://console.example.com:{port}", 200),
                                         ("console.example.com", "https://other.example.com", 403),
                                         ("console.example.com:1", None, 421),
                                         ("other.example.com", None, 421)):
                headers = {"Host": host, "Origin": origin} if origin else {"Host": host}
                async with http.get(url + "api/state", headers=headers) as reply:
                    assert reply.status == status, (host, origin, reply.status, await reply.text())

    asyncio.run(scenario())
    assert allowed_host("[::1]:8080") == "[::1]:8080" and allowed_host("::1") == "[::1]"
    for bad in ("http://x", "x:port", "a b", "x:70000"):
        with pytest.raises(ValueError, match="is not NAME or NAME:PORT"):
            allowed_host(bad)


def test_a_console_off_loopback_needs_credentials_whatever_the_grpc_bind(triton, tmp_path):
    """gRPC on loopback (open access there), the console on 0.0.0.0: refused at start, in the library and
    in `tether gateway`. With a tokens file it starts and open access is off (no traffic but loopback)."""
    from bridge.security.tokens import TokenStore

    async def refused():
        with pytest.raises(ExposedConsole, match="refusing to serve the console on '0.0.0.0'.*--tokens"):
            async with running_gateway(triton.url, policy="tiny", console_port=0, console_host="0.0.0.0",
                                       insecure=True):
                pass

    asyncio.run(refused())
    cli = subprocess.run([sys.executable, "-m", "tether", "gateway", "--triton", triton.url, "--port", "0",
                          "--console-port", "0", "--console-host", "0.0.0.0", "--insecure"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode != 0 and "refusing to serve the console on '0.0.0.0'" in cli.stderr, cli.stderr[-2000:]
    bad = subprocess.run([sys.executable, "-m", "tether", "gateway", "--triton", triton.url,
                          "--console-allowed-host", "x:port"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--console-allowed-host" in bad.stderr and "'x:port'" in bad.stderr, bad.stderr

    store = TokenStore(tmp_path / "tokens.json")
    token = store.add("alice", role="operator")

    async def with_tokens():
        async with running_gateway(triton.url, policy="tiny", console_port=0, console_host="0.0.0.0",
                                   insecure=True, tokens=store.path) as gw, aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{gw.console.port}/"
            body = {"target": {"robot": "arm_1"}, "why": "test"}
            async with http.post(url + "api/estop", json=body, headers=OWN) as reply:
                assert reply.status == 401 and "needs credentials" in (await reply.json())["error"]
            async with http.post(url + "api/estop", json=body,
                                 headers={**OWN, "Authorization": f"Bearer {token}"}) as reply:
                assert reply.status == 200 and (await reply.json())["who"] == "operator:alice"
            assert [e.robot for e in await held(gw.address)] == ["arm_1"]

    asyncio.run(with_tokens())
