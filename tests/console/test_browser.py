"""The console in a real headless Chromium (Debian's, driven by Playwright) against a live gateway with
`tether sim` processes running: it shows the sessions; an operator's click is refused without a token and
done with one (what the gRPC API reports changes, the audit trail shows who): an e-stop of one robot, and
(with the rollout controller) a rollback of the live version; a screenshot for the README. And a page on
another site (evil.example, resolved to loopback by Chromium's host rules: no traffic leaves the machine)
cannot e-stop an open-access console, nor read it through DNS rebinding, while the console's own button works.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from bridge.client import Credentials, FleetClient, PoliciesClient
from protos import fleet_pb2, policies_pb2
from protos.codec import encode
from tests.conftest import ACT, OBS
from tests.support.gateways import running_gateway
from trainer.policy import MLPPolicy

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]  # headless, no sandbox and a fresh profile: Playwright's
EVIL = "evil.example"  # another site; Chromium resolves it to 127.0.0.1 (--host-resolver-rules)
EVIL_FLAGS = [f"--host-resolver-rules=MAP {EVIL} 127.0.0.1", "--disable-features=HttpsUpgrades"]
SCREENSHOT = ROOT / "docs" / "console.png"  # the README's; refreshed with TETHER_UPDATE_SCREENSHOT=1

playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is not installed (.[dev] extras)")
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason="Debian's chromium is not installed (make setup: apt-get install chromium)")


async def publish_v2(address: str, token: str) -> int:
    """A second version of walker through tether.v1.Policies (as a trainer publishes); its version number."""
    module = MLPPolicy(OBS[0], ACT[0], seed=1).eval()
    probe = np.random.default_rng(0).standard_normal((4, 11)).astype(np.float32)
    with torch.no_grad():
        reference = module(torch.from_numpy(probe)).numpy()
    data = safetensors.torch.save({k: v.contiguous() for k, v in module.state_dict().items()})
    header = policies_pb2.PublishHeader(
        policy="walker", format="safetensors", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
        lineage=policies_pb2.Lineage(parent_version=1, trainer_step=100, trainer="test"),
        probe_inputs=[encode("observation", probe)], probe_outputs=[encode("action", reference)])
    chunks = [policies_pb2.PublishChunk(header=header), policies_pb2.PublishChunk(data=data)]
    async with PoliciesClient(address, Credentials(token=token), aio=True) as policies:
        reply = await policies.publish_stream(chunks)
    return reply.version


async def live_version(address: str) -> int:
    async with PoliciesClient(address, aio=True) as policies:
        reply = await policies.rollout_status("walker")
    return reply.rollout.live


def tokens_file(tmp_path: Path) -> tuple[Path, str, str]:
    """A hashed tokens file (`tether token add`) the gateway checks: alice's operator token and a robot token."""
    from bridge.security.tokens import TokenStore

    store = TokenStore(tmp_path / "tokens.json")
    return store.path, store.add("alice", role="operator"), store.add("cell", role="robot")


async def start_sim(address: str, robot: str, token: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tether", "sim", "--gateway", address, "--env", "Hopper-v5", "--envs", "1",
        "--seconds", "120", "--label", f"robot={robot}", "--session-id", robot, "--status-every", "100",
        "--token", token, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)


async def standing_estops(address: str) -> list[fleet_pb2.EStop]:
    async with FleetClient(address, aio=True) as fleet:
        return list((await fleet.status()).estops)


async def fleet_status(address: str) -> dict[str, fleet_pb2.SessionStatus]:
    async with FleetClient(address, aio=True) as fleet:
        status = await fleet.status()
    return {s.session_id: s for s in status.sessions}


async def click_and_confirm(page, selector: str, why: str) -> str:
    """Click an action, confirm it in the dialog with a reason; the toast's text."""
    await page.locator("#toast").evaluate("t => { t.textContent = ''; t.className = ''; }")
    await page.click(selector)
    await page.wait_for_selector("#confirm[open]")
    await page.fill("#confirm-why", why)
    await page.click("#confirm-ok")
    await page.wait_for_selector("#toast.show")
    return await page.text_content("#toast")


