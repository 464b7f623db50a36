"""The registry: every version of every policy, its state, gate results, rollout and audit log, in one SQLite file
or in a PostgreSQL database that several gateways share.

    registry = Registry(run_dir / "registry.sqlite")          # creates, or reopens as it was (":memory:": none)
    registry = Registry("postgresql://tether@db:5432/tether")  # the same, shared (bridge.registry.backends)
    registry.add("hopper", 2, sha256=digest, format="safetensors", lineage={"parent": 1}, inputs=[...],
                 outputs=[...], who="trainer:0")              # state candidate
    registry.record_gate("hopper", 2, [report.to_dict() for report in checks])
    registry.move("hopper", 2, State.GATED, who="gate", why="all checks passed")
    registry.move("hopper", 2, State.CANARY, who="auto", why="staged rollout")
    registry.set_canary("hopper", fraction=0.25, who="operator:alice", why="a quarter of the fleet")
    registry.move("hopper", 2, State.LIVE, who="auto", why="no regression")   # v1 -> retired, previous_live 1
    registry.move("hopper", 2, State.ROLLED_BACK, who="auto", why="return 12 vs 480")  # v1 live again
    registry.rollout("hopper")                                 # Rollout(live=1, canary=None, pins={...}, ...)
    registry.events("hopper", since_id=last_seen)              # the audit log, oldest first

Durability: WAL, synchronous=FULL, every change (with its audit events) in one IMMEDIATE transaction, so a process
killed at any instant leaves the file as it was before or after that change. The live/canary/shadow slots are the
states themselves, kept at most one each by unique partial indexes. Thread-safe (one connection behind a lock);
other processes may read the file at the same time.

On PostgreSQL the same statements run (bridge.registry.backends): writers take turns through an advisory
transaction lock, every change bumps the rollout epoch (`epoch()`) and NOTIFYs it in its transaction, so other
gateways re-read (bridge.registry.follow); while the server is unreachable every call raises RegistryUnavailable
(gRPC UNAVAILABLE, "registry unreachable: ...") and the connection is reopened on the next call. The schema is
versioned: bridge.registry.migrations.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from bridge.common.lifecycle import Closing
from bridge.registry.backends import Backend, is_url, open_backend, shown
from bridge.registry.errors import (
    DuplicateVersion,
    RegistryError,
    RegistryUnavailable,
    RegistryWriteFailed,
    UnknownVersion,
)
from bridge.registry.migrations import migrate
from bridge.registry.model import SLOTS, WITHDRAWN, EStopRecord, Event, Rollout, State, VersionRecord, move_refused

MAX_LABELS = 16
MAX_LABEL_CHARS = 64
MAX_PINS = 1024
MAX_JSON_BYTES = 1 << 20
MAX_EVENTS_PAGE = 10_000

_KIND = re.compile(r"[a-z_]{1,32}")
_POLICY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # a Triton model name
_SHA256 = re.compile(r"[0-9a-f]{64}")

MAX_ESTOP_WHY = 512
MAX_ESTOP_NAME = 128


class Registry(Closing):
    """Versions, states, gate results, rollout and audit events of every policy. See the module docstring."""

    def __init__(self, path: Path | str):
        self.shared = is_url(path)   # PostgreSQL: other gateways write too
        # blocking callables a gateway following a shared registry runs (in a thread) after each re-read, e.g. the
        # e-stops' cache reload (bridge.gateway.rollout.follow)
        self.listeners: list = []
        self.path = str(path) if self.shared else Path(path)
        self._lock = threading.RLock()
        self._rollouts: dict[str, Rollout] = {}  # cache: cleared by every write here and by other processes' writes
        self._data_version = -1
        self._connection: Backend | None = None
        try:
            self._connection = open_backend(path)
        except RegistryError:
            raise
        except Exception as exc:
            raise RegistryError(f"cannot open the registry {shown(str(path))!r}: {exc}") from exc
        self.where = self._connection.where
        try:
            with self._write(bump=False):
                migrate(self._db)
            self._db.check()
        except RegistryError:
            self.close()
            raise
        except self._connection.Error as exc:
            self.close()
            raise RegistryError(f"cannot open the registry {self.where!r}: {exc}") from exc
        except BaseException:
            self.close()
            raise

    @property
    def _db(self) -> Backend:
        if self._connection is None:
            raise RegistryError(f"the registry {shown(str(self.path))!r} is closed")
        return self._connection

    # -- changes ------------------------------------------------------------------------------------------------

    def add(self, policy: str, version: int, *, sha256: str, format: str, lineage: dict, inputs: list[dict],
            outputs: list[dict], who: str, why: str = "published", state: State = State.CANDIDATE) -> VersionRecord:
        """Register a new version as a candidate. `state` may name another starting state (not retired or
        rolled_back), e.g. live for a version Triton already serves at start: the moves to it are not checked, but
        the slot rules hold (a live one already there is retired). DuplicateVersion if it exists."""
        _check_policy(policy)
        _check_version(version)
        _check_who_why(who, why)
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise RegistryError(f"sha256 {sha256!r} of {policy!r} v{version} is not 64 lowercase hex digits")
        if not isinstance(format, str) or not 0 < len(format) <= 64:
            raise RegistryError(f"format {format!r} of {policy!r} v{version} is not a name of 1..64 characters")
        state = _check_state(state)
        if state in (State.RETIRED, State.ROLLED_BACK):
            raise RegistryError(f"a new version cannot start as {state} ({policy!r} v{version})")
        if not isinstance(lineage, dict):
            raise RegistryError(f"lineage of {policy!r} v{version} must be a dict, not {type(lineage).__name__}")
        for name, specs in (("inputs", inputs), ("outputs", outputs)):
            if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
                raise RegistryError(f"{name} of {policy!r} v{version} must be a list of dicts, not {specs!r:.200}")
        blobs = [_dumps(value, f"{name} of {policy!r} v{version}")
                 for name, value in (("lineage", lineage), ("inputs", inputs), ("outputs", outputs))]
        with self._write():
            now = time.time_ns()
            if self._row(policy, version) is not None:
                raise DuplicateVersion(f"policy {policy!r} already has version {version}")
            self._db.execute(
                "INSERT INTO rollouts (policy, previous_live, canary_fraction, canary_labels) "
                "VALUES (?, NULL, 0.0, '{}') ON CONFLICT DO NOTHING", (policy,))
            self._db.execute("INSERT INTO versions VALUES (?, ?, ?, ?, ?, ?, ?, ?, '[]', ?, ?)",
                             (policy, version, sha256, format, str(State.CANDIDATE), *blobs, now, now))
            self._event(now, policy, version, "state", "", str(State.CANDIDATE), who, why)
            if state is not State.CANDIDATE:
                self._enter(now, policy, version, State.CANDIDATE, state, who, why)
            return self._get(policy, version)

    def record_gate(self, policy: str, version: int, checks: list[dict], *, who: str = "gate",
                    why: str | None = None) -> VersionRecord:
        """Append gate checks ({"name", "passed", "figures": {str: float}, "detail"}, extra keys kept) to a version;
        one audit event of kind "gate" with every figure as "<check>.<figure>". The state is unchanged."""
        _check_who_why(who, why or "")
        if not isinstance(checks, list) or not checks:
            raise RegistryError(f"checks for {policy!r} v{version} must be a non-empty list, not {checks!r:.200}")
        clean = [_check_gate_entry(c, policy, version) for c in checks]
        figures = {f"{c['name']}.{k}": v for c in clean for k, v in c["figures"].items()}
        failed = [c["name"] for c in clean if not c["passed"]]
        summary = f"failed: {', '.join(failed)}" if failed else f"passed: {', '.join(c['name'] for c in clean)}"
        detail = "; ".join(f"{c['name']}: {'passed' if c['passed'] else 'FAILED'} {c['detail']}".strip()
                           for c in clean)
        with self._write():
            record = self._get(policy, version)
            blob = _dumps(record.gate + clean, f"gate results of {policy!r} v{version}")
            now = time.time_ns()
            self._db.execute("UPDATE versions SET gate = ?, updated_ns = ? WHERE policy = ? AND version = ?",
                             (blob, now, policy, version))
            self._event(now, policy, version, "gate", str(record.state), str(record.state), who, why or summary,
                        figures, detail[:4096])
            return self._get(policy, version)

    def move(self, policy: str, version: int, to: State, *, who: str, why: str,
             figures: Mapping[str, float] | None = None) -> VersionRecord:
        """Change a version's state (the rules: model.move_refused). Entering live/canary/shadow retires the version
        that held that slot ("replaced by vN"; the old live becomes previous_live). Moving the live version to
        rolled_back or retired restores previous_live in the same transaction, and is refused when there is none.
        `figures` (e.g. a Verdict's) go with the move's audit event."""
        _check_who_why(who, why)
        to = _check_state(to)
        figures = _check_figures(figures or {}, f"figures of the move of {policy!r} v{version}")
        with self._write():
            record = self._get(policy, version)
            previous = self._previous_live(policy) if record.state is State.LIVE else None
            if previous is not None and self._get(policy, previous).state is not State.RETIRED:
                previous = None  # only a retired previous live version can be restored
            if (refused := move_refused(policy, version, record.state, to, previous_live=previous)) is not None:
                raise RegistryError(refused)
            now = time.time_ns()
            if record.state is State.LIVE:
                self._set_state(now, policy, version, State.LIVE, to, who, why, figures)
                self._set_state(now, policy, previous, State.RETIRED, State.LIVE, who,
                                f"restored: v{version} {to} ({why})")
                self._db.execute("UPDATE rollouts SET previous_live = ? WHERE policy = ?",
                                 (self._earlier_live(policy, exclude=(previous, version)), policy))
                if to in WITHDRAWN:
                    self._drop_pins(now, policy, version, who, f"v{version} {to}")
            else:
                self._enter(now, policy, version, record.state, to, who, why, figures)
            return self._get(policy, version)

    def set_canary(self, policy: str, *, fraction: float | None = None, labels: dict[str, str] | None = None,
                   who: str, why: str) -> Rollout:
        """Which sessions get the canary: labels (all must match) when set, else a stable `fraction` of sessions.
        None leaves that part as it was; `labels={}` clears the labels."""
        _check_who_why(who, why)
        if fraction is not None:
            if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0.0 <= fraction <= 1.0:
                raise RegistryError(f"canary fraction {fraction!r} for {policy!r} is not a number in [0, 1]")
            fraction = float(fraction)
        if labels is not None:
            labels = _check_labels(labels, f"canary labels for {policy!r}")
        with self._write():
            before = self._rollout(policy)
            new_fraction = before.canary_fraction if fraction is None else fraction
            new_labels = before.canary_labels if labels is None else labels
            now = time.time_ns()
            self._db.execute("UPDATE rollouts SET canary_fraction = ?, canary_labels = ? WHERE policy = ?",
                             (new_fraction, json.dumps(new_labels, sort_keys=True), policy))
            self._event(now, policy, before.canary, "canary", f"{before.canary_fraction:g}", f"{new_fraction:g}",
                        who, why, {"fraction": new_fraction, "previous_fraction": before.canary_fraction},
                        f"fraction {before.canary_fraction:g} -> {new_fraction:g}; labels "
                        f"{_show(before.canary_labels)} -> {_show(new_labels)}")
            return self._rollout(policy)

    def pin(self, policy: str, selector: str, version: int | None, *, who: str, why: str) -> Rollout:
        """Hold sessions on a version: selector "session=<id>" or a label "<key>=<value>"; version None unpins."""
        _check_who_why(who, why)
        key, value = _check_selector(selector)
        selector = f"{key}={value}"
        with self._write():
            before = self._rollout(policy)
            old = before.pins.get(selector)
            now = time.time_ns()
            if version is None:
                if old is None:
                    raise RegistryError(f"policy {policy!r} has no pin {selector!r} to remove")
                self._db.execute("DELETE FROM pins WHERE policy = ? AND selector = ?", (policy, selector))
            else:
                _check_version(version)
                state = self._get(policy, version).state
                if state in WITHDRAWN:
                    raise RegistryError(f"policy {policy!r} v{version} is {state}; it cannot be pinned")
                if old is None and len(before.pins) >= MAX_PINS:
                    raise RegistryError(f"policy {policy!r} already has {MAX_PINS} pins; remove some first")
                self._db.execute("INSERT INTO pins VALUES (?, ?, ?) ON CONFLICT (policy, selector) DO UPDATE "
                                 "SET version = excluded.version", (policy, selector, version))
            self._event(now, policy, version if version is not None else old, "pin", _v(old), _v(version), who,
                        why, {}, selector)
            return self._rollout(policy)

    def record_event(self, *, kind: str, policy: str = "", version: int | None = None, who: str, why: str,
                     figures: Mapping[str, float] | None = None, detail: str = "") -> None:
        """An audit event that changes no version: an operator's e-stop or release (policy "" = the fleet)."""
        _check_who_why(who, why)
        if kind in ("state", "canary", "pin", "gate") or not _KIND.fullmatch(kind or ""):
            raise RegistryError(f"event kind {kind!r} is not 1..32 of [a-z_] (and not one the registry writes itself)")
        if policy:
            _check_policy(policy)
        if version is not None:
            _check_version(version)
        figures = _check_figures(figures or {}, "figures")
        with self._write():
            self._event(time.time_ns(), policy, version, kind, "", "", who, why, figures,
                        _check_text("detail", detail, 512, spaces=True) if detail else "")

    def estop(self, target: str, *, who: str, why: str, estop_id: str | None = None,
              lock_timeout_s: float | None = None) -> tuple[EStopRecord, bool]:
        """Latch an operator e-stop on `target` ("all", "session=<id>" or "robot=<name>"): (the new standing e-stop,
        True), or (the one already standing on that target, False). The row and its audit event (kind "estop",
        detail = target, to_state = the id) are one transaction; a bad argument is refused before anything changes.

            record, changed = registry.estop("robot=arm_1", who="operator:ada", why="person in the cell")
            record.id                                   # "estop-7-3f09c2aa": Action.estop_id

        `estop_id` ("estop-<hex>", made by a gateway that held its sessions before this write): the new row's id; a
        retry of a write that did commit finds its row (returned, False). `lock_timeout_s` (PostgreSQL): the write
        waits at most that long for the write lock and statements (RegistryUnavailable "registry busy" after)."""
        target = _check_estop_target(target)
        _check_estop_who_why(who, why)
        if estop_id is not None and not _ESTOP_ID.fullmatch(estop_id if isinstance(estop_id, str) else ""):
            raise RegistryError(f"e-stop id {estop_id!r:.80} is not 'estop-' and 8..32 hex digits")
        with self._write(lock_timeout_s=lock_timeout_s):
            now = time.time_ns()
            if estop_id is not None and (done := self._estop_by_id(estop_id)) is not None:
                return done, False  # an earlier try committed: its audit event is there
            standing = self._standing_estop(target)
            if standing is None:
                nonce = secrets.token_hex(4)
                seq = self._db.execute("INSERT INTO estops (id, target, who, why, t_ns) VALUES (?, ?, ?, ?, ?) "
                                       "RETURNING seq", (f"new-{nonce}", target, who, why, now)).fetchone()[0]
                self._db.execute("UPDATE estops SET id = ? WHERE seq = ?", (estop_id or f"estop-{seq}-{nonce}", seq))
                standing = self._standing_estop(target)
                self._event(now, "", None, "estop", "", standing.id, who, why, {"changed": 1.0}, target)
                return standing, True
            self._event(now, "", None, "estop", standing.id, standing.id, who, why, {"changed": 0.0}, target)
            return standing, False

    def release(self, target: str, *, who: str, why: str) -> tuple[EStopRecord | None, bool]:
        """Release the e-stop standing on `target`: (it, released now, True), or (None, False) when none stands there.
        The row's change and its audit event (kind "release", from_state = the id) are one transaction: a release
        whose audit event cannot be written is not applied (RegistryError, the e-stop still stands)."""
        target = _check_estop_target(target)
        _check_estop_who_why(who, why)
        with self._write():
            now = time.time_ns()
            standing = self._standing_estop(target)
            if standing is not None:
                self._db.execute("UPDATE estops SET released_ns = ?, released_by = ?, released_why = ? WHERE id = ?",
                                 (now, who, why, standing.id))
            self._event(now, "", None, "release", standing.id if standing else "", "", who, why,
                        {"changed": float(standing is not None)}, target)
            return (self._estop_by_id(standing.id), True) if standing is not None else (None, False)

    def standing_estops(self) -> list[EStopRecord]:
        """The e-stops standing now, oldest first (what a restarted gateway holds sessions by)."""
        with self._lock:
            rows = self._db.execute(f"SELECT {_ESTOP_COLUMNS} FROM estops WHERE released_ns IS NULL ORDER BY seq")
            return [_estop(row) for row in rows.fetchall()]

    def released(self, estop_id: str) -> bool:
        """Whether the e-stop `estop_id` was released (False while it stands, and for an id this registry never
        issued: an edge latched by an unknown e-stop stays latched)."""
        if not isinstance(estop_id, str) or not 0 < len(estop_id) <= 128:
            return False
        with self._lock:
            row = self._db.execute("SELECT released_ns FROM estops WHERE id = ?", (estop_id,)).fetchone()
        return row is not None and row[0] is not None

    def estop_record(self, estop_id: str) -> EStopRecord | None:
        """One e-stop by id, standing or released; None for an id this registry never issued."""
        with self._lock:
            return self._estop_by_id(estop_id)

    # -- reads --------------------------------------------------------------------------------------------------

    def get(self, policy: str, version: int) -> VersionRecord:
        with self._lock, self._db.read():
            return self._get(policy, version)

    def versions(self, policy: str) -> list[VersionRecord]:
        """Every version of `policy`, ascending ([] for a policy the registry does not know)."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM versions WHERE policy = ? ORDER BY version", (policy,))
            return [_record(row) for row in rows.fetchall()]

    def policies(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT policy FROM rollouts ORDER BY policy").fetchall()]

    def rollout(self, policy: str) -> Rollout:
        """The rollout of `policy`; UnknownVersion when the registry has no version of it. Cached (a few us),
        so it may be asked every step; a change made here or by another process shows at once."""
        with self._lock:
            data_version = self._db.data_version()
            if data_version != self._data_version:
                self._rollouts.clear()
                self._data_version = data_version
            cached = self._rollouts.get(policy)
            if cached is None:
                with self._db.read():
                    cached = self._rollouts[policy] = self._rollout(policy)
            c = cached  # a copy: callers may not change the cache through the dicts
            return Rollout(c.policy, c.live, c.previous_live, c.shadow, c.canary, c.canary_fraction,
                           dict(c.canary_labels), dict(c.pins))

    def epoch(self) -> int:
        """The rollout epoch: how many changes were committed (every change bumps it in its transaction)."""
        with self._lock:
            return self._db.execute("SELECT epoch FROM registry_epoch WHERE id = 1").fetchone()[0]

    def snapshot(self, policies: list[str] | None = None) -> tuple[int, dict[str, Rollout]]:
        """The epoch and the rollouts of `policies` (None: every policy) read in one snapshot: what a gateway
        following the epoch serves. Policies the registry does not know are left out."""
        with self._lock, self._db.read():
            epoch = self._db.execute("SELECT epoch FROM registry_epoch WHERE id = 1").fetchone()[0]
            known = [r[0] for r in self._db.execute("SELECT policy FROM rollouts ORDER BY policy").fetchall()]
            names = known if policies is None else [p for p in policies if p in set(known)]
            return epoch, {name: self._rollout(name) for name in names}

    def events(self, policy: str | None = None, *, since_id: int = 0, limit: int = 200,
               version: int | None = None) -> list[Event]:
        """Audit events with id > since_id (of `policy`, of its `version`), oldest first, at most `limit` (1..10000).
        Page on with since_id = the last id seen."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_EVENTS_PAGE:
            raise RegistryError(f"events limit {limit!r} is not an integer in [1, {MAX_EVENTS_PAGE}]")
        if isinstance(since_id, bool) or not isinstance(since_id, int) or since_id < 0:
            raise RegistryError(f"events since_id {since_id!r} is not an integer >= 0")
        query, args = "SELECT * FROM events WHERE id > ?", [since_id]
        if policy is not None:
            query, args = query + " AND policy = ?", [*args, policy]
        if version is not None:
            if policy is None:
                raise RegistryError(f"events of version {version!r} need the policy too")
            query, args = query + " AND version = ?", [*args, version]
        with self._lock:
            rows = self._db.execute(query + " ORDER BY id LIMIT ?", (*args, limit)).fetchall()
        return [_event_record(r) for r in rows]

    def latest_events(self, policy: str | None = None, *, limit: int = 200,
                      before_id: int | None = None) -> list[Event]:
        """The newest `limit` (1..10000) audit events (of `policy`) with id < before_id (None: the newest of all),
        oldest first: one indexed read however long the log is. Page back with before_id = the first id returned.

            page = registry.latest_events("hopper", limit=20)               # the newest 20
            older = registry.latest_events("hopper", limit=20, before_id=page[0].id)
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_EVENTS_PAGE:
            raise RegistryError(f"events limit {limit!r} is not an integer in [1, {MAX_EVENTS_PAGE}]")
        if before_id is not None and (isinstance(before_id, bool) or not isinstance(before_id, int) or before_id < 1):
            raise RegistryError(f"events before_id {before_id!r} is not an integer >= 1 (or None: the newest)")
        query, args = "SELECT * FROM events WHERE id < ?", [2**63 - 1 if before_id is None else before_id]
        if policy is not None:
            query, args = query + " AND policy = ?", [*args, policy]
        with self._lock:
            rows = self._db.execute(query + " ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
        return [_event_record(r) for r in reversed(rows)]

    def close(self) -> None:
        """Close the file or connection (again: nothing); every later call raises RegistryError."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    # -- inside a transaction -----------------------------------------------------------------------------------

    @contextmanager
    def _write(self, *, bump: bool = True, lock_timeout_s: float | None = None) -> Iterator[None]:
        """One write transaction (writers take turns); on success the epoch is bumped (and, on PostgreSQL,
        NOTIFYed) in it. Nothing of a failed change is kept. `lock_timeout_s` (PostgreSQL): lock_timeout and
        statement_timeout for this transaction (the write lock included); past them RegistryUnavailable."""
        with self._lock, self._timeouts(lock_timeout_s):
            self._rollouts.clear()
            db = self._db
            try:
                db.begin()
            except RegistryUnavailable:
                raise
            except db.Error as exc:
                raise RegistryWriteFailed(f"cannot write the registry {self.where!r}: {exc}") from exc
            try:
                yield
                if bump:
                    epoch = db.execute("UPDATE registry_epoch SET epoch = epoch + 1 WHERE id = 1 "
                                       "RETURNING epoch").fetchone()[0]
                    if self.shared:
                        db.notify(epoch)
            except RegistryUnavailable:
                db.rollback()
                raise
            except db.Error as exc:  # disk full, I/O error, a failed constraint: nothing of the change is kept
                db.rollback()
                raise RegistryWriteFailed(f"cannot write the registry {self.where!r}: {exc}") from exc
            except BaseException:
                db.rollback()
                raise
            try:
                db.commit()
            except RegistryUnavailable:
                raise
            except db.Error as exc:
                db.rollback()
                raise RegistryWriteFailed(f"cannot write the registry {self.where!r}: {exc}") from exc

    @contextmanager
    def _timeouts(self, lock_timeout_s: float | None) -> Iterator[None]:
        """PostgreSQL's lock_timeout / statement_timeout for what runs inside (then back to the server's defaults);
        a statement they cancel becomes RegistryUnavailable ("registry busy")."""
        if lock_timeout_s is None or not self.shared:
            yield
            return
        ms = max(1, int(lock_timeout_s * 1000))
        self._db.execute("SELECT set_config('lock_timeout', ?, false), set_config('statement_timeout', ?, false)",
                         (f"{ms}ms", f"{2 * ms}ms"))
        try:
            yield
        except RegistryWriteFailed as exc:
            if getattr(exc.__cause__, "sqlstate", None) in ("55P03", "57014"):  # lock_not_available, query_canceled
                raise RegistryUnavailable(f"registry busy: {self.where}: no lock or answer within {ms} ms") from exc
            raise
        finally:
            with contextlib.suppress(Exception):  # a lost connection: the next one starts with the defaults
                self._db.execute("SELECT set_config('lock_timeout', '0', false), "
                                 "set_config('statement_timeout', '0', false)")

    def _standing_estop(self, target: str) -> EStopRecord | None:
        row = self._db.execute(f"SELECT {_ESTOP_COLUMNS} FROM estops WHERE target = ? AND released_ns IS NULL",
                               (target,)).fetchone()
        return None if row is None else _estop(row)

    def _estop_by_id(self, estop_id: str) -> EStopRecord | None:
        row = self._db.execute(f"SELECT {_ESTOP_COLUMNS} FROM estops WHERE id = ?", (estop_id,)).fetchone()
        return None if row is None else _estop(row)

    def _row(self, policy: str, version: int) -> tuple | None:
        return self._db.execute("SELECT * FROM versions WHERE policy = ? AND version = ?",
                                (policy, version)).fetchone()

    def _get(self, policy: str, version: int) -> VersionRecord:
        row = self._row(policy, version)
        if row is None:
            known = [r[0] for r in self._db.execute(
                "SELECT version FROM versions WHERE policy = ? ORDER BY version", (policy,)).fetchall()]
            raise UnknownVersion(f"policy {policy!r} has no version {version!r} in the registry "
                                 f"(known: {', '.join(map(str, known)) or 'none'})")
        return _record(row)

    def _rollout(self, policy: str) -> Rollout:
        row = self._db.execute("SELECT previous_live, canary_fraction, canary_labels FROM rollouts WHERE policy = ?",
                               (policy,)).fetchone()
        if row is None:
            raise UnknownVersion(f"policy {policy!r} has no versions in the registry")
        slots = dict(self._db.execute("SELECT state, version FROM versions WHERE policy = ? AND state IN "
                                      "('live', 'canary', 'shadow')", (policy,)).fetchall())
        pins = dict(self._db.execute("SELECT selector, version FROM pins WHERE policy = ? ORDER BY selector",
                                     (policy,)).fetchall())
        return Rollout(policy=policy, live=slots.get("live"), previous_live=row[0], shadow=slots.get("shadow"),
                       canary=slots.get("canary"), canary_fraction=row[1], canary_labels=json.loads(row[2]),
                       pins=pins)

    def _previous_live(self, policy: str) -> int | None:
        return self._db.execute("SELECT previous_live FROM rollouts WHERE policy = ?", (policy,)).fetchone()[0]

    def _earlier_live(self, policy: str, *, exclude: tuple[int, int]) -> int | None:
        """The most recent version, other than `exclude`, that was live and is retired now (a rollback target)."""
        rows = self._db.execute(
            "SELECT e.version FROM events e JOIN versions v ON v.policy = e.policy AND v.version = e.version "
            "WHERE e.policy = ? AND e.kind = 'state' AND e.to_state = 'live' AND v.state = 'retired' "
            "AND e.version NOT IN (?, ?) ORDER BY e.id DESC LIMIT 1", (policy, *exclude)).fetchone()
        return rows[0] if rows else None

    def _enter(self, now: int, policy: str, version: int, state: State, to: State, who: str, why: str,
               figures: Mapping[str, float] | None = None) -> None:
        if to in SLOTS:
            holder = self._db.execute("SELECT version FROM versions WHERE policy = ? AND state = ?",
                                      (policy, str(to))).fetchone()
            if holder is not None and holder[0] != version:
                self._set_state(now, policy, holder[0], to, State.RETIRED, who, f"replaced by v{version}")
                if to is State.LIVE:
                    self._db.execute("UPDATE rollouts SET previous_live = ? WHERE policy = ?", (holder[0], policy))
        self._set_state(now, policy, version, state, to, who, why, figures)
        if to in WITHDRAWN:
            self._drop_pins(now, policy, version, who, f"v{version} {to}")

    def _set_state(self, now: int, policy: str, version: int, state: State, to: State, who: str, why: str,
                   figures: Mapping[str, float] | None = None) -> None:
        self._db.execute("UPDATE versions SET state = ?, updated_ns = ? WHERE policy = ? AND version = ?",
                         (str(to), now, policy, version))
        self._event(now, policy, version, "state", str(state), str(to), who, why, figures)

    def _drop_pins(self, now: int, policy: str, version: int, who: str, why: str) -> None:
        for (selector,) in self._db.execute("SELECT selector FROM pins WHERE policy = ? AND version = ? "
                                            "ORDER BY selector", (policy, version)).fetchall():
            self._db.execute("DELETE FROM pins WHERE policy = ? AND selector = ?", (policy, selector))
            self._event(now, policy, version, "pin", _v(version), "", who, why, {}, selector)

    def _event(self, now: int, policy: str, version: int | None, kind: str, from_state: str, to_state: str,
               who: str, why: str, figures: Mapping[str, float] | None = None, detail: str = "") -> None:
        self._db.execute("INSERT INTO events (t_ns, policy, version, kind, from_state, to_state, who, why, figures, "
                         "detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (now, policy, version, kind, from_state, to_state, who, why,
                          json.dumps(dict(figures or {}), sort_keys=True), detail))


