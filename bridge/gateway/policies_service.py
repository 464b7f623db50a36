"""The `tether.v1.Policies` servicer: thin. Publish reads the chunked weights and hands them to
`Publisher`; List and Fetch read what the catalog and the repository hold. Typed errors become
gRPC statuses here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from bridge.gateway.errors import GatewayError
from bridge.gateway.publisher import PublishError, read_metadata
from protos import policies_pb2, policies_pb2_grpc

MAX_WEIGHTS_BYTES = 4 << 30
DEFAULT_CHUNK = 1 << 20


class PoliciesService(policies_pb2_grpc.PoliciesServicer):
    def __init__(self, gateway):
        self._gateway = gateway

    async def Publish(self, request_iterator: AsyncIterator[policies_pb2.PublishChunk],
                      context: grpc.aio.ServicerContext) -> policies_pb2.PublishReply:
        try:
            await self._gateway.auth.require(context, "trainer")  # bridge.security: a trainer or operator
            first = await anext(request_iterator, None)
            if first is None or first.WhichOneof("kind") != "header":
                raise PublishError("the first PublishChunk must be a header")
            header = first.header
            if header.size > MAX_WEIGHTS_BYTES:
                raise PublishError(f"size {header.size} exceeds the {MAX_WEIGHTS_BYTES >> 30} GiB limit")
            data = bytearray()
            async for chunk in request_iterator:
                if chunk.WhichOneof("kind") != "data":
                    raise PublishError("after the header, a Publish stream carries only data chunks")
                data += chunk.data
                if len(data) > header.size:
                    raise PublishError(f"more than the {header.size} bytes the header announced")
            return await self._gateway.publisher.publish(header, bytes(data))
        except GatewayError as exc:
            await context.abort(exc.status, str(exc))

    async def List(self, request: policies_pb2.ListRequest,
                   context: grpc.aio.ServicerContext) -> policies_pb2.PolicyList:
        try:
            policy = await self._gateway.catalog.resolve(request.policy)
            ready = await self._gateway.control.ready_versions(policy.name)
        except GatewayError as exc:
            await context.abort(exc.status, str(exc))
        acting = self._gateway.acting_versions(policy.name)
        reply = policies_pb2.PolicyList(policy=policy.name, newest=policy.version,
                                        inputs=[s.to_proto() for s in policy.inputs],
                                        outputs=[s.to_proto() for s in policy.outputs])
        repo = self._gateway.repository
        for version in ready:
            meta = read_metadata(repo, policy.name, version) if repo is not None else None
            entry = reply.versions.add(version=version, sessions=acting.get(version, 0))
            if meta is not None:
                entry.sha256, entry.published_unix_ns = meta.sha256, meta.published_unix_ns
                entry.lineage.CopyFrom(meta.lineage)
        return reply

    async def Fetch(self, request: policies_pb2.FetchRequest,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[policies_pb2.PublishChunk]:
        try:
            policy = await self._gateway.catalog.resolve(request.policy)
            header, data = self._gateway.publisher.fetch(policy.name, request.version or policy.version)
        except GatewayError as exc:
            await context.abort(exc.status, str(exc))
        yield policies_pb2.PublishChunk(header=header)
        size = request.chunk_bytes or DEFAULT_CHUNK
        for start in range(0, len(data), size):
            yield policies_pb2.PublishChunk(data=data[start:start + size])
