"""The console's JSON API on a live gateway: bad requests get 4xx naming the bad value and change nothing;
the page and its two static files are served from the package, nothing else."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.gateway.helpers import running_gateway


def test_bad_requests_are_refused_with_the_reason(triton):
    async def scenario():
        async with running_gateway(triton.url, policy="tiny", console_port=0) as gw, aiohttp.ClientSession() as http:
            url = gw.console.url

            async def post(name: str, data) -> tuple[int, str]:
                kw = {"data": data} if isinstance(data, str | bytes) else {"json": data}
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
            assert not gw.fleet.estops and not gw.fleet.audit_events()
            for path, status in (("", 200), ("static/app.js", 200), ("static/style.css", 200),
                                 ("static/index.html", 404), ("static/..%2fserver.py", 404), ("nope", 404)):
                async with http.get(url + path) as reply:
                    assert reply.status == status, (path, reply.status)
            async with http.get(url) as reply:
                page = await reply.text()
            assert "http://" not in page and "https://" not in page  # nothing from the internet

    asyncio.run(scenario())
