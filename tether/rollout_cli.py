"""`tether rollout`: see and steer the versions of a policy through the gateway's tether.v1.Policies.

    tether rollout list     --policy hopper_v5                    # versions, states, gate, stats, audit log
    tether rollout promote  --policy hopper_v5 4 --to canary --fraction 0.1 --reason "looks good in shadow"
    tether rollout promote  --policy hopper_v5 4 --to live --reason "canary clean for a day"
    tether rollout rollback --policy hopper_v5 --reason "arm_2 jerks"     # the live one; the previous is back
    tether rollout pin      --policy hopper_v5 robot=arm_2 3 --reason "hold arm_2"   # `none` unpins
    tether rollout canary   --policy hopper_v5 --label robot=arm_2 --reason "arm_2 first"

Common flags: --gateway HOST:PORT (default 127.0.0.1:50051), --operator NAME (the name the audit log
records on a gateway with open access), --tls-ca/--tls-cert/--tls-key/--token (`Credentials.from_args`).
`--json` prints the reply as JSON instead of the table. Old spellings `--why` and `--labels K=V,K=V`
still work for one release, with a warning.
"""

from __future__ import annotations

import argparse
import getpass
import sys
import time

import grpc
from google.protobuf import json_format

from bridge.client import Credentials, PoliciesClient
from bridge.common.errors import CommandError
from bridge.common.flags import deprecated_alias, gateway_flags, output_flags, policy_flag
from bridge.common.kv import parse_pairs
from protos import policies_pb2

TARGETS = ("shadow", "canary", "live")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether rollout", description="See and steer policy versions.")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, *, reason: bool = True) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help, description=help)
        gateway_flags(c, token_help="operator token NAME.SECRET")
        policy_flag(c, help="policy name (default: the gateway's default policy)")
        c.add_argument("--operator", default=_user(), help="your name in the audit log (open-access gateways)")
        output_flags(c, json=True)
        c.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the gateway")
        if reason:
            c.add_argument("--reason", required=True, help="why (the audit log records it)")
            deprecated_alias(c, "--why", "--reason")
        return c

    def labels(c: argparse.ArgumentParser, help: str) -> None:
        c.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help=help + " (repeatable)")
        deprecated_alias(c, "--labels", "--label")

    c = command("list", "versions, states, gate checks, runtime figures, who acts with which, audit log", reason=False)
    c.add_argument("--events", type=int, default=10, help="recent audit events to show")
    c = command("promote", "move a version to shadow, canary or live")
    c.add_argument("version", type=int, help="the version to move")
    c.add_argument("--to", choices=TARGETS, required=True, help="the state it moves to")
    c.add_argument("--fraction", type=float, help="with --to canary: the canary fraction")
    labels(c, "with --to canary: canary the sessions with this label")
    c = command("rollback", "roll back a version (default: the live one; the previous live comes back)")
    c.add_argument("version", type=int, nargs="?", default=0, help="the version (default: the live one)")
    c = command("pin", "hold a session (session=ID) or a label (KEY=VALUE) on a version; 'none' unpins")
    c.add_argument("selector", help="session=ID or KEY=VALUE")
    c.add_argument("version", help="a version number, or none")
    c = command("canary", "which sessions get the canary: a fraction, or labels")
    c.add_argument("--fraction", type=float, help="the canary fraction of sessions")
    labels(c, "canary the sessions with this label")
    c.add_argument("--clear-labels", action="store_true", help="back to the fraction")
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        labels = parse_pairs(getattr(a, "label", []), what="--label")
        pinned = _version(a.version) if a.command == "pin" else None
        client = PoliciesClient(a.gateway, Credentials.from_args(a), operator=a.operator, timeout_s=a.timeout)
    except ValueError as exc:  # bad or contradicting flags: usage, exit 2
        p.error(str(exc))
    try:
        if a.command == "list":
            reply = client.rollout_status(a.policy, events=a.events)
        elif a.command == "promote":
            reply = client.promote(a.policy, a.version, to=a.to, reason=a.reason, fraction=a.fraction, labels=labels)
        elif a.command == "rollback":
            reply = client.rollback(a.policy, a.version, reason=a.reason)
        elif a.command == "pin":
            reply = client.pin(a.policy, a.selector, pinned, reason=a.reason)
        else:
            reply = client.set_canary(a.policy, fraction=a.fraction, labels=labels, clear_labels=a.clear_labels,
                                      reason=a.reason)
    except grpc.RpcError as exc:
        raise CommandError(f"{exc.code().name}: {exc.details()}", prog=f"tether rollout {a.command}") from None
    finally:
        client.close()
    if a.json:
        print(json_format.MessageToJson(reply, preserving_proto_field_name=True))
    else:
        print(render(reply, events=a.events if a.command == "list" else 5))


