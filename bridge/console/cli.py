"""`tether status`, `tether estop`, `tether release`: the fleet through tether.v1.Fleet.

    tether status --gateway 127.0.0.1:50051                 # sessions and versions as tables
    tether estop --gateway 127.0.0.1:50051 --robot arm_1 --reason "person in the cell"
    tether estop --gateway 127.0.0.1:50051 --all
    tether release --gateway 127.0.0.1:50051 --robot arm_1 --reason "cell clear"

Credentials (`bridge.client.Credentials.from_args`): `--token NAME.SECRET` (or $TETHER_TOKEN), TLS with `--tls-ca`,
a client certificate with `--tls-cert/--tls-key`; `--operator NAME` (or $TETHER_OPERATOR) names you
where the gateway allows open access (with credentials the audit records who they prove, never this name).
E-stops are durable in the gateway's registry and survive its restart; each has an id (`tether status` shows it,
Action.estop_id carries it); only `tether release` of that target releases it.
Exit status: 0 done, 1 refused or failed (the reason on stderr), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc

from bridge.client import Credentials, FleetClient
from bridge.common.flags import gateway_flags, output_flags
from protos import fleet_pb2


def _parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"tether {command}", description=__doc__.splitlines()[0])
    gateway_flags(p, token_help="operator token NAME.SECRET")
    p.add_argument("--operator", default=os.environ.get("TETHER_OPERATOR", ""), help="your name (open access)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the gateway")
    if command != "status":
        who = p.add_mutually_exclusive_group(required=True)
        who.add_argument("--session", help="one session id")
        who.add_argument("--robot", help="the sessions whose Hello labels say robot=NAME")
        who.add_argument("--all", action="store_true", help="every session, and those that connect later")
        p.add_argument("--reason", default="", help="why (audit log)")
    else:
        output_flags(p, json=True)  # the FleetStatus message as JSON
    return p


def table(rows: list[list[str]], header: list[str]) -> str:
    """Left-aligned columns.

    >>> print(table([["a", "1"]], ["name", "n"]))
    name  n
    a     1
    """
    cells = [header, *rows]
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def render(status: fleet_pb2.FleetStatus) -> str:
    sessions = [[s.session_id, s.source, ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())),
                 f"{s.policy} v{s.policy_version}", str(s.num_envs), f"{s.steps_per_s:.1f}",
                 f"{s.latency_p50_ms:.2f}/{s.latency_p99_ms:.2f}", str(s.episodes), str(s.guard_interventions),
                 "ESTOP" if s.estopped else ("edge-estop" if s.edge_estopped else "-"), s.last_error[:40]]
                for s in status.sessions]
    versions = [[v.policy, f"v{v.version}", v.state, str(v.sessions)] for v in status.versions]
    out = [f"{len(status.sessions)} sessions (Triton {status.server_version})"
           + (f", console {status.console_url}" if status.console_url else ""),
           table(sessions, ["session", "source", "labels", "version", "envs", "steps/s", "p50/p99 ms", "episodes",
                            "guard", "estop", "last error"]),
           "", table(versions, ["policy", "version", "state", "sessions"])]
    for e in status.estops:
        target = "all" if e.all else f"session {e.session_id}" if e.session_id else f"robot {e.robot}"
        out.append(f"E-STOP latched: {target} by {e.who}" + (f" ({e.why})" if e.why else "")
                   + (f" [{e.id}]" if e.id else ""))
    return "\n".join(out)


def main(command: str, argv: list[str] | None = None) -> int:
    parser = _parser(command)
    a = parser.parse_args(argv)
    try:
        client = FleetClient(a.gateway, Credentials.from_args(a), operator=a.operator, timeout_s=a.timeout)
    except (ValueError, OSError) as exc:  # a token to a plaintext remote address, unreadable cert files
        parser.error(str(exc))
    with client:
        try:
            if command == "status":
                status = client.status()
                if a.json:
                    from google.protobuf.json_format import MessageToJson

                    print(MessageToJson(status, preserving_proto_field_name=True))
                else:
                    print(render(status))
                return 0
            call = client.estop if command == "estop" else client.release
            reply = call(session_id=a.session, robot=a.robot, all=a.all, reason=a.reason)
        except grpc.RpcError as exc:
            print(f"tether {command}: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    what = "latched" if command == "estop" else "released"
    print(f"{what}{'' if reply.changed else ' (no change)'} by {reply.who}; held now: "
          f"{', '.join(reply.sessions) or 'none'}")
    return 0


def status(argv: list[str]) -> None:
    raise SystemExit(main("status", argv))


def estop(argv: list[str]) -> None:
    raise SystemExit(main("estop", argv))


def release(argv: list[str]) -> None:
    raise SystemExit(main("release", argv))
