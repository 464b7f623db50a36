"""A stand-in for the gateway's `tether.v1.Experience` and `tether.v1.Policies`, for the trainer's tests.

It serves an in-memory log (appended by the test, or by actor threads stepping a real MuJoCo
env with the newest published weights) and a policy registry that checks published weights the
way the gateway does: strict `load_state_dict`, finite, probe outputs within atol. The lead's
end-to-end tests use the real gateway. `streaming` also puts its log into a NATS JetStream stream, as a
gateway with `--experience nats://...` would:

    with streaming(tmp_path) as (gw, url):           # a nats-server, the stand-in, 2 pendulum actors
        ...                                          # tether train --experience URL reads them there
        consumer, stream = stream_state(url, "tether-train-pendulum-r0")
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
import warnings
import zlib
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import torch

from bridge.client.weights import from_safetensors, to_safetensors
from bridge.experience.jetstream import STREAM, connect
from bridge.experience.jetstream_log import JetStreamLog
from protos import bridge_pb2, codec, experience_pb2, experience_pb2_grpc, policies_pb2, policies_pb2_grpc
from protos.codec import Spec
from tether.cluster.nats import NatsCluster
from trainer.policy import GaussianPolicy


def shard_of(session: str, num_shards: int) -> int:
    return zlib.crc32(session.encode()) % num_shards


class StandIn(experience_pb2_grpc.ExperienceServicer, policies_pb2_grpc.PoliciesServicer):
    def __init__(self, observation: Spec, action: Spec, *, policy: str = "pendulum", seed: int = 0):
        self.policy_name, self.observation, self.action = policy, observation, action
        self.log: list[experience_pb2.Transition] = []
        self.cond = threading.Condition()
        self.versions: dict[int, tuple[bytes, policies_pb2.Lineage, int]] = {}
        self.modules: dict[int, GaussianPolicy] = {}
        self.publishes: list[policies_pb2.PublishHeader] = []
        self.subscriptions: list[experience_pb2.SubscribeStart] = []
        self.acks: list[int] = []  # every ack's through_offset, in the order they arrived
        self.max_error = 0.0
        self.publish_delay_s = 0.0  # a slow gateway: Publish takes this long before it answers
        self.fail_after_batches = 0  # > 0: the next stream is cut (UNAVAILABLE) after this many batches
        self.stop = threading.Event()
        self._add_version(GaussianPolicy(observation, action, seed=seed).eval(), policies_pb2.Lineage())
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        experience_pb2_grpc.add_ExperienceServicer_to_server(self, self.server)
        policies_pb2_grpc.add_PoliciesServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.threads: list[threading.Thread] = []

    # -- the log --------------------------------------------------------------------------
    def append(self, t: experience_pb2.Transition) -> None:
        with self.cond:
            t.offset = len(self.log)
            self.log.append(t)
            self.cond.notify_all()

    def Subscribe(self, request_iterator, context):
        first = next(request_iterator)
        if not first.HasField("start"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first request must be start")
        start = first.start
        self.subscriptions.append(start)
        if start.policy and start.policy != self.policy_name:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown policy {start.policy!r}")
        window, max_batch = start.window or 4096, start.max_batch or 256
        acked = [start.from_offset]

        def read_acks():
            try:
                for req in request_iterator:
                    if req.HasField("ack"):
                        with self.cond:
                            self.acks.append(req.ack.through_offset)
                            acked[0] = max(acked[0], req.ack.through_offset)
                            self.cond.notify_all()
            except grpc.RpcError:
                pass  # the call ended (cancelled, cut on purpose)

        threading.Thread(target=read_acks, daemon=True).start()
        cursor = start.from_offset
        while context.is_active() and not self.stop.is_set():
            with self.cond:
                self.cond.wait_for(lambda c=cursor: len(self.log) > c or self.stop.is_set(), timeout=0.2)
                end = len(self.log)
                scanned_from, batch = cursor, []
                while cursor < end and len(batch) < max_batch and cursor - acked[0] < window:
                    t = self.log[cursor]
                    cursor += 1
                    if start.num_shards > 1 and shard_of(t.session, start.num_shards) != start.shard:
                        continue
                    batch.append(t)
            if batch or cursor > scanned_from:  # an empty batch still says how far the shard is read
                yield experience_pb2.ExperienceBatch(transitions=batch, next_offset=cursor, log_end=end)
                if batch and self.fail_after_batches > 0:
                    self.fail_after_batches -= 1
                    if self.fail_after_batches == 0:
                        context.abort(grpc.StatusCode.UNAVAILABLE, "stand-in: stream cut on purpose")
            if cursor - acked[0] >= window:
                time.sleep(0.005)

    # -- policies -------------------------------------------------------------------------
    def _add_version(self, module: GaussianPolicy, lineage: policies_pb2.Lineage) -> int:
        version = len(self.versions) + 1
        self.versions[version] = (to_safetensors(module.state_dict()), lineage, time.time_ns())
        self.modules[version] = module
        return version

    def newest(self) -> int:
        return max(self.versions)

    def List(self, request, context):
        return policies_pb2.PolicyList(
            policy=self.policy_name, newest=self.newest(),
            versions=[policies_pb2.PolicyVersion(version=v, sha256=hashlib.sha256(blob).hexdigest(), lineage=lin,
                                                 published_unix_ns=ns)
                      for v, (blob, lin, ns) in self.versions.items()],
            inputs=[self.observation.to_proto()],
            outputs=[s.to_proto() for s in GaussianPolicy.output_specs(self.action)])

    def Fetch(self, request, context):
        version = request.version or self.newest()
        if version not in self.versions:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no version {version}")
        blob, lineage, _ = self.versions[version]
        yield policies_pb2.PublishChunk(header=policies_pb2.PublishHeader(
            policy=self.policy_name, format="safetensors", size=len(blob),
            sha256=hashlib.sha256(blob).hexdigest(), lineage=lineage))
        step = request.chunk_bytes or (1 << 20)
        for i in range(0, len(blob), step):
            yield policies_pb2.PublishChunk(data=blob[i:i + step])

    def Publish(self, request_iterator, context):
        header, data = None, bytearray()
        for chunk in request_iterator:
            if chunk.HasField("header"):
                header = chunk.header
            else:
                data += chunk.data
        if header is None or header.policy != self.policy_name or header.format != "safetensors":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad header {header}")
        if len(data) != header.size or hashlib.sha256(data).hexdigest() != header.sha256:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "size or sha256 mismatch")
        module = GaussianPolicy(self.observation, self.action)
        try:
            module.load_state_dict(from_safetensors(bytes(data)), strict=True)
        except RuntimeError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        module.eval()
        probe = codec.decode_all(header.probe_inputs)["observation"]
        expected = codec.decode_all(header.probe_outputs)["action_mean"]
        with torch.no_grad(), warnings.catch_warnings():  # torch deprecates torch.jit; Triton serves it
            warnings.simplefilter("ignore", DeprecationWarning)
            served = torch.jit.script(module)(torch.from_numpy(probe.copy()))[2].numpy()
        error = float(np.abs(served - expected).max())
        if error > (header.atol or 1e-5):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"probe mismatch {error}")
        self.max_error = max(self.max_error, error)
        self.stop.wait(self.publish_delay_s)
        self.publishes.append(header)
        version = self._add_version(module, header.lineage)
        return policies_pb2.PublishReply(policy=self.policy_name, version=version, sha256=header.sha256,
                                         ready_versions=[version], max_abs_error=error)

    # -- actors ---------------------------------------------------------------------------
    def start_actors(self, env_name: str, sessions: int, *, max_episode_steps: int | None = None,
                     rate_hz: float = 0.0) -> None:
        """`sessions` threads stepping `env_name` with the newest version (paced at `rate_hz` each if > 0);
        a session moves to a new version at its next episode boundary, as the gateway's do."""
        for i in range(sessions):
            th = threading.Thread(target=self._act, args=(env_name, f"sim-{i}", i, max_episode_steps, rate_hz),
                                  daemon=True)
            th.start()
            self.threads.append(th)

    def _act(self, env_name: str, session: str, seed: int, max_episode_steps: int | None, rate_hz: float) -> None:
        from sim.mujoco import make_env

        env = make_env(env_name, seed=seed, max_episode_steps=max_episode_steps)
        torch.manual_seed(seed)
        ts, episode, step = env.reset(), 0, 0
        version, next_tick = self.newest(), time.monotonic()
        while not self.stop.is_set():
            if rate_hz > 0:
                next_tick += 1.0 / rate_hz
                self.stop.wait(max(0.0, next_tick - time.monotonic()))
            if ts.first():
                version = self.newest()
            obs = ts.observation["observation"]
            with torch.no_grad():
                action, log_prob, _ = self.modules[version](torch.from_numpy(obs[None]))
            action = action[0].numpy()
            nts = env.step({"action": action})
            t = experience_pb2.Transition(
                session=session, episode=episode, step=step, step_type=int(ts.step_type),
                observation=[codec.encode("observation", obs)], action=[codec.encode("action", action)],
                applied_action=[codec.encode("action", nts.applied_action["action"])], reward=nts.reward,
                terminated=nts.terminated, truncated=nts.last() and not nts.terminated, policy=self.policy_name,
                policy_version=version, has_log_prob=True, log_prob=float(log_prob[0, 0]),
                timing=bridge_pb2.Timing(gateway_recv_ns=time.time_ns()))
            step += 1
            if nts.last():
                t.next_observation.extend([codec.encode("observation", nts.observation["observation"])])
                nts, episode, step = env.reset(), episode + 1, 0
            ts = nts
            self.append(t)
        env.close()

    def __enter__(self) -> StandIn:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        with self.cond:
            self.cond.notify_all()
        for th in self.threads:
            th.join(timeout=10)
        self.server.stop(grace=None)


