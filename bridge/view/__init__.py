"""`tether view`: the gateway's robots live in Foxglove, over the Foxglove WebSocket protocol.

    server = await ViewServer(port=0).start()               # bridge.view.server: viewers, queues, access, counts
    feed = GatewayFeed("127.0.0.1:50051", server=server)    # bridge.view.feed: Experience stream + Fleet status
    await feed.run()

A process of its own beside the gateway (like the trainer): it reads the gateway through tether.v1 only.
"""

from bridge.view.feed import GatewayFeed
from bridge.view.server import ExposedView, ViewServer, check_view_bind

__all__ = ["ExposedView", "GatewayFeed", "ViewServer", "check_view_bind"]