def lineage_chain(versions, v: policies_pb2.PolicyVersion) -> str:
    """Where `v` came from, through its parents, each with its trainer's algo, then the trainer step that made `v`:
    "ppo <- v3 ppo <- ... <- v2 bc <- v1 (step 8)" (a run of versions by the same algo is shortened to its ends; a
    parent not among `versions` ends the chain)."""
    by_version = {x.version: x for x in versions}
    ancestors, seen, cur = [], {v.version}, v
    while cur is not None and cur.lineage.trainer and cur.lineage.parent_version not in seen:
        parent = cur.lineage.parent_version
        if not parent:
            break
        seen.add(parent)
        cur = by_version.get(parent)
        ancestors.append((parent, cur.lineage.algo if cur is not None else ""))
    parts, skipped = [v.lineage.algo or "?"], False
    for k, (version, algo) in enumerate(ancestors):
        keep = k in (0, len(ancestors) - 1) or algo != ancestors[k - 1][1] or algo != ancestors[k + 1][1]
        if not keep:
            skipped = True
            continue
        if skipped:
            parts.append("...")
            skipped = False
        parts.append(f"v{version}" + (f" {algo}" if algo else ""))
    return " <- ".join(parts) + f" (step {v.lineage.trainer_step})"


def render(reply: policies_pb2.RolloutStatusReply, *, events: int = 10) -> str:
    """The rollout as a table, then who gets what, freshness and the recent audit log."""
    r = reply.rollout
    rows = [("version", "state", "sessions", "gate", "steps", "episodes", "return", "p99 ms", "errors", "guard",
             "person", "shadow div", "lineage")]
    for v in reply.versions:
        gate = "-" if not v.gate else ("pass" if all(c.passed for c in v.gate) else
                                       "FAIL " + ",".join(c.name for c in v.gate if not c.passed))
        s = v.stats
        shadow = f"{s.shadow_divergence:.3g} ({s.shadow_steps})" if s.shadow_steps else "-"
        lineage = lineage_chain(reply.versions, v) if v.lineage.trainer else ""
        rows.append((f"v{v.version}", v.state, str(v.sessions), gate, str(s.steps), str(s.episodes),
                     f"{s.mean_return:.4g}" if s.episodes else "-", f"{s.latency_p99_ms:.2f}" if s.steps else "-",
                     str(s.errors), str(s.guard_interventions),
                     f"{s.intervention_rate:.1%}" if s.intervention_steps else "-", shadow, lineage))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"policy {reply.policy} (rollout {r.mode or '?'})"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    canary = "-"
    if r.canary:
        canary = f"v{r.canary} to " + (", ".join(f"{k}={v}" for k, v in sorted(r.canary_labels.items()))
                                      if r.canary_labels else f"{r.canary_fraction:.0%} of sessions")
    lines.append(f"live v{r.live or '-'} (previous v{r.previous_live or '-'}), canary {canary}, "
                 f"shadow v{r.shadow or '-'}, pins: " + (", ".join(f"{k} -> v{v}" for k, v in sorted(r.pins.items()))
                                                         or "none"))
    f = reply.freshness
    if f.newest:
        lines.append(f"freshness: newest v{f.newest}, {f.sessions} sessions, version lag max {f.max_version_lag} "
                     f"mean {f.mean_version_lag:.2f}, time lag max {f.max_time_lag_s:.1f} s")
    if events and reply.events:
        lines.append("audit log:")
        for e in list(reply.events)[-events:]:
            when = time.strftime("%H:%M:%S", time.localtime(e.t_unix_ns / 1e9))
            what = f"{e.from_state or '-'} -> {e.to_state}" if e.kind == "state" else f"{e.kind} {e.detail}"[:60]
            lines.append(f"  {when}  v{e.version or '-'}  {what}  by {e.who}: {e.why}"[:200])
    return "\n".join(lines)


def _version(text: str) -> int:
    """`tether rollout pin`'s VERSION: a number >= 1, or 'none' (0: unpin); ValueError otherwise."""
    if text.lower() == "none":
        return 0
    try:
        version = int(text)
    except ValueError:
        raise ValueError(f"pin: version {text!r} must be a number or 'none'") from None
    if version < 1:
        raise ValueError(f"pin: version {version} must be >= 1")
    return version


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "anonymous"