# -- validation and encoding ------------------------------------------------------------------------------------


_ESTOP_COLUMNS = "id, target, who, why, t_ns, released_ns, released_by, released_why"
_ESTOP_ID = re.compile(r"estop-[0-9a-f]{8,32}")


def _estop(row: tuple) -> EStopRecord:
    return EStopRecord(id=row[0], target=row[1], who=row[2], why=row[3], t_ns=row[4], released_ns=row[5],
                       released_by=row[6], released_why=row[7])


def _check_estop_target(target: object) -> str:
    """"all", "session=<id>" (as Hello allows: no spaces) or "robot=<name>" (a label value), at most 128 each."""
    if target == "all":
        return target
    if not isinstance(target, str) or not target.startswith(("session=", "robot=")):
        raise RegistryError(f"e-stop target {target!r:.300} is not 'all', 'session=<id>' or 'robot=<name>'")
    key, value = target.split("=", 1)
    _check_text(f"e-stop target: {key}", value, MAX_ESTOP_NAME, spaces=key == "robot")
    return target


def _check_estop_who_why(who: object, why: object) -> None:
    if not isinstance(who, str) or not 0 < len(who) <= 256 or not who.isprintable():
        raise RegistryError(f"e-stop who {who!r:.300} is not a printable name of 1..256 characters")
    if not isinstance(why, str) or len(why) > MAX_ESTOP_WHY or not why.isprintable():
        shown = f"{len(why)} characters" if isinstance(why, str) else type(why).__name__
        raise RegistryError(f"e-stop why (the reason) must be printable text of at most {MAX_ESTOP_WHY} characters, "
                            f"got {shown}: {why!r:.60}")