def env_specs(env: str = "InvertedPendulum-v5") -> tuple[Spec, Spec]:
    """The observation and action specs of a MuJoCo env (what a stand-in serves a policy for)."""
    from sim.mujoco import make_env

    made = make_env(env)
    try:
        return made.observation_spec()[0], made.action_spec()[0]
    finally:
        made.close()


@contextlib.contextmanager
def streaming(tmp: Path, env: str = "InvertedPendulum-v5", sessions: int = 2):
    """A one-server NATS cluster and a stand-in (policy "pendulum") whose `sessions` actors' transitions go into
    its stream, steps numbered per session: yields (stand-in, the stream's URL)."""
    obs, act = env_specs(env)
    stop = threading.Event()
    with NatsCluster(tmp / "nats", servers=1) as cluster, StandIn(obs, act, policy="pendulum") as gw:

        async def forward() -> None:
            steps: dict[str, int] = {}
            async with JetStreamLog(cluster.url, name="test-forwarder") as log:
                done = 0
                while not stop.is_set():
                    with gw.cond:
                        new = gw.log[done:]
                    done += len(new)
                    for t in new:
                        copy = experience_pb2.Transition()
                        copy.CopyFrom(t)
                        copy.step = steps.get(t.session, 0)
                        steps[t.session] = copy.step + 1
                        log.append(copy)
                    await asyncio.sleep(0.02)

        thread = threading.Thread(target=asyncio.run, args=(forward(),), daemon=True)
        thread.start()
        gw.start_actors(env, sessions)
        try:
            yield gw, cluster.url
        finally:
            stop.set()
            thread.join(timeout=30)


def stream_state(url: str, durable: str):
    """(the durable consumer's info, the stream's info) on the stream at `url`."""

    async def query():
        nc = await connect([url], name="test")
        try:
            js = nc.jetstream()
            return await js.consumer_info(STREAM, durable), await js.stream_info(STREAM)
        finally:
            await nc.close()

    return asyncio.run(query())
