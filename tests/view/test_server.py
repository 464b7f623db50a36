"""`tether view`'s Foxglove WebSocket server alone (bridge.view.server), in this event loop, spoken to by a plain
websockets client (tests/support/foxglove_client.py): the protocol, bad client messages, slow viewers, access."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
import websockets
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from bridge.experience.foxglove import Message, Topic, Translator
from bridge.security import Authorizer, TokenStore
from bridge.view.server import ExposedView, ViewServer
from protos import codec
from tests.experience.test_foxglove import SESSION, step
from tests.support.foxglove_client import FoxgloveClient, slow_viewer
from tests.support.waiting import until

BASE = f"/{SESSION}"


def message_class(advertisement: dict):
    """A class for a protobuf channel, built from its advertised schema only."""
    pool = descriptor_pool.DescriptorPool()
    for fd in descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(advertisement["schema"])).file:
        pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(advertisement["schemaName"]))


class Feed:
    """Transitions of tests/experience/test_foxglove.py through the translator into a server, as the feed does."""

    def __init__(self, server: ViewServer):
        self.server, self.translator, self.i = server, Translator(wanted=server.wanted), 0

    def step(self) -> list:
        t = step(self.i, episode=0, first=self.i == 0, last=False, version=1)
        self.i += 1
        messages = self.translator.translate(t)
        self.server.advertise(self.translator.topics.values())
        self.server.publish(messages)
        return t, messages


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_a_viewer_gets_server_info_the_channels_and_what_it_subscribed():
    async def main():
        server = await ViewServer(port=0).start()
        feed = Feed(server)
        try:
            _, made = feed.step()  # channels learnt; nobody watches: nothing translated
            assert made == []
            async with FoxgloveClient.connect(server.url) as c:
                assert c.server_info["name"] == "tether view" and c.server_info["capabilities"] == []
                channels = await c.wait_channels(lambda ch: f"{BASE}/hops" in ch)
                assert set(channels) == {"/log", f"{BASE}/camera/top", f"{BASE}/camera/front", f"{BASE}/state",
                                         f"{BASE}/action", f"{BASE}/hops", f"{BASE}/estop"}
                top = channels[f"{BASE}/camera/top"]
                assert (top["encoding"], top["schemaName"], top["schemaEncoding"]) == \
                    ("protobuf", "foxglove.CompressedImage", "protobuf")
                state = channels[f"{BASE}/state"]
                assert (state["encoding"], state["schemaEncoding"]) == ("json", "jsonschema")
                assert json.loads(state["schema"])["title"] == "tether.State"
                await c.subscribe([f"{BASE}/state", f"{BASE}/camera/top"])
                await until(lambda: server.wanted(f"{BASE}/state"), "the subscription")
                t, made = feed.step()
                assert {m.topic.topic for m in made} == {f"{BASE}/state", f"{BASE}/camera/top"}  # only what is watched
                got = {}
                while len(got) < 2:
                    topic, log_time, payload = await c.next_message()
                    got[topic] = (log_time, payload)
                assert got[f"{BASE}/state"][0] == t.timing.gateway_recv_ns
                values = json.loads(got[f"{BASE}/state"][1])["observation"]["joint_pos"]
                np.testing.assert_array_equal(np.float32(values), codec.decode(t.observation[0]))
                image = message_class(top).FromString(got[f"{BASE}/camera/top"][1])
                assert image.format == "jpeg" and image.data == t.observation[1].data
            await until(lambda: not server.viewers and not server.wanted(f"{BASE}/state"), "the viewer gone")
            assert server.stats()["sent"] == 2 and server.stats()["dropped"] == 0
        finally:
            await server.close()

    run(main())


@pytest.mark.parametrize(("message", "says"), [
    ("{not json", "not JSON"),
    ("[1, 2]", "JSON object with an \"op\""),
    ('{"op": "fly"}', "unknown op 'fly'"),
    ('{"op": "subscribe", "subscriptions": [{"id": 1, "channelId": 9999}]}', "channel 9999 is not advertised"),
    ('{"op": "subscribe", "subscriptions": [{"id": "x", "channelId": 1}]}', "expected a list of ids"),
    ('{"op": "subscribe"}', "expected \"subscriptions\""),
    ('{"op": "unsubscribe", "subscriptionIds": [77]}', "no subscription 77"),
    (b"\x01\x02\x03", "binary client messages"),
])
def test_a_bad_client_message_gets_a_status_and_harms_no_one(message, says):
    async def main():
        server = await ViewServer(port=0).start()
        feed = Feed(server)
        feed.step()
        try:
            async with FoxgloveClient.connect(server.url) as bad, FoxgloveClient.connect(server.url) as good:
                await good.wait_channels(lambda ch: f"{BASE}/state" in ch)
                await good.subscribe([f"{BASE}/state"])
                await bad.wait_channels(lambda ch: f"{BASE}/state" in ch)
                await bad.send_raw(message)
                status = await bad.wait_status()
                assert status["level"] == 2 and says in status["message"], status
                await bad.send_raw(message)  # again: still answered, still connected
                assert says in (await bad.wait_status())["message"]
                await until(lambda: server.wanted(f"{BASE}/state"), "the good viewer's subscription")
                t, _ = feed.step()
                topic, _, payload = await good.next_message(topic=f"{BASE}/state")
                assert json.loads(payload)["step"] == t.step
                assert sorted(v["bad_messages"] for v in server.stats()["viewers"]) == [0, 2]
        finally:
            await server.close()

    run(main())


def test_a_slow_viewer_loses_frames_counted_while_publishing_never_waits():
    """A viewer that never reads, beside one that does: 300 frames of 256 KB (75 MB) for each; publishing never
    waits, the slow one's frames beyond the queue are dropped and counted, the reading one gets every frame."""
    big = Topic("/big", "json", "tether.Big", "jsonschema", b"{}")

    async def main():
        server = await ViewServer(port=0, max_queue=8).start()
        server.advertise([big])
        try:
            async with slow_viewer(server.url, ready=lambda ch: "/big" in ch) as slow, \
                    FoxgloveClient.connect(server.url) as fast:
                await fast.wait_channels(lambda ch: "/big" in ch)
                await fast.subscribe(["/big"])
                await until(lambda: server.watched.get(1) == 2, "both subscribed")
                got = []

                async def read():
                    while len(got) < 300:
                        got.append(await fast.next_message())

                reader = asyncio.create_task(read())
                loop, publishing = asyncio.get_running_loop(), 0.0
                for i in range(300):
                    began = loop.time()
                    server.publish([Message(big, i, i, i.to_bytes(4, "little") * (64 << 10))])
                    publishing += loop.time() - began
                    await until(lambda: server.stats()["viewers"][1]["waiting"] < 4, "the reading viewer's queue")
                assert publishing < 5.0  # publish() only queues or drops (about 0.1 ms each here), whoever reads
                await asyncio.wait_for(reader, 60)
                assert [log_time for _, log_time, _ in got] == list(range(300))
                stats = server.stats()
                slow_stats, fast_stats = stats["viewers"]
                assert slow_stats["dropped"] > 200 and slow_stats["waiting"] <= 8, stats
                assert slow_stats["sent"] + slow_stats["waiting"] + slow_stats["dropped"] == 300
                assert fast_stats["dropped"] == 0 and fast_stats["sent"] == 300
                assert stats["dropped"] == slow_stats["dropped"] and slow.received <= 2
        finally:
            await server.close()

    run(main())


