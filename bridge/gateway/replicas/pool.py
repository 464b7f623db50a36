"""Several Triton replicas serving the same policy versions: each version stored once (content-addressed) and
copied into every replica's model repository, loaded on every replica, verified on each (READY at that version
and the probe batch reproduced within the gate's tolerance, recorded in the registry) before any batch of it goes
there; batches routed by explicit version to the least busy replica verified for it, retried on another when one
fails; a replica that comes back (its health answers again) is brought to the fleet's versions and verified
before it takes traffic.

    replicas = TritonReplicas(["127.0.0.1:8001", "127.0.0.1:9001"], primary=ModelRepository("a"),
                              repositories=[ModelRepository("a"), ModelRepository("b")],
                              store=ArtifactStore("a/.tether/artifacts"), deadline_s=0.1)
    replicas.attach(registry)                  # verification rows + audit events go to the registry's store
    await replicas.start(10.0, models=["hopper"])   # every reachable replica synced, loaded, verified
    batcher = MicroBatcher(replicas.hot, ...)  # the hot path: routed by version, least in-flight first
    await replicas.load_model("hopper")        # the control role (PolicyClient's methods): sync + load everywhere
    await replicas.verify("hopper", 4, Reference.of(header, tolerances))   # per replica; raises when one is wrong
    replicas.require_verified("hopper", 4)     # before a version may become shadow, canary or live
    await replicas.close()

Size: ~510 lines, one class: the hot path and the control role share each replica's verified-versions state,
which must change under one lock with the routing that reads it (the sync step is replicas/sync.py).

Repositories: replica i reads `repositories[i]`; the primary repository is where the gateway writes a new
version (the publisher), and a version folder reaches every other repository from the artifact store (hard
links on one filesystem, copies across). One repository shared by every replica (replicas on one machine): no
copy, only a load on each. Rows: `bridge.registry.replicas` (replica_verifications); a replica's row "lost: ..."
is written for each version it was verified for when it goes away, so "its newest row is ok" is the rule that
routing follows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from bridge.gate.checks import DEFAULT_TOLERANCES, compare_outputs
from bridge.gateway.replicas.sync import VersionCopies
from bridge.gateway.versions.catalog import ServedPolicy
from bridge.gateway.versions.verify import SwapFailed, _local_outputs, _probe
from bridge.registry.replicas import ReplicaVerifications, Verification
from inference_server import InferenceError, ModelRepository, PolicyClient
from inference_server.artifacts import ArtifactStore
from protos.codec import Spec, decode_all

log = logging.getLogger("tether.gateway")

UP, DOWN, JOINING = "up", "down", "joining"
LOST_CODES = frozenset({"UNAVAILABLE", None})  # the replica is gone (refused, reset, closed): marked down
# a batch's inference stream also ends INTERNAL when its server is killed (per-request errors come back as
# INVALID_ARGUMENT on the stream, so INTERNAL is the stream's, not a bad input): marked down, the batch goes elsewhere.
# Not for loads: a version that fails to load is the publish's error, not the replica's.
ROUTE_LOST_CODES = LOST_CODES | {"INTERNAL"}


class ReplicaVerificationFailed(SwapFailed, status=grpc.StatusCode.FAILED_PRECONDITION):
    """A reachable replica does not serve a version as it must (not READY, or other outputs), or none could be
    verified at all (a SwapFailed: what Triton serves is not what was asked)."""


@dataclass(frozen=True)
class Reference:
    """What a replica must reproduce for one version: a probe batch, its expected outputs, the atol (0: the gate's
    per-dtype tolerances) and where the expectation came from."""

    inputs: Mapping[str, np.ndarray]
    expected: Mapping[str, np.ndarray]
    atol: float = 0.0
    source: str = "the trainer's probe batch"

    @classmethod
    def of(cls, header) -> Reference | None:
        """The trainer's probe batch of a PublishHeader; None when it has none."""
        try:
            inputs, expected = decode_all(header.probe_inputs), decode_all(header.probe_outputs)
        except Exception:
            return None
        return cls(inputs, expected, float(header.atol)) if inputs and expected else None


@dataclass(eq=False)
class Replica:
    url: str
    repository: ModelRepository
    hot: PolicyClient
    control: PolicyClient
    state: str = DOWN
    inflight: int = 0
    batches: int = 0
    verified: set[tuple[str, int]] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # its repository and loads: one change at a time
    recording: asyncio.Task | None = None   # the "lost" rows being written


