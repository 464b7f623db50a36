"""Session ownership bound to identity (issue 23, part 4): real gateway processes with robot tokens, on one real
PostgreSQL registry (started by the test).

Robot A (token robot:arm_a) steps session `arm-a` on gw-0. Robot B, with its own valid robot token (robot:arm_b),
says Hello with A's session id on gw-0 (where A is connected) and on gw-1 (the other gateway, sharing the registry):
both are refused PERMISSION_DENIED with the reason, and before any epoch moved. A keeps acting through and after
the attempts (every step answered, durable_through moving on), its row in `session_owners` still says gw-0, epoch 1,
robot:arm_a, and its log is untouched: gw-0's log holds A's steps under epoch 1 alone, gw-1's holds nothing of
`arm-a`. Once A has left, B is still refused on gw-1 (the id stays bound), and A itself moves to gw-1 (epoch 2).
The store's rule itself (SQLite and PostgreSQL): a refused claim changes nothing; open access binds nothing.
"""

from __future__ import annotations

import asyncio

import grpc
import psycopg
import pytest

from bridge.client import Credentials, aio_channel
from bridge.registry.ownership import OwnershipRefused, open_ownership
from bridge.security.tokens import TokenStore
from tests.fleet.support import Gateways
from tests.gateway.test_session_takeover import Stream
from tether.cluster.postgres import PostgresServer, postgres_bin_dir

pytestmark = pytest.mark.skipif(postgres_bin_dir() is None, reason="PostgreSQL's initdb is not installed")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_target(request, tmp_path):
    if request.param == "sqlite":
        yield str(tmp_path / "registry.sqlite")
        return
    with PostgresServer(tmp_path / "pg") as pg:
        yield pg.url


def test_a_claim_by_another_identity_changes_nothing(store_target):
    owners, other = open_ownership(store_target), open_ownership(store_target)  # two gateways' stores
    try:
        first = owners.claim("arm-a", owner="gw-0", identity="robot:arm_a")
        assert (first.epoch, first.identity) == (1, "robot:arm_a")
        for store, gateway in ((owners, "gw-0"), (other, "gw-1")):
            for identity in ("robot:arm_b", None):  # another robot; a gateway with open access
                with pytest.raises(OwnershipRefused, match="session 'arm-a' belongs to another identity"):
                    store.claim("arm-a", owner=gateway, identity=identity)
        assert owners.current("arm-a") == ("gw-0", 1) and owners.stale({("arm-a", 1)}) == set()
        moved = other.claim("arm-a", owner="gw-1", identity="robot:arm_a")  # the same robot moves: allowed
        assert (moved.epoch, moved.previous, moved.identity) == (2, ("gw-0", 1), "robot:arm_a")
        # open access binds nothing: any caller claims, as before; the first authenticated claim binds it
        assert [owners.claim("open", owner=g).epoch for g in ("gw-0", "gw-1", "gw-0")] == [1, 2, 3]
        assert other.claim("open", owner="gw-1", identity="robot:arm_b").identity == "robot:arm_b"
        with pytest.raises(OwnershipRefused):
            owners.claim("open", owner="gw-0")
    finally:
        owners.close()
        other.close()


def _row(url: str, session: str) -> tuple:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT owner, epoch, identity FROM session_owners WHERE session = %s",
                            (session,)).fetchone()


def test_robot_b_cannot_take_robot_a_session_on_either_gateway(triton, tmp_path):
    store = TokenStore(tmp_path / "tokens.json")
    arm_a, arm_b = store.add("arm_a", role="robot"), store.add("arm_b", role="robot")
    with PostgresServer(tmp_path / "pg") as pg:
        gateways = Gateways(tmp_path, triton.url, 2, pg.url)
        gateways.start("--tokens", str(tmp_path / "tokens.json"), "--fsync-interval-ms", "1")

        async def scenario() -> dict:
            gw0, gw1 = gateways.addresses
            out: dict = {"refused": [], "steps": []}
            async with aio_channel(gw0, Credentials(token=arm_a)) as a_channel, \
                    aio_channel(gw0, Credentials(token=arm_b)) as b_here, \
                    aio_channel(gw1, Credentials(token=arm_b)) as b_there:
                a = await Stream.open(a_channel, "arm-a")
                assert (a.welcome.owner_epoch, a.welcome.gateway_id) == (1, "gw-0"), a.welcome
                step = 0

                async def act(n: int) -> None:
                    nonlocal step
                    for _ in range(n):
                        reply = await a.step(step)
                        assert reply.WhichOneof("kind") == "action", reply
                        out["steps"].append((step, reply.durable_through))
                        step += 1

                await act(10)
                for channel in (b_here, b_there):
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await Stream.open(channel, "arm-a")
                    out["refused"].append((info.value.code(), info.value.details()))
                    await act(5)  # A acts on, untouched by the refusal
                    assert _row(pg.url, "arm-a") == ("gw-0", 1, "robot:arm_a")
                durable_before = out["steps"][-1][1]
                while out["steps"][-1][1] < durable_before + 5:
                    assert step < 500, out["steps"][-5:]  # acknowledged on: the epoch is still current
                    await act(1)
                    await asyncio.sleep(0.01)
                await a.call.done_writing()
            # A has left: the id stays bound to robot:arm_a on every gateway; A itself moves to gw-1
            async with aio_channel(gw1, Credentials(token=arm_b)) as b_there, \
                    aio_channel(gw1, Credentials(token=arm_a)) as a_there:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await Stream.open(b_there, "arm-a")
                out["refused"].append((info.value.code(), info.value.details()))
                assert _row(pg.url, "arm-a") == ("gw-0", 1, "robot:arm_a")
                moved = await Stream.open(a_there, "arm-a")
                out["moved"] = (moved.welcome.owner_epoch, moved.welcome.gateway_id, moved.welcome.next_step)
                await moved.call.done_writing()
            out["answered"] = step
            return out

        try:
            out = asyncio.run(scenario())
        finally:
            gateways.stop()
        final = _row(pg.url, "arm-a")
    on_a_gateway, on_other, after = out["refused"]
    assert on_a_gateway[0] == grpc.StatusCode.PERMISSION_DENIED, on_a_gateway
    assert "session 'arm-a' is already connected under another identity: robot:arm_b may not take it over" \
        in on_a_gateway[1]
    for code, details in (on_other, after):
        assert code == grpc.StatusCode.PERMISSION_DENIED, (code, details)
        assert "session 'arm-a' belongs to another identity: robot:arm_b may not claim it" in details, details
        assert "robot:arm_a" not in details  # the holder's identity is not told to the caller
    assert out["moved"][:2] == (2, "gw-1") and final == ("gw-1", 2, "robot:arm_a"), (out["moved"], final)
    # A's log is untouched: gw-0 holds its steps, each once, all under epoch 1; gw-1 logged nothing of it
    logged = [(t.step, t.owner_epoch) for t in gateways.raw(0) if t.session == "arm-a"]
    steps = [s for s, _ in logged]
    assert {e for _, e in logged} == {1} and steps == sorted(set(steps)), logged
    assert set(range(out["answered"] - 1)) <= set(steps) <= set(range(out["answered"])), (steps, out["answered"])
    assert not [t for t in gateways.raw(1) if t.session == "arm-a"]
    assert "Hello from robot:arm_b refused" in gateways.logs[1].read_text()
    print(f"\nrobot B refused on A's gateway and on the other ({out['refused'][0][1]!r}; {out['refused'][1][1]!r}); "
          f"A answered {out['answered']} steps, durable through {out['steps'][-1][1]}, epoch 1 throughout")