def test_a_viewer_whose_queue_is_full_still_gets_the_log_and_the_e_stop_state():
    """Frames past a lagging viewer's queue are dropped, log lines (e-stops) are not; the e-stop state is resent at
    every Fleet poll, so a dropped one is shown again."""
    big = Topic("/big", "json", "tether.Big", "jsonschema", b"{}")

    async def main():
        server = await ViewServer(port=0, max_queue=4).start()
        translator = Translator(wanted=server.wanted)
        server.advertise([big])
        translator.estop_state(SESSION, estopped=False, edge_estopped=False, estop_id="", t_ns=1)  # topics made
        server.advertise(translator.topics.values())
        try:
            async with slow_viewer(server.url, ready=lambda ch: {"/big", "/log", f"{BASE}/estop"} <= set(ch)):
                await until(lambda: len(server.stats()["viewers"]) == 1 and server.watched.get(
                    server.channels["/log"][0]), "subscribed")
                for i in range(100):  # 25 MB: the queue is full and the socket too
                    server.publish([Message(big, i, i, i.to_bytes(4, "little") * (64 << 10))])
                full = server.stats()["viewers"][0]
                assert full["dropped"] > 50 and full["waiting"] == 4, full
                for repeat in range(2):
                    server.publish(translator.estop_state(SESSION, estopped=True, edge_estopped=False,
                                                          estop_id="estop-1", t_ns=10 + repeat, repeat=True))
                after = server.stats()["viewers"][0]
                # the first poll: its state frame dropped (the queue is full), its log line queued; the second
                # poll: the state again (dropped again here: the viewer still does not read), no second log line
                assert after["waiting"] == 5 and after["dropped"] == full["dropped"] + 2, after
        finally:
            await server.close()

    run(main())