def _event_record(r: tuple) -> Event:
    return Event(id=r[0], t_ns=r[1], policy=r[2], version=r[3], kind=r[4], from_state=r[5], to_state=r[6], who=r[7],
                 why=r[8], figures=json.loads(r[9]), detail=r[10])


def _record(row: tuple) -> VersionRecord:
    return VersionRecord(policy=row[0], version=row[1], sha256=row[2], format=row[3], state=State(row[4]),
                         lineage=json.loads(row[5]), inputs=json.loads(row[6]), outputs=json.loads(row[7]),
                         gate=json.loads(row[8]), created_ns=row[9], updated_ns=row[10])


def _check_policy(policy: object) -> None:
    if not isinstance(policy, str) or not _POLICY.fullmatch(policy):
        raise RegistryError(f"policy name {policy!r} is not 1..128 of [A-Za-z0-9_.-] starting with a letter or digit")


def _check_version(version: object) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version < 2**63:
        raise RegistryError(f"version {version!r} is not an integer >= 1")


def _check_state(state: object) -> State:
    try:
        return State(state)
    except ValueError:
        raise RegistryError(f"state {state!r} is not one of {', '.join(State)}") from None


def _check_who_why(who: object, why: object) -> None:
    if not isinstance(who, str) or not 0 < len(who) <= 256:
        raise RegistryError(f"who {who!r} is not a name of 1..256 characters (e.g. 'operator:alice', 'auto')")
    if not isinstance(why, str) or len(why) > 4096:
        raise RegistryError(f"why {why!r:.100} is not a string of at most 4096 characters")


