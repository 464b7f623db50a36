"""The one client of `tether.v1`: channels with credentials, a session over a list of gateways (Hello,
step, durability, Replay, failover), a thread wrapper for blocking callers, and the run's stats.

    from bridge.client import Credentials, Session
    async with Session(["127.0.0.1:50051", "127.0.0.1:50052"], hello, reconnect_s=30) as s:
        reply = await s.step(observation)

Modules: `channel` (TLS, mTLS, token, the loopback rule), `session` (the async session), `thread`
(`SessionThread`, for the edge), `stats` (`ClientStats`).
"""

from bridge.client.channel import Credentials, aio_channel, is_loopback_address, sync_channel
from bridge.client.session import Broken, Failover, Session, SessionError
from bridge.client.stats import ClientStats
from bridge.client.thread import SessionThread

__all__ = ["Broken", "ClientStats", "Credentials", "Failover", "Session", "SessionError", "SessionThread",
           "aio_channel", "is_loopback_address", "sync_channel"]