class _HotPath:
    """The batcher's backend: `infer` routed with the short (deadline) clients."""

    def __init__(self, fleet: TritonReplicas):
        self._fleet = fleet

    async def infer(self, model: str, version: int, inputs, outputs) -> dict[str, np.ndarray]:
        return await self._fleet.route(model, version, inputs, outputs, hot=True)

    async def wait_ready(self, timeout: float) -> None:
        await self._fleet.wait_ready(timeout)

    async def server_version(self) -> str:
        return await self._fleet.server_version()

    async def close(self) -> None:  # the fleet closes its clients
        return None


class TritonReplicas:
    """See the module docstring. The control role: `infer` (routed), `ready_versions` (READY on every replica
    that is up), `load_model`, `model_io`, `server_version`, `wait_ready`, `close` — PolicyClient's methods."""

    def __init__(self, urls: Sequence[str], *, primary: ModelRepository, repositories: Sequence[ModelRepository],
                 store: ArtifactStore, deadline_s: float, control_timeout_s: float = 60.0,
                 tolerances: Mapping[str, tuple[float, float]] = DEFAULT_TOLERANCES, health_period_s: float = 0.2,
                 secret: str | None = None):
        urls = list(urls)
        if len(set(urls)) != len(urls) or not all(urls):
            raise ValueError(f"Triton replica addresses {urls} must be distinct and non-empty")
        if len(repositories) not in (1, len(urls)):
            raise ValueError(f"{len(repositories)} model repositories for {len(urls)} Triton replicas: give one "
                             "shared by all, or one per replica in the order of --triton")
        repos = list(repositories) * len(urls) if len(repositories) == 1 else list(repositories)
        self.primary, self.url = primary, ",".join(urls)
        self.copies = VersionCopies(primary=primary, store=store)  # version folders to each replica's repository
        self._deadline_s, self._control_timeout_s = deadline_s, control_timeout_s
        self._secret = secret  # Triton's restricted-protocol secret, on every call (inference_server.secret)
        self.replicas = [Replica(url, repo, PolicyClient(url, timeout_s=deadline_s, secret=secret),
                                 PolicyClient(url, timeout_s=control_timeout_s, secret=secret))
                         for url, repo in zip(urls, repos, strict=True)]
        self.tolerances, self.health_period_s = tolerances, health_period_s
        self.hot = _HotPath(self)
        self.verifications: ReplicaVerifications | None = None
        self._registry = None
        self._models: set[str] = set()
        self._references: dict[tuple[str, int], Reference] = {}
        self._watchers: list[asyncio.Task] = []
        self.routed: deque[tuple[int, str, str, int]] = deque(maxlen=100_000)  # (t_ns, replica, model, version)
        self.retried = 0

    def attach(self, registry) -> None:
        """Record verifications beside `registry` (bridge.registry.replicas) and audit them in it."""
        self._registry = registry
        self.verifications = ReplicaVerifications.beside(registry)

    # -- start, stop, health ----------------------------------------------------------------------------------

    async def start(self, timeout: float, *, models: Sequence[str] = ()) -> None:
        """Wait (up to `timeout`) for at least one replica; bring every reachable one to the fleet's versions
        (`models`, and those any replica serves), verified; then watch their health."""
        if self.verifications is None:
            raise RuntimeError("TritonReplicas.start before attach(registry)")
        deadline = time.monotonic() + timeout
        while not any(await asyncio.gather(*(self._alive(r.url) for r in self.replicas))):
            if time.monotonic() > deadline:
                why = ""
                try:  # why the first one is not: unreachable, or refused (a restricted Triton, the wrong secret)
                    await self.replicas[0].control.server_version()
                except InferenceError as exc:
                    why = f" ({self.replicas[0].url}: {exc})"
                raise InferenceError(f"no Triton replica of {self.url} is ready after {timeout:g} s{why}", url=self.url,
                                     code="UNAVAILABLE")
            await asyncio.sleep(0.05)
        self._models.update(models)
        for r in self.replicas:
            try:
                loaded = await r.control.loaded_models()
            except InferenceError:
                continue  # not up: its watcher brings it in
            # only models the primary repository holds can be given to every replica
            self._models.update(m for m in loaded if (self.primary.root / m / "config.pbtxt").exists())
        for r in self.replicas:
            if await self._alive(r.url):
                await self._join(r)
        self._watchers = [asyncio.get_running_loop().create_task(self._watch(r), name=f"replica {r.url}")
                          for r in self.replicas]

    async def close(self) -> None:
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, *(r.recording for r in self.replicas if r.recording is not None),
                             return_exceptions=True)
        for r in self.replicas:
            await r.hot.close()
            await r.control.close()
        if self.verifications is not None:
            self.verifications.close()

    async def _alive(self, url: str) -> bool:
        """Liveness on a fresh channel (no reconnect backoff from a dead one). Not readiness: with Triton's strict
        readiness a server is not ready while any model it was asked to load is not (loading, failed)."""
        probe = PolicyClient(url, timeout_s=1.0, secret=self._secret)
        try:
            return await probe.live()
        finally:
            await probe.close()

    async def _watch(self, r: Replica) -> None:
        while True:
            await asyncio.sleep(self.health_period_s)
            try:
                if r.state == UP:  # liveness: readiness is false while a model loads (Triton's strict readiness)
                    if not await r.control.live():
                        await self._lose(r, "its liveness check fails")
                elif r.state == DOWN and await self._alive(r.url):
                    await self._join(r)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # logged, tried again at the next period
                log.error("replica %s: %s: %s", r.url, type(exc).__name__, exc)
                await self._lose(r, f"{type(exc).__name__}: {exc}")

    async def _join(self, r: Replica) -> None:
        """Reconciliation: fresh clients, the repository synced, every model loaded, every version on disk
        verified; only then up (routable for the versions it was verified for)."""
        async with r.lock:
            if r.recording is not None:  # its "lost" rows first: the rows stay in the order things happened
                await asyncio.gather(r.recording, return_exceptions=True)
            r.state = JOINING
            old = (r.hot, r.control)
            r.hot = PolicyClient(r.url, timeout_s=self._deadline_s, secret=self._secret)
            r.control = PolicyClient(r.url, timeout_s=self._control_timeout_s, secret=self._secret)
            for client in old:
                await client.close()
            try:
                for name in sorted(self._models):
                    await asyncio.to_thread(self.copies.sync, r.repository, name)
                    await r.control.load_model(name)
                    for version in self.primary.versions(name):
                        await self._verify_one(r, name, version)
            except InferenceError as exc:  # gone again: what it was verified for meanwhile is lost with it
                await self._lose(r, f"could not rejoin: {exc}")
                return
            r.state = UP
        log.info("replica %s joined: verified %s", r.url, sorted(r.verified))

    async def _lose(self, r: Replica, why: str) -> None:
        """Down at once (no batch goes there from now on); its "lost" rows are written in the background, so a
        batch that is being retried does not wait for the registry (a rejoin waits for them)."""
        if r.state == DOWN:
            return
        r.state, lost = DOWN, sorted(r.verified)
        r.verified = set()
        log.warning("replica %s lost (%s): its batches go to the other replicas until it is verified again",
                    r.url, why)

        async def record(before: asyncio.Task | None) -> None:
            if before is not None:
                await asyncio.gather(before, return_exceptions=True)
            for name, version in lost:
                await self._record(name, version, r.url, f"lost: {why}")

        r.recording = asyncio.get_running_loop().create_task(record(r.recording))

    # -- the hot path -------------------------------------------------------------------------------------------

    async def route(self, model: str, version: int, inputs, outputs, *, hot: bool) -> dict[str, np.ndarray]:
        """One batch at exactly `version` on the least busy replica verified for it; a replica that is gone
        (UNAVAILABLE) is marked down and the batch goes to another one."""
        tried: list[str] = []
        key = (model, version)
        while True:
            best = None
            for r in self.replicas:
                if r.state == UP and key in r.verified and r.url not in tried and (
                        best is None or (r.inflight, r.batches) < (best.inflight, best.batches)):
                    best = r
            if best is None:
                raise InferenceError(f"no Triton replica verified for {model!r} v{version} is up"
                                     + (f" (failed: {', '.join(tried)})" if tried else ""),
                                     url=self.url, model=model, version=version, code="UNAVAILABLE")
            best.inflight += 1
            best.batches += 1
            self.routed.append((time.time_ns(), best.url, model, version))
            try:
                return await (best.hot if hot else best.control).infer(model, version, inputs, outputs)
            except InferenceError as exc:
                if exc.code not in ROUTE_LOST_CODES:
                    raise
                tried.append(best.url)
                self.retried += 1
                await self._lose(best, f"{exc.code}: {exc}")
            finally:
                best.inflight -= 1

    async def infer(self, model: str, version: int, inputs, outputs) -> dict[str, np.ndarray]:
        """The control role's infer (the gate's probes): routed like a batch, with the long-timeout clients."""
        return await self.route(model, version, inputs, outputs, hot=False)

    # -- the control role -----------------------------------------------------------------------------------------

    async def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(r.state == UP for r in self.replicas):
            if time.monotonic() > deadline:
                raise InferenceError(f"no Triton replica of {self.url} is up", url=self.url, code="UNAVAILABLE")
            await asyncio.sleep(0.05)

    async def server_version(self) -> str:
        return await self._first_up("server metadata", lambda c: c.server_version())

    async def model_io(self, model: str, version: int) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
        return await self._first_up("model metadata", lambda c: c.model_io(model, version))

    async def _first_up(self, what: str, call):
        errors = []
        for r in self.replicas:
            if r.state == UP:
                try:
                    return await call(r.control)
                except InferenceError as exc:
                    if exc.code not in LOST_CODES:
                        raise
                    errors.append(str(exc))
                    await self._lose(r, str(exc))
        raise InferenceError(f"{what}: no Triton replica of {self.url} answers ({'; '.join(errors) or 'none up'})",
                             url=self.url, code="UNAVAILABLE")

    async def ready_versions(self, model: str) -> list[int]:
        """The versions READY on every replica that is up (a replica that is gone is marked down, not counted)."""
        self._models.add(model)
        found: list[set[int]] = []
        for r in self.replicas:
            if r.state != UP:
                continue
            try:
                found.append(set(await r.control.ready_versions(model)))
            except InferenceError as exc:
                if exc.code not in LOST_CODES:
                    raise
                await self._lose(r, str(exc))
        if not found:
            raise InferenceError(f"no Triton replica of {self.url} is up to list {model!r}", url=self.url,
                                 model=model, code="UNAVAILABLE")
        return sorted(set.intersection(*found))

    async def load_model(self, model: str, *, timeout_s: float = 60.0) -> None:
        """Every reachable replica's repository synced with the primary's folders of `model` (new versions from
        the artifact store, gone ones retired), then load_model on it; a version that left is no longer
        verified there. Replicas that are gone are skipped (they are synced when they come back)."""
        self._models.add(model)
        results = await asyncio.gather(*(self._load_on(r, model, timeout_s) for r in self.replicas),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        if not any(results):
            raise InferenceError(f"load model {model!r}: no Triton replica of {self.url} is reachable", url=self.url,
                                 model=model, code="UNAVAILABLE")

    async def _load_on(self, r: Replica, model: str, timeout_s: float) -> bool:
        async with r.lock:
            if r.state == DOWN:
                return False
            try:
                await asyncio.to_thread(self.copies.sync, r.repository, model)
                await r.control.load_model(model, timeout_s=timeout_s)
            except InferenceError as exc:
                if exc.code not in LOST_CODES:
                    raise
                await self._lose(r, str(exc))
                return False
            on_disk = set(self.primary.versions(model))
            r.verified = {(m, v) for m, v in r.verified if m != model or v in on_disk}
            return True

    # -- verification -------------------------------------------------------------------------------------------

    async def verify(self, model: str, version: int, reference: Reference | None = None) -> list[Verification]:
        """Check `version` on every reachable replica (rows recorded); ReplicaVerificationFailed naming the replica
        when one is reachable but wrong, or when none could be verified."""
        if reference is not None:
            self._references[(model, version)] = reference
        rows = []
        for r in self.replicas:
            async with r.lock:
                if r.state == DOWN:
                    continue
                row = await self._verify_one(r, model, version)
            if row is not None:
                rows.append(row)
        bad = [row for row in rows if not row.ok]
        if bad:
            raise ReplicaVerificationFailed(f"policy {model!r} v{version} on replica {bad[0].replica}: {bad[0].result}")
        if not rows:
            raise ReplicaVerificationFailed(f"policy {model!r} v{version}: no Triton replica of {self.url} was "
                                            "reachable to verify it")
        return rows

    def verified_on(self, model: str, version: int) -> list[str]:
        """The replicas that are up and verified for `version` (those its batches may go to)."""
        return [r.url for r in self.replicas if r.state == UP and (model, version) in r.verified]

    def require_verified(self, model: str, version: int) -> list[str]:
        """The replicas verified for `version`; ReplicaVerificationFailed when there is none."""
        urls = self.verified_on(model, version)
        if not urls:
            raise ReplicaVerificationFailed(f"policy {model!r} v{version} is verified on no Triton replica that is "
                                            f"up ({self.url}): it may not serve")
        return urls

    async def _verify_one(self, r: Replica, model: str, version: int) -> Verification | None:
        """READY on `r` and the reference reproduced; the row recorded. None when `r` turned out to be gone."""
        try:
            ready = await r.control.ready_versions(model)
            if version not in ready:
                result = f"failed: v{version} is not READY on {r.url} (ready: {ready})"
            else:
                reference = await self._reference(r, model, version)
                if reference is None:
                    result = "ok"  # nothing to compare with yet: READY, and the reference for the next replicas
                else:
                    got = await r.control.infer(model, version, reference.inputs, sorted(reference.expected))
                    check = compare_outputs(got, reference.expected, tolerances=self.tolerances, atol=reference.atol)
                    result = "ok" if check.passed else f"failed vs {reference.source}: {check.detail}"
        except InferenceError as exc:
            if exc.code in LOST_CODES:
                await self._lose(r, str(exc))
                return None
            result = f"failed: {exc}"
        row = await self._record(model, version, r.url, result)
        if row.ok:
            r.verified.add((model, version))
        else:
            r.verified.discard((model, version))
            log.error("replica %s: %s v%d %s", r.url, model, version, result)
        return row

    async def _reference(self, r: Replica, model: str, version: int) -> Reference | None:
        """The trainer's probe batch, else the version file's own TorchScript outputs, else the outputs of a
        replica already verified for it (None: `r` is the first)."""
        key = (model, version)
        if key in self._references:
            return self._references[key]
        inputs, outputs = await r.control.model_io(model, version)
        served = ServedPolicy(model, version, inputs, outputs)
        probe = _probe(inputs)
        path = self.primary.root / model / str(version) / "policy.pt"
        if path.exists() and self.primary.imported_format(model, version) is None:
            expected = await asyncio.to_thread(_local_outputs, str(path), served, probe)
            if expected:
                self._references[key] = Reference(probe, expected, 0.0, "the version file's own outputs")
                return self._references[key]
        for peer in self.replicas:
            if peer is not r and peer.state == UP and key in peer.verified:
                expected = await peer.control.infer(model, version, probe, [s.name for s in outputs])
                self._references[key] = Reference(probe, expected, 0.0, f"replica {peer.url}'s outputs")
                return self._references[key]
        return None

    async def _record(self, model: str, version: int, url: str, result: str) -> Verification:
        row = await asyncio.to_thread(self.verifications.record, model, version, url, result)
        if self._registry is not None:
            kind = "replica_verified" if row.ok else "replica_unverified"
            try:
                await asyncio.to_thread(self._registry.record_event, kind=kind, policy=model, version=version,
                                        who="gateway", why=f"replica {url}: {result}"[:4000])
            except Exception as exc:  # the row is what routing relies on; the audit line is a courtesy
                log.warning("replica %s: auditing %s v%d: %s", url, model, version, exc)
        return row


class ReplicaMetrics(Collector):
    """/metrics of the replicas, read at scrape time: `gateway.figures.metrics.registry.register(ReplicaMetrics(r))`.
    tether_triton_replica_up{replica} (1 up; 0 down or rejoining), _inflight, _verified_versions, _batches_total,
    and tether_triton_replica_retries_total (batches retried on another replica)."""

    def __init__(self, replicas: TritonReplicas):
        self._replicas = replicas

    def describe(self):
        return []

    def collect(self):
        up = GaugeMetricFamily("tether_triton_replica_up", "1 while a Triton replica is up (verified versions take "
                               "batches there); 0 while it is down or rejoining", labels=["replica"])
        inflight = GaugeMetricFamily("tether_triton_replica_inflight", "Batches in flight on each replica",
                                     labels=["replica"])
        verified = GaugeMetricFamily("tether_triton_replica_verified_versions", "Policy versions each replica is "
                                     "verified for", labels=["replica"])
        batches = CounterMetricFamily("tether_triton_replica_batches", "Batches routed to each replica",
                                      labels=["replica"])
        for r in self._replicas.replicas:
            up.add_metric([r.url], 1 if r.state == UP else 0)
            inflight.add_metric([r.url], r.inflight)
            verified.add_metric([r.url], len(r.verified))
            batches.add_metric([r.url], r.batches)
        yield from (up, inflight, verified, batches)
        yield CounterMetricFamily("tether_triton_replica_retries", "Batches retried on another replica after theirs "
                                  "was gone", value=self._replicas.retried)


def from_config(config, *, secret: str | None = None) -> TritonReplicas:
    """The replicas of a GatewayConfig with several `triton_urls` (bridge.gateway.config); `secret`: Triton's."""
    primary = ModelRepository(config.model_repository)
    repositories = [ModelRepository(p) for p in config.model_repositories] or [primary]
    store = ArtifactStore(config.artifact_store or primary.root / ".tether" / "artifacts")
    return TritonReplicas(config.triton_urls, primary=primary, repositories=repositories, store=store,
                          deadline_s=config.deadline_ms / 1e3, tolerances=config.gate.tolerances, secret=secret)
