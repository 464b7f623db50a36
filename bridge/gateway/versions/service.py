"""The `tether.v1.Policies` servicer: thin. Publish reads the chunked weights and hands them to the
rollout controller; List and Fetch read what the catalog, registry and repository hold; the
rollout RPCs (RolloutStatus, Promote, Rollback, Pin, SetCanary) call the controller as the caller
the authorizer names (viewer to read, operator to change). Typed errors become gRPC statuses here.

Publish is admitted against the publisher's caps (publishes in flight, bytes held: RESOURCE_EXHAUSTED
past them), streams its chunks to disk (never held whole in memory) and is audited under the caller's
authenticated identity. Nothing here blocks the event loop:
Fetch's model load and the registry reads behind the replies run in threads, and the audit events a
reply carries are the newest N (one indexed read), never the whole log.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from bridge.gateway.errors import GatewayError
from bridge.gateway.versions.publisher import PublishError, read_metadata
from bridge.registry import Event, RegistryError, State, VersionRecord
from protos import policies_pb2, policies_pb2_grpc

MAX_WEIGHTS_BYTES = 4 << 30
DEFAULT_CHUNK = 1 << 20
DEFAULT_EVENTS = 20
MAX_EVENTS = 1000


class PoliciesService(policies_pb2_grpc.PoliciesServicer):
    def __init__(self, gateway):
        self._gateway = gateway

    async def Publish(self, request_iterator: AsyncIterator[policies_pb2.PublishChunk],
                      context: grpc.aio.ServicerContext) -> policies_pb2.PublishReply:
        try:
            who = await self._gateway.auth.require(context, "trainer")  # bridge.security: a trainer or operator
            first = await anext(request_iterator, None)
            if first is None or first.WhichOneof("kind") != "header":
                raise PublishError("the first PublishChunk must be a header")
            header = first.header
            if header.size > MAX_WEIGHTS_BYTES:
                raise PublishError(f"size {header.size} exceeds the {MAX_WEIGHTS_BYTES >> 30} GiB limit")
            publisher = self._gateway.publisher
            publisher.repository()  # PublishError before any byte is taken when this gateway cannot publish
            async with publisher.admission.hold(header.size):  # PublishRefused past the caps
                # streamed to a file, hashed on the way (bridge.gateway.versions.uploads): never held whole in memory;
                # the file is gone when the publish ends, however it ends
                async with publisher.uploads().receive(header, request_iterator) as upload:
                    return await self._gateway.rollout.publish(header, upload, who=who)  # the audit names `who`
        except GatewayError as exc:
            await context.abort(exc.status, str(exc))

    async def List(self, request: policies_pb2.ListRequest,
                   context: grpc.aio.ServicerContext) -> policies_pb2.PolicyList:
        try:
            await self._gateway.auth.require(context, "viewer")
            policy = await self._gateway.catalog.resolve(request.policy)
            ready = await self._gateway.control.ready_versions(policy.name)
        except GatewayError as exc:
            await context.abort(exc.status, str(exc))
        acting = self._gateway.acting_versions(policy.name)
        live = self._gateway.rollout.rollouts().get(policy.name)
        newest = live.live if live is not None and live.live is not None else policy.version
        reply = policies_pb2.PolicyList(policy=policy.name, newest=newest,
                                        inputs=[s.to_proto() for s in policy.inputs],
                                        outputs=[s.to_proto() for s in policy.outputs])
        records, metas = await asyncio.to_thread(self._listing, policy.name, ready)
        for version in ready:
            meta = metas.get(version)
            entry = reply.versions.add(version=version, sessions=acting.get(version, 0))
            if meta is not None:
                entry.sha256, entry.published_unix_ns = meta.sha256, meta.published_unix_ns
                entry.lineage.CopyFrom(meta.lineage)
            if version in records:
                entry.state = str(records[version].state)
        return reply

    async def Fetch(self, request: policies_pb2.FetchRequest,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[policies_pb2.PublishChunk]:
        try:
            await self._gateway.auth.require(context, "trainer")  # the weights themselves
            policy = await self._gateway.catalog.resolve(request.policy)
            header, data = await asyncio.to_thread(self._gateway.publisher.fetch, policy.name,
                                                   request.version or policy.version)  # a model load: off the loop
        except GatewayError as exc:
            await context.abort(exc.status, str(exc))
        yield policies_pb2.PublishChunk(header=header)
        size = request.chunk_bytes or DEFAULT_CHUNK
        for start in range(0, len(data), size):
            yield policies_pb2.PublishChunk(data=data[start:start + size])

    # -- rollout -------------------------------------------------------------------------------------------------

    async def RolloutStatus(self, request: policies_pb2.RolloutStatusRequest,
                            context: grpc.aio.ServicerContext) -> policies_pb2.RolloutStatusReply:
        try:
            await self._gateway.auth.require(context, "viewer")
            if request.events > MAX_EVENTS:
                raise RegistryError(f"events {request.events} is more than {MAX_EVENTS}")
            return await self._status(request.policy, request.events or DEFAULT_EVENTS)
        except GatewayError as exc:
            await context.abort(exc.status, str(exc))

    async def Promote(self, request: policies_pb2.PromoteRequest,
                      context: grpc.aio.ServicerContext) -> policies_pb2.RolloutStatusReply:
        fraction = request.canary_fraction if request.HasField("canary_fraction") else None
        return await self._change(request, context, lambda name, **by: self._gateway.rollout.promote(
            name, request.version, _state(request.to), fraction=fraction, labels=dict(request.canary_labels) or None,
            **by))

    async def Rollback(self, request: policies_pb2.RollbackRequest,
                       context: grpc.aio.ServicerContext) -> policies_pb2.RolloutStatusReply:
        return await self._change(request, context, lambda name, **by: self._gateway.rollout.rollback(
            name, request.version or None, **by))

    async def Pin(self, request: policies_pb2.PinRequest,
                  context: grpc.aio.ServicerContext) -> policies_pb2.RolloutStatusReply:
        return await self._change(request, context, lambda name, **by: self._gateway.rollout.pin(
            name, request.selector, request.version or None, **by))

    async def SetCanary(self, request: policies_pb2.CanaryRequest,
                        context: grpc.aio.ServicerContext) -> policies_pb2.RolloutStatusReply:
        labels = {} if request.clear_labels else (dict(request.labels) or None)
        fraction = request.fraction if request.HasField("fraction") else None
        return await self._change(request, context, lambda name, **by: self._gateway.rollout.set_canary(
            name, fraction=fraction, labels=labels, **by))

    async def _change(self, request, context: grpc.aio.ServicerContext, change) -> policies_pb2.RolloutStatusReply:
        """An operator's rollout change of `request.policy`: `await change(name, who=, why=)`, then its status."""
        try:
            who = await self._gateway.auth.require(context, "operator")
            name = await self._policy(request.policy)
            await change(name, who=who, why=request.why or "no reason given")
            return await self._status(name, DEFAULT_EVENTS)
        except GatewayError as exc:
            await context.abort(exc.status, str(exc))

    def _listing(self, name: str, ready: list[int]) -> tuple[dict[int, VersionRecord], dict]:
        """The registry's records and the versions' tether.json (a thread: both read files)."""
        repo = self._gateway.repository
        records = {r.version: r for r in self._gateway.registry.versions(name)}
        metas = {v: read_metadata(repo, name, v) for v in ready} if repo is not None else {}
        return records, metas

    async def _policy(self, name: str) -> str:
        policy = await self._gateway.catalog.resolve(name)
        await self._gateway.rollout.track(policy.name)
        return policy.name

    async def _status(self, name: str, events: int) -> policies_pb2.RolloutStatusReply:
        name = await self._policy(name)
        gw = self._gateway
        rollout = gw.rollout.rollouts()[name]
        acting = gw.acting_versions(name)
        stats = gw.rollout.version_stats(name)
        reply = policies_pb2.RolloutStatusReply(policy=name)
        r = reply.rollout
        r.live, r.previous_live = rollout.live or 0, rollout.previous_live or 0
        r.shadow, r.canary, r.canary_fraction = rollout.shadow or 0, rollout.canary or 0, rollout.canary_fraction
        r.canary_labels.update(rollout.canary_labels)
        r.pins.update(rollout.pins)
        r.mode = gw.rollout.plan.mode
        records, recent = await asyncio.to_thread(
            lambda: (gw.registry.versions(name), gw.registry.latest_events(name, limit=events)))  # reads: off the loop
        for record in records:
            version_proto(record, reply.versions.add(), sessions=acting.get(record.version, 0),
                          stats=stats.get(record.version))
        reply.events.extend(event_proto(e) for e in recent)
        fresh = gw.rollout.freshness()["policies"].get(name)
        if fresh is not None:
            reply.freshness.CopyFrom(policies_pb2.Freshness(
                newest=fresh["newest"], sessions=fresh["sessions"], max_version_lag=fresh["max_version_lag"],
                mean_version_lag=fresh["mean_version_lag"], max_time_lag_s=fresh["max_time_lag_s"]))
        return reply


