"""The clients of `tether.v1`, one per service, on channels with credentials built once.

    from bridge.client import Credentials, FleetClient, PoliciesClient, Session
    creds = Credentials.from_args(args)               # or Credentials.from_env()
    async with Session(["127.0.0.1:50051", "127.0.0.1:50052"], hello, credentials=creds, reconnect_s=30) as s:
        reply = await s.step(observation)
    with PoliciesClient("127.0.0.1:50051", creds) as policies:
        served = policies.fetch("pendulum")

Modules: `channel` (`Credentials`: TLS, mTLS, token, the loopback rule; `ServiceClient`, the base of the
unary clients), `session` (Bridge: the async session), `thread` (`SessionThread`, for the edge), `policies`
(Policies: versions and rollout), `weights` (safetensors as Policies carries it), `fleet` (Fleet: status,
e-stops), `experience` (Experience: the transition stream), `stats` (`ClientStats`).
"""

from bridge.client.channel import Credentials, ServiceClient, aio_channel, is_loopback_address, sync_channel
from bridge.client.experience import ExperienceClient
from bridge.client.fleet import FleetClient
from bridge.client.policies import PoliciesClient, ServedPolicy
from bridge.client.session import Broken, Failover, Session, SessionError
from bridge.client.stats import ClientStats
from bridge.client.thread import SessionThread
from bridge.client.weights import WeightsError

__all__ = ["Broken", "ClientStats", "Credentials", "ExperienceClient", "Failover", "FleetClient", "PoliciesClient",
           "ServedPolicy", "ServiceClient", "Session", "SessionError", "SessionThread", "WeightsError", "aio_channel",
           "is_loopback_address", "sync_channel"]
