"""Client processes for the several-gateways tests: simulated sessions through `bridge.client.Session`, and
edge sessions through the edge node's own gateway link (`bridge.ros2.link.GatewayLink`).

    python -m tests.fleet.clients sim --gateways A,B --sessions 16 --prefix sim0 --out sim0.json --stop STOPFILE
    python -m tests.fleet.clients edge --gateways A,B --sessions 4 --prefix edge --out edge.json --stop STOPFILE

Each session steps a cheap synthetic env (an 11-float observation, 40-step episodes: FIRST, MID..., LAST)
at `--hz`, against the tests' `tiny` policy. The process prints `ready` once every session has 20 answered
steps, `resumed` once every session that had to move (its first gateway gone) has 20 answered steps after
the move, and stops when STOPFILE exists; then it writes, per session: the steps answered with an action,
the versions that answered, the client's final `durable_through`, and its failovers (with their latency).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import queue
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

from bridge.client import Credentials, Session
from protos import bridge_pb2
from protos.codec import Spec, encode
from tests.support.waiting import until

OBS = (Spec("observation", np.float32, (11,)),)
ACT = (Spec("action", np.float32, (3,), low=(-1.0,), high=(1.0,)),)
EPISODE = 40
READY = 20


def hello(session_id: str, source: str) -> bridge_pb2.Hello:
    return bridge_pb2.Hello(session_id=session_id, policy="tiny", source=source,
                            observation_spec=[s.to_proto() for s in OBS], action_spec=[s.to_proto() for s in ACT])


def observation(step: int, rng: np.random.Generator) -> bridge_pb2.Observation:
    k = step % EPISODE
    kind = bridge_pb2.FIRST if k == 0 else bridge_pb2.LAST if k == EPISODE - 1 else bridge_pb2.MID
    return bridge_pb2.Observation(step=step, step_type=kind, episode=step // EPISODE, reward=1.0,
                                  t_sent_ns=time.time_ns(),
                                  tensors=[encode("observation", rng.standard_normal(11).astype(np.float32))])


@dataclasses.dataclass
class Record:
    id: str
    first_gateway: str = ""
    answered: list[int] = dataclasses.field(default_factory=list)
    versions: Counter = dataclasses.field(default_factory=Counter)
    durable_through: int = 0
    failovers: list[dict] = dataclasses.field(default_factory=list)
    after_move: int = 0   # steps answered since the last failover
    moves: int = 0        # failovers so far (live)
    resent: list[int] = dataclasses.field(default_factory=list)  # edge: in flight at a break; the session resent
    #                                                              it and its reply came late (no command)
    late_replies: int = 0

    def moved(self) -> bool:
        return bool(self.failovers)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["versions"] = dict(self.versions)
        return d


def answered(record: Record, step: int, msg: bridge_pb2.ServerMessage) -> None:
    if msg.WhichOneof("kind") == "action":
        assert msg.action.step == step, (record.id, step, msg)
        record.answered.append(step)
        record.versions[msg.action.policy_version] += 1
        record.after_move += 1


class Gate:
    """Holds in-process sessions between two steps (nothing in flight) while it is closed: `await gate.closed_on(n)`
    returns once n sessions wait at it; `gate.open()` lets them go."""

    def __init__(self):
        self._open = asyncio.Event()
        self._open.set()
        self.waiting = 0

    async def passage(self) -> None:
        if not self._open.is_set():
            self.waiting += 1
            try:
                await self._open.wait()
            finally:
                self.waiting -= 1

    async def closed_on(self, n: int, timeout: float = 30.0) -> None:
        self._open.clear()
        await until(lambda: self.waiting >= n, f"{n} sessions at the gate", timeout=timeout)

    def open(self) -> None:
        self._open.set()


async def sim_session(addresses: list[str], record: Record, channels: dict, stop: Path, hz: float, seed: int,
                      reply_timeout_s: float, balanced: bool, gate: Gate | None = None,
                      credentials: Credentials | None = None) -> None:
    rng = np.random.default_rng(seed)
    async with Session(addresses, hello(record.id, "fleet:sim"), reconnect_s=30.0, reply_timeout_s=reply_timeout_s,
                       connect_timeout_s=20.0, channels=channels, balanced=balanced, credentials=credentials) as s:
        record.first_gateway = s.welcome.gateway_id
        step, moves = 0, 0
        while not stop.exists():
            if gate is not None:
                await gate.passage()
            msg = await s.step(observation(step, rng))
            if len(s.failovers) != moves:
                moves = record.moves = len(s.failovers)
                record.after_move = 0
            answered(record, step, msg)
            step += 1
            await asyncio.sleep(1 / hz)
        record.failovers = [dataclasses.asdict(f) for f in s.failovers]
    record.durable_through = s.durable_through


def edge_session(addresses: list[str], record: Record, stop: Path, hz: float, seed: int) -> None:
    """One session the way the edge node holds it: its GatewayLink (SessionThread beneath), events in order,
    the flight dropped on LinkDown, the next step after LinkUp."""
    from bridge.ros2.link import GatewayLink, LinkDown, LinkReply, LinkUp

    rng = np.random.default_rng(seed)
    events: queue.SimpleQueue = queue.SimpleQueue()
    link = GatewayLink(addresses, hello(record.id, "fleet:edge"), events, connect_timeout_s=20.0,
                       reply_timeout_s=1.0)
    link.start()
    step, generation, flight = 0, None, None
    try:
        while not stop.exists():
            if generation is not None and flight is None:
                flight = step
                if not link.send(bridge_pb2.ClientMessage(observation=observation(step, rng)), generation=generation):
                    flight = None
            try:
                event = events.get(timeout=0.5)
            except queue.Empty:
                continue
            if isinstance(event, LinkUp):
                generation = event.generation
                if record.first_gateway == "":
                    record.first_gateway = event.welcome.gateway_id
                if event.generation > 1:  # a failover (resumed) or a new session after one ended
                    record.moves += 1
                    record.after_move = 0
                    step = max(step, event.welcome.next_step)
            elif isinstance(event, LinkDown):
                generation = None
                if flight is not None:
                    record.resent.append(flight)
                    step, flight = flight + 1, None  # the session resends it; its late reply is no command
            elif isinstance(event, LinkReply) and event.generation == generation and flight is not None:
                answered(record, flight, event.message)
                step, flight = flight + 1, None
                time.sleep(1 / hz)
        session = link.session
        record.failovers = [dataclasses.asdict(f) for f in session.failovers] if session else []
    finally:
        link.close(grace_s=2.0)
    session = link.session
    record.durable_through = session.durable_through if session else 0
    record.late_replies = link.late_replies


def watch(records: list[Record], done: threading.Event) -> None:
    """Prints `ready {gateway: sessions}` once every session has READY answered steps, then `moved N resumed M`
    whenever those change (moved: sessions that failed over; resumed: those with READY steps after it)."""
    said_ready, last = False, None
    while not done.is_set():
        if not said_ready and all(len(r.answered) >= READY for r in records):
            print("ready " + json.dumps(Counter(r.first_gateway for r in records)), flush=True)
            said_ready = True
        moved = [r for r in records if r.moves]
        now = (len(moved), sum(r.after_move >= READY for r in moved))
        if said_ready and now != last:
            print(f"moved {now[0]} resumed {now[1]}", flush=True)
            last = now
        time.sleep(0.02)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=("sim", "edge"))
    p.add_argument("--gateways", required=True)
    p.add_argument("--sessions", type=int, required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--stop", type=Path, required=True)
    p.add_argument("--hz", type=float, default=20.0)
    p.add_argument("--reply-timeout-s", type=float, default=1.0)
    p.add_argument("--balanced", action="store_true")
    p.add_argument("--tls-ca", type=Path, default=None, help="sim: TLS to the gateways (the token: $TETHER_TOKEN)")
    a = p.parse_args(argv)
    credentials = Credentials(ca=a.tls_ca, token=os.environ.get("TETHER_TOKEN")) if a.tls_ca else None
    addresses = a.gateways.split(",")
    records = [Record(f"{a.prefix}-{i}") for i in range(a.sessions)]
    done = threading.Event()
    watcher = threading.Thread(target=watch, args=(records, done), daemon=True)
    watcher.start()
    try:
        if a.kind == "sim":
            async def run():
                channels: dict = {}
                try:
                    await asyncio.gather(*(sim_session(addresses, r, channels, a.stop, a.hz, i, a.reply_timeout_s,
                                                       a.balanced, credentials=credentials)
                                           for i, r in enumerate(records)))
                finally:
                    for channel in channels.values():
                        await channel.close()
            asyncio.run(run())
        else:
            threads = [threading.Thread(target=edge_session, args=(addresses, r, a.stop, a.hz, i))
                       for i, r in enumerate(records)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        done.set()
        a.out.write_text(json.dumps([r.as_dict() for r in records]))
    print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