def version_proto(record: VersionRecord, out: policies_pb2.PolicyVersion, *, sessions: int = 0,
                  stats: dict | None = None) -> policies_pb2.PolicyVersion:
    out.version, out.sha256, out.state, out.format = record.version, record.sha256, str(record.state), record.format
    out.published_unix_ns, out.updated_unix_ns, out.sessions = record.created_ns, record.updated_ns, sessions
    lineage = record.lineage or {}
    for key in ("parent_version", "trainer_step", "data_offset"):
        if key in lineage:
            setattr(out.lineage, key, int(lineage[key]))
    for key in ("reward_version", "trainer", "algo"):
        if key in lineage:
            setattr(out.lineage, key, str(lineage[key]))
    for check in record.gate:
        out.gate.add(name=check["name"], passed=check["passed"], detail=check.get("detail", ""),
                     figures={k: float(v) for k, v in check.get("figures", {}).items()})
    if stats:
        out.stats.CopyFrom(policies_pb2.VersionStats(**stats))
    return out


def event_proto(e: Event) -> policies_pb2.AuditEvent:
    return policies_pb2.AuditEvent(id=e.id, t_unix_ns=e.t_ns, policy=e.policy, version=e.version or 0, kind=e.kind,
                                   from_state=e.from_state, to_state=e.to_state, who=e.who, why=e.why,
                                   figures={k: float(v) for k, v in e.figures.items()}, detail=e.detail)


def _state(text: str) -> State:
    try:
        return State(text)
    except ValueError:
        raise RegistryError(f"state {text!r} is not one of {[str(s) for s in State]}") from None
