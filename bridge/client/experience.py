"""The client of `tether.v1.Experience`: the gateway's transitions as a stream (a log replay, then live).

    with ExperienceClient("127.0.0.1:50051", Credentials.from_env()) as client:
        for batch in client.subscribe(requests):     # requests: a SubscribeRequest(start=...), then acks
            ...
    async with ExperienceClient(address, aio=True) as client:
        call = client.subscribe()                    # grpc.aio: await call.write(request), await call.read()

`trainer.sources.StreamSource` runs one for a rank: sharding, acknowledgements, reconnects where it left
off. The stream has no deadline unless `timeout_s` gives one.
"""

from __future__ import annotations

from collections.abc import Iterator

from bridge.client.channel import Credentials, ServiceClient
from protos import experience_pb2, experience_pb2_grpc

__all__ = ["ExperienceClient"]


class ExperienceClient(ServiceClient):
    STUB = experience_pb2_grpc.ExperienceStub
    OPTIONS = (("grpc.max_receive_message_length", 64 << 20),)

    def __init__(self, address: str, credentials: Credentials | None = None, *, timeout_s: float | None = None,
                 **kw):
        super().__init__(address, credentials, timeout_s=timeout_s, **kw)

    def subscribe(self, requests: Iterator[experience_pb2.SubscribeRequest] | None = None):
        """The Subscribe call: blocking, fed by `requests` and iterated for ExperienceBatch; with `aio`, written to
        and read from (`requests` None)."""
        return self._call("Subscribe", requests) if requests is not None else \
            self.stub.Subscribe(timeout=self.timeout_s, metadata=self.metadata or None)