def _check_text(what: str, text: object, limit: int, *, spaces: bool, equals: bool = True) -> str:
    """Hello's rules (bridge.gateway.session.limits): printable, 1..limit characters, spaces only where said."""
    if (not isinstance(text, str) or not 0 < len(text) <= limit or not text.isprintable()
            or (not spaces and any(c.isspace() for c in text)) or (not equals and "=" in text)):
        rule = "printable" + ("" if spaces else ", no spaces") + ("" if equals else ", no '='")
        raise RegistryError(f"{what} {text!r:.300} is not 1..{limit} characters ({rule})")
    return text


def _check_labels(labels: object, what: str) -> dict[str, str]:
    if not isinstance(labels, Mapping):
        raise RegistryError(f"{what} must be a mapping of str to str, not {labels!r:.200}")
    if len(labels) > MAX_LABELS:
        raise RegistryError(f"{what} has {len(labels)} pairs; at most {MAX_LABELS}")
    for key, value in labels.items():
        _check_text(f"{what}: key", key, MAX_LABEL_CHARS, spaces=False, equals=False)
        _check_text(f"{what}: value of {key!r}", value, MAX_LABEL_CHARS, spaces=True)
    return dict(sorted(labels.items()))


def _check_selector(selector: object) -> tuple[str, str]:
    """"session=<id>" (the id as Hello allows: <= 128, no spaces) or "<label key>=<label value>" (<= 64 / <= 256)."""
    if not isinstance(selector, str) or "=" not in selector:
        raise RegistryError(f"pin selector {selector!r:.300} is not 'session=<id>' or a label '<key>=<value>'")
    key, value = selector.split("=", 1)
    _check_text(f"pin selector {selector!r:.300}: key", key, MAX_LABEL_CHARS, spaces=False)
    if key == "session":
        _check_text(f"pin selector {selector!r:.300}: session id", value, 128, spaces=False)
    else:
        _check_text(f"pin selector {selector!r:.300}: label value", value, 256, spaces=True)
    return key, value