def test_console_shows_the_fleet_and_operator_clicks_need_a_token(triton, tmp_path):
    """The gateway checks tokens (--tokens): the page's clicks carry alice's token, the console header and
    JSON from the console's own origin, and are done under her name."""
    triton.add_policy("walker")  # the test publishes v2 into the session's repository, its registry its own
    tokens, token, robot_token = tokens_file(tmp_path)

    async def scenario():
        async with running_gateway(triton.url, policy="walker", console_port=0, tokens=tokens,
                                   **triton.publishing(tmp_path)) as gw:
            assert not gw.auth.open_access
            rollout = getattr(gw, "rollout", None)
            if rollout is not None:
                assert await publish_v2(gw.address, token) == 2 and await live_version(gw.address) == 2
            sims = [await start_sim(gw.address, robot, robot_token) for robot in ("hopper_1", "hopper_2")]
            try:
                async with playwright_api.async_playwright() as p:
                    browser = await p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                    page = await browser.new_page(viewport={"width": 1400, "height": 1000})
                    await page.goto(gw.console.url)
                    row = '#sessions tr[data-session="hopper_1-0"]'
                    await page.wait_for_selector(row, timeout=30_000)
                    await page.wait_for_selector('#sessions tr[data-session="hopper_2-0"]', timeout=30_000)
                    assert f"walker v{2 if rollout else 1}" in await page.text_content(f"{row} td.version")
                    # each robot's latency budget, robot clock: a bar with a segment per measured hop
                    await page.wait_for_selector(f"{row} .budget .hop-triton", timeout=30_000)
                    hops = (await page.get_attribute(f"{row} .budget", "data-hops")).split()
                    assert {"observation_age", "triton", "reply"} <= set(hops), hops
                    await page.fill("#operator", "mallory")

                    # no token: refused, nothing changes
                    text = await click_and_confirm(page, f'{row} button[data-action="estop"]', "no token")
                    assert "refused (401)" in text, text
                    assert not await standing_estops(gw.address)
                    assert not (await fleet_status(gw.address))["hopper_1-0"].estopped
                    assert not gw.fleet.audit_events()

                    # with alice's operator token: done, under her name
                    await page.fill("#token", token)
                    text = await click_and_confirm(page, f'{row} button[data-action="estop"]', "person in the cell")
                    assert "done by operator:alice" in text, text
                    status = await fleet_status(gw.address)
                    assert status["hopper_1-0"].estopped and not status["hopper_2-0"].estopped
                    await page.wait_for_selector(f"{row} .state-held")
                    audit = '#audit tr[data-kind="estop"] td.who'
                    await page.wait_for_selector(audit)
                    assert await page.text_content(audit) == "operator:alice"
                    for _ in range(200):  # the held robot gets safe actions (bounded: 20 s)
                        held = {r["session_id"]: r["held_steps"] for r in gw.fleet.sessions()}
                        if held.get("hopper_1-0", 0) > 10 and gw.fleet.returns:
                            break
                        await asyncio.sleep(0.1)
                    assert held["hopper_1-0"] > 10 and held["hopper_2-0"] == 0, held
                    await page.wait_for_function("document.body.dataset.updated > 0")
                    for _ in range(300):  # a few chart points for the screenshot (one a second; bounded: 30 s)
                        if len(gw.console.history["steps_per_s"]) >= 3:
                            break
                        await asyncio.sleep(0.1)
                    since = len(gw.console.history["steps_per_s"])
                    await page.wait_for_function(f"(document.body.dataset.updated || 0) > {time.time()}")
                    assert since >= 3, since
                    if rollout is not None:  # rollback of the live version: v1 is live again
                        text = await click_and_confirm(page, 'button[data-action="rollback"][data-policy="walker"]',
                                                       "v2 walks worse")
                        assert "rollback done by operator:alice" in text, text
                        assert await live_version(gw.address) == 1
                        versions = {v.version: v.state for v in gw.fleet.status().versions}
                        assert versions == {1: "live", 2: "rolled_back"}, versions
                        change = '#audit tr[data-kind="state"]'
                        await page.wait_for_function(
                            "[...document.querySelectorAll('#audit tr')].some(r => r.textContent.includes("
                            "'live → rolled_back') && r.textContent.includes('operator:alice'))")
                        assert await page.locator(change).count() >= 3
                        await page.wait_for_selector('#versions tr[data-version="1"] .state-live')
                        # a person's intervention rate per version (the sims never step in: "-")
                        assert await page.text_content('#versions tr[data-version="1"] td.person') == "-"
                        await page.wait_for_function(  # the running robot moves to v1 at its next episode
                            "document.querySelector('#sessions tr[data-session=\"hopper_2-0\"] td.version')"
                            ".textContent === 'walker v1'", timeout=30_000)
                    await page.locator("#toast").evaluate("t => { t.className = ''; }")
                    shot = SCREENSHOT if os.environ.get("TETHER_UPDATE_SCREENSHOT") else tmp_path / "console.png"
                    await page.screenshot(path=str(shot), full_page=True)
                    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

                    text = await click_and_confirm(page, f'{row} button[data-action="release"]', "cell clear")
                    assert "release done by operator:alice" in text, text
                    assert not (await fleet_status(gw.address))["hopper_1-0"].estopped
                    await browser.close()
            finally:
                for sim in sims:
                    if sim.returncode is None:
                        sim.terminate()
                    await sim.wait()
            kinds = [(e["kind"], e["who"]) for e in gw.fleet.audit_events()]  # the fleet's own (e-stops)
            assert kinds == [("estop", "operator:alice"), ("release", "operator:alice")]

    asyncio.run(scenario())
    assert SCREENSHOT.stat().st_size > 10_000