def test_with_tokens_a_viewer_needs_the_viewer_role(tmp_path):
    store = TokenStore(tmp_path / "tokens.json")
    viewer, robot, operator = (store.add(n, role=n) for n in ("viewer", "robot", "operator"))

    async def main():
        server = await ViewServer(port=0, host="127.0.0.1",
                                  auth=Authorizer(tokens=store, anonymous_viewers=False)).start()
        try:
            async with FoxgloveClient.connect(server.url, viewer) as c:
                assert c.server_info["op"] == "serverInfo"
            async with FoxgloveClient.connect(server.url, operator, header=True) as c:
                assert c.server_info["op"] == "serverInfo"
            for token, code in ((None, 401), ("viewer.wrong", 401), (robot, 403)):
                with pytest.raises(websockets.InvalidStatus) as refused:
                    async with FoxgloveClient.connect(server.url, token):
                        pass
                assert refused.value.response.status_code == code, token

            def get(path, token=None):
                request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", headers={
                    "Authorization": f"Bearer {token}"} if token else {})
                try:
                    with urllib.request.urlopen(request, timeout=10) as r:
                        return r.status, r.read()
                except urllib.error.HTTPError as e:
                    return e.code, e.read()

            status, body = await asyncio.to_thread(get, "/stats")
            assert status == 401 and b"viewer role needs credentials" in body
            status, body = await asyncio.to_thread(get, "/stats", viewer)
            assert status == 200 and json.loads(body)["viewers_total"] == 2 and json.loads(body)["refused"] == 4
        finally:
            await server.close()

    run(main())


def test_off_loopback_the_view_needs_tokens(tmp_path):
    with pytest.raises(ExposedView, match="not a loopback address"):
        ViewServer(host="0.0.0.0")
    ViewServer(host="0.0.0.0", auth=Authorizer(tokens=TokenStore(tmp_path / "t.json"), anonymous_viewers=False))
    run_ = subprocess.run([sys.executable, "-m", "tether", "view", "--host", "0.0.0.0", "--port", "0",
                           "--gateway", "127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert run_.returncode == 1 and "tether view: refusing to serve the view on '0.0.0.0'" in run_.stderr
    assert "Traceback" not in run_.stderr


def test_cross_site_pages_and_other_host_names_are_refused():
    async def main():
        server = await ViewServer(port=0, allowed_hosts=["view.lab"]).start()
        try:
            async with FoxgloveClient.connect(server.url, origin="https://app.foxglove.dev") as c:  # Foxglove's web app
                assert c.server_info["op"] == "serverInfo"
            with pytest.raises(websockets.InvalidStatus) as refused:
                async with FoxgloveClient.connect(server.url, origin="https://evil.example"):
                    pass
            assert refused.value.response.status_code == 403

            def get(host: str) -> tuple[int, bytes]:
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
                conn.request("GET", "/stats", headers={"Host": host})
                r = conn.getresponse()
                return r.status, r.read()

            status, body = await asyncio.to_thread(get, f"rebound.evil.example:{server.port}")  # DNS rebinding
            assert status == 421 and b"is not this view's" in body
            for host in (f"localhost:{server.port}", f"view.lab:{server.port}"):
                assert (await asyncio.to_thread(get, host))[0] == 200
            assert server.stats()["refused"] == 2
        finally:
            await server.close()

    run(main())


def test_wss_with_the_labs_certificate(tmp_path):
    from bridge.security.certs import init_certs
    from bridge.security.tls import TlsFiles, http_ssl_context

    certs = init_certs(tmp_path / "certs")
    context = ssl.create_default_context(cafile=str(certs["ca.crt"]))

    async def main():
        server = await ViewServer(port=0, ssl_context=http_ssl_context(TlsFiles(cert=certs["server.crt"],
                                                                                 key=certs["server.key"]))).start()
        try:
            assert server.url.startswith("wss://")
            async with FoxgloveClient.connect(server.url, ssl=context) as c:
                assert c.server_info["op"] == "serverInfo"
        finally:
            await server.close()

    run(main())


def test_the_benchmarks_viewers_read_what_is_published():
    """tests.support.foxglove_client.run_viewers (what benchmarks start N viewers with) against a publishing server."""
    from tests.support.foxglove_client import run_viewers

    async def main():
        server = await ViewServer(port=0).start()
        feed = Feed(server)
        feed.step()

        async def publish():
            while True:
                feed.step()
                await asyncio.sleep(0.005)

        publishing = asyncio.create_task(publish())
        try:
            # readers leave once they have 21 frames (60 s at most: a state, not a lucky second); the slow one
            # connects and never reads
            readers, slow = await asyncio.gather(run_viewers(server.url, 2, seconds=60, enough=21),
                                                 run_viewers(server.url, 1, seconds=0.5, slow=True))
            assert len(readers) == 2 and all(n > 20 for n in readers), readers
            assert slow == [0] and server.stats()["viewers_total"] == 3
        finally:
            publishing.cancel()
            await server.close()

    run(main())