def _check_gate_entry(check: object, policy: str, version: int) -> dict:
    where = f"gate check for {policy!r} v{version}"
    if not isinstance(check, Mapping):
        raise RegistryError(f"{where} must be a dict, not {check!r:.200}")
    name, passed, figures, detail = (check.get(k) for k in ("name", "passed", "figures", "detail"))
    if not isinstance(name, str) or not 0 < len(name) <= 64 or "." in name:
        raise RegistryError(f"{where}: name {name!r} is not 1..64 characters without '.'")
    if not isinstance(passed, bool):
        raise RegistryError(f"{where} {name!r}: passed {passed!r} is not a bool")
    clean_figures = _check_figures(figures, f"{where} {name!r}:")
    if not isinstance(detail, str):
        raise RegistryError(f"{where} {name!r}: detail {detail!r:.200} is not a string")
    return {**check, "name": name, "passed": passed, "figures": clean_figures, "detail": detail}


def _check_figures(figures: object, what: str) -> dict[str, float]:
    if not isinstance(figures, Mapping) or not all(isinstance(k, str) and k for k in figures):
        raise RegistryError(f"{what} figures {figures!r:.200} is not a dict of str to float")
    clean = {}
    for key, value in figures.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RegistryError(f"{what} figure {key!r} = {value!r:.100} is not a number")
        clean[key] = float(value)
    return clean


def _dumps(value: object, what: str) -> str:
    try:
        blob = json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise RegistryError(f"{what} is not JSON-serialisable: {exc}") from None
    if len(blob) > MAX_JSON_BYTES:
        raise RegistryError(f"{what} is {len(blob)} bytes as JSON; at most {MAX_JSON_BYTES}")
    return blob


def _show(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in labels.items()) + "}"


def _v(version: int | None) -> str:
    return "" if version is None else f"v{version}"