EVIL_PAGE = """<!doctype html><title>cat pictures</title><p>nothing to see</p>"""


def test_a_page_on_another_site_cannot_steer_an_open_console_in_the_browser(triton):
    """Open access on loopback (what `tether demo` runs). A page on evil.example, open in the operator's
    Chromium: a no-CORS text/plain POST (the request no preflight stops) reaches the console and changes
    nothing; a JSON POST with the console header is stopped at its preflight; DNS rebinding (evil.example
    resolving to the console) gets 421. The console's own E-STOP ALL button then works."""
    from aiohttp import web

    async def scenario():
        evil_app = web.Application()
        async def evil_page(_request):
            return web.Response(text=EVIL_PAGE, content_type="text/html")

        evil_app.router.add_get("/", evil_page)
        evil_runner = web.AppRunner(evil_app, access_log=None)
        await evil_runner.setup()
        evil_site = web.TCPSite(evil_runner, "127.0.0.1", 0)
        await evil_site.start()
        evil_port = evil_site._server.sockets[0].getsockname()[1]
        try:
            async with running_gateway(triton.url, policy="tiny", console_port=0) as gw, \
                    playwright_api.async_playwright() as p:
                assert gw.auth.open_access
                console = f"http://127.0.0.1:{gw.console.port}/"
                browser = await p.chromium.launch(executable_path=CHROMIUM, args=FLAGS + EVIL_FLAGS)
                page = await browser.new_page()
                await page.goto(f"http://{EVIL}:{evil_port}/")
                assert await page.title() == "cat pictures"
                body = '{"target": {"all": true}, "why": "drive-by"}'
                for name in ("estop", "release"):  # answered (opaque to the page): the console has decided
                    kind = await page.evaluate(
                        "([url, body]) => fetch(url, {method: 'POST', mode: 'no-cors', body,"
                        " headers: {'Content-Type': 'text/plain'}}).then(r => r.type)", [console + "api/" + name, body])
                    assert kind == "opaque"
                    assert not await standing_estops(gw.address), name
                refused = await page.evaluate(
                    "([url, body]) => fetch(url, {method: 'POST', body, headers: {'Content-Type': 'application/json',"
                    " 'X-Tether-Console': '1'}}).then(r => 'answered ' + r.status, e => 'refused: ' + e)",
                    [console + "api/estop", body])
                assert refused.startswith("refused: TypeError"), refused
                rebound = await page.goto(f"http://{EVIL}:{gw.console.port}/api/state")
                assert rebound.status == 421 and "is not this console's" in await rebound.text()
                assert not await standing_estops(gw.address) and not gw.fleet.audit_events()

                await page.goto(console)  # the console's own page: its button works (open access)
                await page.wait_for_function("document.body.dataset.updated > 0")
                text = await click_and_confirm(page, "#estop-all", "drill")
                assert "estop done by operator:anonymous" in text, text
                assert [e.all for e in await standing_estops(gw.address)] == [True]
                await browser.close()
        finally:
            await evil_runner.cleanup()

    asyncio.run(scenario())
