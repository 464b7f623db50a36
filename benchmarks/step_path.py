"""The gateway's Python work per batch-1 step, in process: no gRPC, no Triton (a batcher that answers at once),
the real `Session`, `FleetFigures` and `GatewayMetrics`, per-version stats as the rollout controller keeps them.

    python benchmarks/step_path.py                                  # this checkout
    python benchmarks/step_path.py --tree /tmp/before --figures-in-reply   # a checkout from before the split

`reply` is the time from an observation to its reply ready to send (what a robot waits for); `total` adds the
bookkeeping done after the reply (`figures.observed`, `session.flush()`). Best of the blocks (the machine is
shared: the minimum is the least disturbed). `--figures-in-reply` updates figures before the reply, as the
servicer did before the bookkeeping moved after it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1], help="the checkout to import")
    p.add_argument("--figures-in-reply", action="store_true", help="figures before the reply (the old servicer)")
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--per-block", type=int, default=5000)
    a = p.parse_args(argv)
    sys.path.insert(0, str(a.tree))
    import numpy as np

    from bridge.gateway.rollout.stats import VersionStats
    from bridge.gateway.session.figures import FleetFigures
    from bridge.gateway.session.session import Session
    from bridge.gateway.versions.catalog import ServedPolicy
    from bridge.metrics import GatewayMetrics
    from protos import bridge_pb2
    from protos.codec import Spec, encode

    obs_spec = (Spec("observation", np.float32, (11,)),)
    act_spec = (Spec("action", np.float32, (3,), low=(-1.0,), high=(1.0,)),)

    class Immediate:
        async def infer(self, name, version, inputs, outputs):
            return {"action": np.zeros((3,), np.float32)}

    class Router:  # the rollout controller's per-version stats (its canary monitor left out)
        stats = VersionStats()

        def acting(self, *args):
            return None

        def stepped(self, policy, *, latency_s, error, guard, **_):
            self.stats.step(policy.name, policy.version, latency_s=latency_s, error=error, guard=guard)

        def episode_ended(self, policy, episode_return):
            pass

    async def run() -> tuple[float, float]:
        s = Session(session_id="s", source="bench", policy=ServedPolicy("p", 1, obs_spec, act_spec),
                    observation_spec=obs_spec, action_spec=act_spec, batcher=Immediate(), deadline_s=0.1,
                    router=Router())
        figures = FleetFigures(GatewayMetrics())
        figures.opened(s, bridge_pb2.Hello(session_id="s"))
        tensors = [encode("observation", np.random.default_rng(1).standard_normal(11).astype(np.float32))]
        best_reply = best_total = float("inf")
        step = 0
        for block in range(a.blocks):
            msgs = [bridge_pb2.Observation(step=step + i, t_sent_ns=time.time_ns(), step_type=bridge_pb2.MID,
                                           tensors=tensors) for i in range(a.per_block)]
            step += a.per_block
            reply_ns, t0 = 0, time.perf_counter_ns()
            for obs in msgs:
                c0 = time.perf_counter_ns()
                reply = await s.handle(obs)
                reply.durable_through = s.recorder.durable_through
                if a.figures_in_reply:
                    figures.observed(s, obs, reply)
                reply_ns += time.perf_counter_ns() - c0
                if not a.figures_in_reply:
                    figures.observed(s, obs, reply)
                s.flush()
            if block:  # the first warms up
                best_reply = min(best_reply, reply_ns / a.per_block / 1e3)
                best_total = min(best_total, (time.perf_counter_ns() - t0) / a.per_block / 1e3)
        return best_reply, best_total

    reply_us, total_us = asyncio.run(run())
    print(f"{a.tree}: reply path {reply_us:.1f} us/step, total {total_us:.1f} us/step (best of {a.blocks - 1} blocks)")
    return {"tree": str(a.tree), "reply_us": reply_us, "total_us": total_us}


if __name__ == "__main__":
    main()
