"""The outsider: a host on the fleet's network holding no credential (it may hold the public CA, or another
role's token). Each engine runs on its own lab host with the lab's credentials (`tether cluster certs`), and
every refusal is asserted by what the engine answers, never by a timeout."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest

from tests.hosts.fleet import Placed
from tests.support.hosts import Lab, namespaces_possible

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(namespaces_possible()), reason=namespaces_possible() or "-")]


def test_the_outsider_can_neither_infer_nor_load_nor_open_a_session_nor_reach_the_rendezvous(tmp_path):
    with Lab() as lab, Placed(lab, tmp_path) as fleet:
        triton = fleet.triton(lab.host("triton"))
        registry = fleet.role("postgres", lab.host("db"))
        nats = fleet.role("nats", lab.host("nats"))
        gateway = fleet.gateway(lab.host("gw0"), triton, "--registry", registry)
        trainer_net = lab.host("rdzv", networks=("trainers",))
        rendezvous = fleet.rendezvous(trainer_net)
        outsider = lab.host("outsider")
        got = fleet.outsider(outsider, triton=triton, gateway=gateway, ca=str(fleet.creds.ca),
                             token=fleet.creds.token("trainer"), rendezvous=rendezvous,
                             postgres=urlsplit(registry).netloc.split("@")[1], nats=nats)
        # the gateway's own robot credential works from a robot's host (the engines do serve)
        robot = lab.host("robot")
        allowed = fleet.outsider(robot, gateway=gateway, ca=str(fleet.creds.ca), token=fleet.creds.token("sim"))
    print("outsider:", json.dumps(got, indent=1))
    expected = "This protocol is restricted, expecting header 'triton-grpc-protocol-tether-triton-key'"
    for probe in ("triton_infer", "triton_load", "triton_index"):
        assert expected in got[probe], (probe, got[probe])
    # plaintext gRPC to the TLS port: the gateway answers with a TLS alert record (content type 0x15), or hangs up
    assert got["gateway_plaintext"].startswith(("ALLOWED: reply 15", "ALLOWED: closed")), got["gateway_plaintext"]
    assert "the robot role needs credentials" in got["gateway_no_token"], got["gateway_no_token"]
    assert "trainer:trainer may not act as robot" in got["gateway_other_role"], got["gateway_other_role"]
    assert "[Errno 101]" in got["rendezvous"] or "unreachable" in got["rendezvous"].lower(), got["rendezvous"]
    # PostgreSQL: a guessed password over TLS, and plaintext at all, each refused by the server
    assert 'password authentication failed for user "tether"' in got["postgres_tls"], got["postgres_tls"]
    assert "no pg_hba.conf entry" in got["postgres_plaintext"] and "no encryption" in got["postgres_plaintext"], \
        got["postgres_plaintext"]
    # NATS over TLS (the outsider holds the CA) with no user: the server's own refusal, for a publish and a read
    for probe in ("nats_publish", "nats_subscribe"):
        assert "Authorization Violation" in got[probe], (probe, got[probe])
    assert allowed["gateway_other_role"] == "ALLOWED: step answered by gw0: action", allowed
