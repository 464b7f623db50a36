"""`tether.v1.Experience.Subscribe` over a real grpc.aio server on loopback, beside a real log."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest

from bridge.experience import ExperienceLog
from bridge.experience.service import ExperienceService
from bridge.experience.shards import shard_of
from protos import experience_pb2, experience_pb2_grpc
from tests.experience.helpers import transition
from tests.support.waiting import until

OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]


@contextlib.asynccontextmanager
async def served(directory, **log_kw):
    async with ExperienceLog(directory, **log_kw) as log:
        server = grpc.aio.server()
        service = ExperienceService(log)
        experience_pb2_grpc.add_ExperienceServicer_to_server(service, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS)
        try:
            yield log, service, experience_pb2_grpc.ExperienceStub(channel)
        finally:
            await channel.close()
            await server.stop(None)


def start(**kw) -> experience_pb2.SubscribeRequest:
    return experience_pb2.SubscribeRequest(start=experience_pb2.SubscribeStart(**kw))


def ack(through: int) -> experience_pb2.SubscribeRequest:
    return experience_pb2.SubscribeRequest(ack=experience_pb2.SubscribeAck(through_offset=through))


async def append_all(log, items):
    return await asyncio.gather(*(log.append(t) for t in items))


async def receive(call, n: int, *, acking: bool = True) -> list:
    got = []
    while len(got) < n:
        batch = await asyncio.wait_for(call.read(), 30)
        assert batch is not grpc.aio.EOF
        assert all(t.offset < batch.log_end for t in batch.transitions), "a non-durable transition was sent"
        got += batch.transitions
        if acking:
            await call.write(ack(batch.next_offset))
    return got


def test_replay_then_live(tmp_path):
    async def main():
        async with served(tmp_path, segment_bytes=16 << 10) as (log, _, stub):
            await append_all(log, [transition("a", i) for i in range(60)])
            call = stub.Subscribe()
            await call.write(start(from_offset=10, window=32, max_batch=7))
            replay = await receive(call, 50)
            assert [t.offset for t in replay] == list(range(10, 60))
            live = asyncio.ensure_future(receive(call, 25))
            await append_all(log, [transition("a", i) for i in range(60, 85)])
            got = await live
            assert [t.offset for t in got] == list(range(60, 85))
            assert [t.step for t in got] == list(range(60, 85))
            call.cancel()

    asyncio.run(main())


def test_ack_window_stops_sending_until_acked(tmp_path):
    async def main():
        async with served(tmp_path) as (log, service, stub):
            await append_all(log, [transition("a", i) for i in range(40)])
            call = stub.Subscribe()
            await call.write(start(window=8, max_batch=4))
            first = await receive(call, 8, acking=False)
            assert len(first) == 8
            (sub,) = service.subscriptions
            # it stopped at the full window: from there only an ack lets it send (a wait on state, no sleep)
            await until(lambda: sub.credit_waits == 1, "the subscription to stop at its window")
            assert (sub.sent, sub.inflight) == (8, 8)
            await call.write(ack(3))  # frees offsets 0, 1, 2
            more = await receive(call, 3, acking=False)
            assert [t.offset for t in more] == [8, 9, 10]
            await until(lambda: sub.credit_waits == 2, "the subscription to stop at its window again")
            assert (sub.sent, sub.inflight) == (11, 8)
            await call.write(ack(11))
            rest = await receive(call, 29)
            assert [t.offset for t in first + more + rest] == list(range(40))
            call.cancel()

    asyncio.run(main())


def test_shards_and_policy_filter_split_the_log(tmp_path):
    async def main():
        async with served(tmp_path) as (log, _, stub):
            items = [transition(f"robot-{i % 8}", i // 8, policy="pi" if i % 3 else "other") for i in range(96)]
            await append_all(log, items)
            shards = []
            for shard in (0, 1):
                call = stub.Subscribe()
                await call.write(start(shard=shard, num_shards=2, max_batch=16))
                expect = sum(1 for t in items if shard_of(t.session, 2) == shard)
                shards.append(await receive(call, expect))
                call.cancel()
            call = stub.Subscribe()
            await call.write(start(policy="other"))
            other = await receive(call, 32)
            call.cancel()
            return items, shards, other

    items, (s0, s1), other = asyncio.run(main())
    assert {shard_of(t.session, 2) for t in s0} == {0} and {shard_of(t.session, 2) for t in s1} == {1}
    assert sorted(t.offset for t in s0 + s1) == list(range(96)) and s0 and s1
    assert [t.offset for t in other] == [t.offset for t in items if t.policy == "other"]


def test_a_subscriber_that_stops_reading_neither_blocks_appends_nor_loses_anything(tmp_path):
    async def main():
        async with served(tmp_path) as (log, service, stub):
            stalled = stub.Subscribe()
            await stalled.write(start(window=100_000))  # never reads: flow control fills up
            await until(lambda: service.subscribers == 1, "the subscription")
            gone = stub.Subscribe()
            await gone.write(start())
            await until(lambda: service.subscribers == 2, "the second subscription")
            items = [transition("cam", i, image=(224, 224, 3)) for i in range(400)]
            acks = asyncio.gather(*(log.append(t) for t in items[:200]))
            gone.cancel()  # a dead subscriber
            offsets = await asyncio.wait_for(acks, 60) + await asyncio.wait_for(append_all(log, items[200:]), 60)
            assert offsets == list(range(400)) and log.durable_offset == 400
            await until(lambda: service.subscribers == 1, "the dead subscriber to be released")
            (sub,) = service.subscriptions
            assert sub.sent < 400, "flow control should have held the stalled subscriber back"
            got = await receive(stalled, 400)  # it resumes and gets everything, in order
            assert [t.offset for t in got] == list(range(400))
            stalled.cancel()

    asyncio.run(main())


@pytest.mark.parametrize("requests, field", [
    ([ack(0)], "start"),
    ([start(shard=2, num_shards=2)], "start.shard"),
    ([start(shard=1)], "start.shard"),
    ([start(window=1 << 30)], "start.window"),
    ([start(max_batch=1 << 20)], "start.max_batch"),
    ([start(), ack(1000)], "ack.through_offset"),
    ([start(), start()], "start"),
])
def test_bad_requests_are_invalid_argument_naming_the_field(tmp_path, requests, field):
    async def main():
        async with served(tmp_path) as (log, _, stub):
            await append_all(log, [transition("a", 0)])
            call = stub.Subscribe()
            for r in requests:
                await call.write(r)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                for _ in range(10):
                    await asyncio.wait_for(call.read(), 30)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details().startswith(field + ":"), err.value.details()

    asyncio.run(main())


def test_a_subscriber_resumes_from_next_offset_without_loss_or_repeats(tmp_path):
    async def main():
        async with served(tmp_path, segment_bytes=16 << 10) as (log, _, stub):
            await append_all(log, [transition(f"s{i % 3}", i // 3) for i in range(90)])
            call = stub.Subscribe()
            await call.write(start(max_batch=10, shard=1, num_shards=2))
            batch = await asyncio.wait_for(call.read(), 30)
            first = list(batch.transitions)
            call.cancel()  # gone mid-stream; more is logged meanwhile
            await append_all(log, [transition(f"s{i % 3}", 30 + i // 3) for i in range(90)])
            call = stub.Subscribe()
            await call.write(start(from_offset=batch.next_offset, shard=1, num_shards=2))
            expect = [t for t in range(180) if shard_of(f"s{t % 3}", 2) == 1]
            rest = await receive(call, len(expect) - len(first))
            call.cancel()
            assert [t.offset for t in first + rest] == expect

    asyncio.run(main())


def test_camera_batches_fit_a_client_with_the_default_4mb_limit(tmp_path):
    async def main():
        async with ExperienceLog(tmp_path) as log:
            await append_all(log, [transition("cam", i, image=(224, 224, 3)) for i in range(60)])
            server = grpc.aio.server()
            experience_pb2_grpc.add_ExperienceServicer_to_server(ExperienceService(log), server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:  # default options
                call = experience_pb2_grpc.ExperienceStub(channel).Subscribe()
                await call.write(start())
                got = await receive(call, 60)
                call.cancel()
            await server.stop(None)
            return got

    got = asyncio.run(main())
    assert [t.offset for t in got] == list(range(60))
