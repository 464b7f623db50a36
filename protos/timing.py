"""The hops of one control step, read off its `tether.v1.Timing` (the latency budget the console, the metrics and
the Foxglove view show).

    >>> from protos import bridge_pb2
    >>> t = bridge_pb2.Timing(t_sent_ns=100, gateway_recv_ns=1_100, infer_start_ns=1_300, batch_start_ns=1_500,
    ...                       triton_start_ns=1_600, triton_end_ns=3_600, gateway_send_ns=3_700)
    >>> dict(zip(HOPS, gateway_hops(t)))["triton"], dict(zip(HOPS, gateway_hops(t)))["gateway"]
    (2000, 2600)

`reply` and `execution` are the client's (bridge.client.clock measures them), None here.
"""

from __future__ import annotations

__all__ = ["HOPS", "gateway_hops"]

HOPS = ("observation_age", "checks", "queue", "batch", "triton", "respond", "reply", "execution", "gateway")


def gateway_hops(t) -> tuple[int | None, ...]:
    """A Timing's hops in HOPS order, in ns: None for the client's two, observation_age without t_sent (it is
    measured on the gateway's clock: the robot's offset taken off), queue/batch/triton for a reply no batch
    answered, and all but observation_age for a Timing the gateway did not stamp (a step from elsewhere)."""
    recv, start, out = t.gateway_recv_ns, t.infer_start_ns, t.gateway_send_ns
    age = recv - t.clock_offset_ns - t.t_sent_ns if t.t_sent_ns else None
    if not (recv and out):
        return (age, *(None,) * 8)
    if t.triton_end_ns:
        batch, called, returned = t.batch_start_ns, t.triton_start_ns, t.triton_end_ns
        return (age, start - recv, batch - start, called - batch, returned - called, out - returned, None, None,
                out - recv)
    return (age, start - recv, None, None, None, out - start, None, None, out - recv)
