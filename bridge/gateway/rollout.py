"""The life of a policy version in the gateway, from Publish to live (or out), and which version
each session acts with.

    Publish ─▶ candidate ─(gate: integrity; write folder + load_model + READY; consistency,
               evaluation, action sanity)─▶ gated ─┬─ direct ─▶ live
                                                   └─ staged ─▶ shadow (N steps, never actuated)
                                                                ─▶ canary (a fraction or labels, K episodes)
                                                                ─▶ live, or rolled_back (automatic, why audited)
    any failed check ─▶ rejected (folder retired, unloaded; the live version keeps serving)

    rollout = RolloutController(registry=registry, catalog=catalog, control=client, batcher=batcher,
                                repository=repo, plan=RolloutPlan(mode="staged"), gate=gate,
                                in_use=lambda policy: {3})
    await rollout.start()                       # restore after a restart, register what Triton serves
    reply = await rollout.publish(header, data, who="trainer:ppo@host")
    rollout.acting("hopper", "arm_2", {"robot": "arm_2"})     # the ServedPolicy this session acts with
    await rollout.promote("hopper", 4, State.CANARY, who="operator:alice", why="try it", fraction=0.1)
    await rollout.rollback("hopper", who="operator:alice", why="jerky")   # the live one; the previous is back
    await rollout.pin("hopper", "robot=arm_2", 3, who="operator:alice", why="hold arm_2")
    rollout.version_stats("hopper"), rollout.freshness()
    await rollout.stop()

Locking: every change of state takes the rollout lock for a short move (registry commit, load/unload,
verification), never for a gate check. A publish holds the gate lock (one candidate in the gate at a
time) and the rollout lock only to number its version, to swap its folder in (write, load_model,
READY) and, after the gate, to re-check and enter the plan: an operator's Rollback, Promote or Pin,
and the judging loop's automatic rollback, go through while a candidate is being evaluated. A
candidate whose incumbent stopped being live during its gate (an operator rolled it back, a canary
went live) is rejected (`GateSuperseded`, ABORTED): it was judged against a version no longer live.

Every change of state goes through the registry (an audit event with who/why). Versions nobody
needs (not live, previous live, canary, shadow or pinned, and no session acting with them) are
retired from the repository and unloaded; after every load or unload the controller checks what
Triton serves (the READY list, and for restored versions an output fingerprint): a swap that did
not take effect raises `SwapFailed`, it is never silent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import numpy as np
from google.protobuf import json_format

from bridge.gateway.batcher import MicroBatcher
from bridge.gateway.declared_bounds import DeclaredBounds
from bridge.gateway.errors import UnknownPolicy
from bridge.gateway.policies import LOG_PROB, PolicyCatalog, ServedPolicy
from bridge.gateway.publisher import GateSuperseded, Publisher, PublishError, VerificationFailed, read_metadata
from bridge.gateway.rollout_config import RolloutPlan
from bridge.gateway.rollout_io import Fingerprint, SwapFailed, restore_version, spec_dicts
from bridge.gateway.rollout_router import RolloutRouter
from bridge.registry import (
    MOVES,
    Registry,
    RegistryError,
    Rollout,
    State,
    VersionRecord,
)
from inference_server import ModelRepository, PolicyClient
from protos import policies_pb2
from protos.codec import Spec, TensorError, specs_from_proto

log = logging.getLogger("tether.gateway")
WITHDRAWN = (State.REJECTED, State.ROLLED_BACK)


class RolloutController:
    """See the module docstring. Changes run under one lock, held only for short moves (never
    through a gate check); the hot path (`acting`, `stepped`, `episode_ended`) reads cached
    rollouts and never waits for the registry or Triton."""

    def __init__(self, *, registry: Registry, catalog: PolicyCatalog, control: PolicyClient, batcher: MicroBatcher,
                 publisher: Publisher, repository: ModelRepository | None, plan: RolloutPlan,
                 in_use: Callable[[str], set[int]], gate=None, sessions: Callable[[], list] = list):
        self.registry, self.plan, self.gate = registry, plan, gate
        self._catalog, self._control, self._batcher = catalog, control, batcher
        self._publisher, self._repo, self._in_use, self._sessions = publisher, repository, in_use, sessions
        self._lock = asyncio.Lock()       # short state moves (registry, repository, Triton's loaded versions)
        self._gate_lock = asyncio.Lock()  # one candidate in the gate at a time; operators never wait for it
        self.router = RolloutRouter(catalog=catalog, batcher=batcher, thresholds=plan.thresholds)
        self.stats, self._rollouts = self.router.stats, self.router.rollouts_now
        # sessions talk to the router directly (the VersionRouter role): no hop through the controller
        self.acting, self.stepped = self.router.acting, self.router.stepped
        self.episode_ended = self.router.episode_ended
        self._newest: dict[str, tuple[int, int]] = {}   # policy -> (newest non-rejected version, its created_ns)
        self._gating: dict[str, int] = {}               # policy -> the version in the gate now
        self._gate_base: dict[str, int] = {}            # policy -> the version whose architecture it builds on
        self._probation: dict[str, int] = {}            # policy -> the live version judged vs the previous one
        self.bounds = DeclaredBounds()                  # the action bounds sessions declared, by who declared them
        self.evaluating: set[str] = set()               # the gate's evaluation sessions (pinned, not logged)
        self._fingerprint = Fingerprint(control)
        self._loop_task: asyncio.Task | None = None
        self.errors: list[str] = []                     # background failures (also logged)

    # -- start, stop, restore ------------------------------------------------------------------------------------

    async def start(self, policies: list[str]) -> None:
        """Bring the registry and Triton into agreement for `policies` (plus every policy the registry
        knows): versions Triton serves that the registry lacks are registered (the newest as live);
        live/previous live/canary/shadow/pinned versions are loaded and verified; candidates a
        crash interrupted are rejected; the rest is unloaded. Then the judging loop starts."""
        names = sorted(set(policies) | set(self.registry.policies()))
        async with self._lock:
            for name in names:
                await self._restore(name)
        self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="rollout")

    def attach_evaluator(self, address: str, **kw) -> None:
        """Evaluation in simulation (when the gate has an eval env): `tether sim` processes against
        this gateway at `address`, their sessions pinned to the version under test (`kw`: more
        SimEvaluator arguments, e.g. the sims' TLS flags)."""
        config = self.gate.config
        if config.eval_env is not None or config.eval_envs:
            from bridge.gate import SimEvaluator

            self.gate.evaluator = SimEvaluator.from_config(config, address=address, pin=self.pin_session,
                                                           unpin=self.unpin_session, **kw)

    async def track(self, policy: str) -> None:
        """Bring a policy a session asks for under the registry (once), as `start` does."""
        if policy not in self._rollouts:
            async with self._lock:
                if policy not in self._rollouts:
                    await self._restore(policy)

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        await self.router.stop()

    async def _restore(self, name: str) -> None:
        try:
            ready = await self._control.ready_versions(name)
        except Exception as exc:
            log.warning("rollout: cannot list versions of %s in Triton: %s", name, exc)
            ready = []
        known = {r.version: r for r in self.registry.versions(name)}
        has_live = any(r.state is State.LIVE for r in known.values())
        for version in sorted((v for v in ready if v not in known), reverse=True):
            if has_live:  # an older stray version: not registered, unloaded below (its folder kept in .retired)
                log.warning("rollout: %s v%d serves but is not in the registry, which has a live version: it is "
                            "unloaded", name, version)
                continue
            served = await self._catalog.ensure(name, version)
            await self._write(self.registry.add, name, version, sha256=self._sha256(name, version),
                              format=self._format_on_disk(name, version), lineage={},
                              inputs=spec_dicts(served.inputs),
                              outputs=spec_dicts(served.outputs), who="gateway", why="serving at start",
                              state=State.LIVE)
            has_live = True
        for record in self.registry.versions(name):
            if record.state is State.CANDIDATE:
                await self._write(self.registry.move, name, record.version, State.REJECTED, who="gateway",
                                  why="its gate was interrupted by a gateway restart")
        rollout = self._refresh(name)
        for version in sorted(self._needed(name, rollout)):
            try:
                await self._serve(name, version)
            except SwapFailed as exc:  # without its live version the policy cannot serve: that stops the start
                if version == rollout.live:
                    raise
                log.error("rollout %s: v%d (%s) cannot be served: %s", name, version,
                          self.registry.get(name, version).state, exc)
        if rollout.live is not None:
            await self._catalog.promote(name, rollout.live)
        for record in self.registry.versions(name):  # gated before a restart: the plan goes on
            if record.state is State.GATED:
                await self._serve(name, record.version)
                await self._enter_plan(name, record.version)
        await self._reconcile(name)
        log.info("rollout %s restored: live v%s, canary v%s (fraction %g, labels %s), shadow v%s, pins %s", name,
                 rollout.live, rollout.canary, rollout.canary_fraction, rollout.canary_labels, rollout.shadow,
                 rollout.pins)

    def _sha256(self, name: str, version: int) -> str:
        meta = read_metadata(self._repo, name, version) if self._repo is not None else None
        if meta is not None and len(meta.sha256) == 64:
            return meta.sha256.lower()
        return self._fingerprint.file_digest(self._repo, name, version)

    # -- publish -------------------------------------------------------------------------------------------------

    async def publish(self, header: policies_pb2.PublishHeader, data: bytes, *,
                      who: str | None = None) -> policies_pb2.PublishReply:
        """Register, gate, write, load, verify and roll out one new version (see the module docstring).
        `who`: the publisher's authenticated identity (the audit's who); the trainer name the client
        wrote in the lineage is only a detail. Returns the PublishReply; a version the gate refuses
        raises (PublishError / VerificationFailed / GateSuperseded) naming why, after it was withdrawn."""
        repo = self._publisher.repository()
        started = time.monotonic()
        current = await self._current(header)
        name = current.name if current is not None else header.policy
        claimed = header.lineage.trainer
        why = "published" + (f" (the client names its trainer {claimed[:128]!r})" if claimed else "")
        who = who or "trainer:unknown"
        async with self._gate_lock:
            async with self._lock:  # short: number the version and register it
                rollout = self._rollout(name)
                base = rollout.live if rollout.live is not None else current.version if current is not None else None
                known = [r.version for r in self.registry.versions(name)]
                version = max([0, *repo.versions(name), *repo.retired_versions(name), *known, base or 0]) + 1
                inputs, outputs = (current.inputs, current.outputs) if current is not None else _header_specs(header)
                await self._write(self.registry.add, name, version, sha256=_hex(header.sha256),
                                  format=header.format or "safetensors",
                                  lineage=json_format.MessageToDict(header.lineage, preserving_proto_field_name=True),
                                  inputs=spec_dicts(inputs), outputs=spec_dicts(outputs), who=who, why=why)
                self._newest[name] = (version, time.time_ns())
                self._gating[name] = version
                if base is not None:
                    self._gate_base[name] = base  # kept on disk (not retired) until the publish ends
            try:
                reply, incumbent, passed = await self._gate_and_load(name, version, base, header, data)
                async with self._lock:  # short: re-check what the gate judged against, then enter the plan
                    note = self._still_valid(name, version, incumbent)
                    await self._write(self.registry.move, name, version, State.GATED, who="gate",
                                      why="passed: " + ", ".join(passed) + note)
                    self._gating.pop(name, None)
                    self._gate_base.pop(name, None)
                    await self._enter_plan(name, version)
                    await self._reconcile(name)
            except BaseException as exc:
                self._gating.pop(name, None)
                self._gate_base.pop(name, None)
                async with self._lock:
                    await self._reject(name, version, exc)
                raise
        reply.load_seconds = time.monotonic() - started
        log.info("policy %s v%d published by %s (parent v%d, trainer step %d): %s, %.2f s", name, version, who,
                 header.lineage.parent_version, header.lineage.trainer_step,
                 self.registry.get(name, version).state, reply.load_seconds)
        return reply

    def _still_valid(self, name: str, version: int, incumbent: int | None) -> str:
        """After the gate (run without the rollout lock): the candidate must still be a candidate, and the
        version it was judged against must not have been withdrawn meanwhile (rolled back by an operator or
        by the judging loop): GateSuperseded otherwise. Returns a note when the live version moved on in an
        ordinary way (a canary went live): the candidate goes on, its plan judges it against the new one."""
        record = self.registry.get(name, version)
        if record.state is not State.CANDIDATE:
            raise GateSuperseded(f"policy {name!r} v{version} became {record.state} during its gate: not promoted")
        live = self._refresh(name).live
        if live == incumbent:
            return ""
        moved = self.registry.get(name, incumbent).state if incumbent is not None else None
        if moved in WITHDRAWN:
            raise GateSuperseded(
                f"policy {name!r} v{version} was judged against v{incumbent}, which was {moved} during its gate "
                f"(live now: v{live}); it is not promoted: publish again to be judged against the live version")
        return f"; judged against v{incumbent}, live now v{live}"

    async def _current(self, header: policies_pb2.PublishHeader) -> ServedPolicy | None:
        """The policy a publish adds a version to; None for an imported file that creates a new policy."""
        try:
            return await self._catalog.resolve(header.policy)
        except UnknownPolicy:
            if header.policy and header.format != "safetensors" and header.inputs and header.outputs:
                return None
            raise

    async def _gate_and_load(self, name: str, version: int, base: int | None, header: policies_pb2.PublishHeader,
                             data: bytes) -> tuple[policies_pb2.PublishReply, int | None, list[str]]:
        """Integrity, then (under the rollout lock, short) the version folder written and loaded, then the
        served checks (consistency, action sanity, evaluation) without the lock. Returns the reply, the
        incumbent the checks judged against, and the names of the checks passed."""
        repo = self._publisher.repository()
        weights, architecture = await asyncio.to_thread(self._publisher.decode, header, data, name, base)
        artifact = await asyncio.to_thread(self.gate.check_artifact, weights, architecture, sha256=header.sha256,
                                           data=data)  # a 100 MB model: ~0.4 s of hashing and scanning, off the loop
        await self._write(self.registry.record_gate, name, version, [artifact.to_dict()])
        if not artifact.passed:
            raise PublishError(f"policy {name!r} v{version} rejected by the gate: integrity: {artifact.detail}")
        async with self._lock:  # the swap: what is on disk and what Triton serves change together
            keep = self._needed(name, self._rollout(name)) | self._in_use(name) | {base}
            # the write step is one call (Publisher.write): safetensors over the base's architecture, or an imported
            # file; folder and tether.json fsynced before any registry state depends on them
            await asyncio.to_thread(self._retire, repo, name, keep)  # one load_model below unloads these, loads it
            await self._publisher.write(name, version, header, weights, base)
            ready = await self._publisher.load(name, version)
            await self._verify_ready(name)  # the unloads took effect too
            served = await self._catalog.ensure(name, version)
            incumbent = self._rollout(name).live
            action_spec = self.action_spec(name, served)
        # the gate's checks without the rollout lock (an evaluation in simulation takes tens of seconds)
        checks = await self.gate.check_served(policy=name, version=version, incumbent=incumbent, header=header,
                                              action_spec=action_spec)
        await self._write(self.registry.record_gate, name, version, [c.to_dict() for c in checks])
        failed = [c for c in checks if not c.passed]
        if failed:
            async with self._lock:  # a check that failed because its incumbent was withdrawn meanwhile: say so
                self._still_valid(name, version, incumbent)
            first = failed[0]
            raise VerificationFailed(f"policy {name!r} v{version} rejected by the gate: {first.name}: {first.detail}")
        error = next((c.figures.get("max_abs_error", 0.0) for c in checks if c.name == "consistency"), 0.0)
        reply = policies_pb2.PublishReply(policy=name, version=version, sha256=header.sha256, ready_versions=ready,
                                          max_abs_error=float(error))
        return reply, incumbent, [c.name for c in (artifact, *checks)]

    async def _reject(self, name: str, version: int, exc: BaseException) -> None:
        """Withdraw a version the gate (or anything on the way) refused; the live one keeps serving."""
        try:
            if self.registry.get(name, version).state is State.CANDIDATE:
                why = str(exc) or type(exc).__name__
                await self._write(self.registry.move, name, version, State.REJECTED, who="gate", why=why[:2000])
        except Exception as error:
            log.error("rollout: recording the rejection of %s v%d: %s", name, version, error)
        await self._publisher.withdraw(name, version)
        self._newest.pop(name, None)
        self._refresh(name)

    async def _enter_plan(self, name: str, version: int) -> None:
        if self.plan.mode == "direct" or self._rollout(name).live is None:  # a first version protects nothing
            why = "rollout direct" if self.plan.mode == "direct" else "the policy's first version"
            await self._write(self.registry.move, name, version, State.LIVE, who="auto", why=why)
            await self._catalog.promote(name, version)
        else:
            rollout = self._rollout(name)
            if rollout.shadow is not None:
                await self._write(self.registry.move, name, rollout.shadow, State.RETIRED, who="auto",
                                  why=f"superseded by v{version}")
            await self._write(self.registry.move, name, version, State.SHADOW, who="auto",
                              why=f"rollout staged: shadow for {self.plan.shadow_steps} steps")
        self._refresh(name)

    # -- operator actions (RPCs, console) ------------------------------------------------------------------------

    async def promote(self, policy: str, version: int, to: State, *, who: str, why: str,
                      fraction: float | None = None, labels: dict | None = None) -> VersionRecord:
        to = State(to)
        if to not in (State.SHADOW, State.CANARY, State.LIVE):
            raise RegistryError(f"promote moves a version to shadow, canary or live, not {to}")
        async with self._lock:
            self._check_move(policy, version, to)
            await self._serve(policy, version)
            if to is State.CANARY and (fraction is not None or labels is not None):
                await self._write(self.registry.set_canary, policy, fraction=fraction, labels=labels, who=who, why=why)
            if to is State.SHADOW and (shadow := self._rollout(policy).shadow) not in (None, version):
                await self._write(self.registry.move, policy, shadow, State.RETIRED, who=who,
                                  why=f"superseded by v{version}")
            record = await self._write(self.registry.move, policy, version, to, who=who, why=why)
            if to is State.LIVE:
                self._probation[policy] = version
            await self._after_change(policy)
            return record

    async def rollback(self, policy: str, version: int | None = None, *, who: str, why: str) -> VersionRecord:
        """Roll back `version` (None: the live one, and the previous live version is live again)."""
        async with self._lock:
            return await self._rollback(policy, version, who=who, why=why)

    async def _rollback(self, policy: str, version: int | None, *, who: str, why: str) -> VersionRecord:
        rollout = self._rollout(policy)
        version = rollout.live if version is None else version
        if version is None:
            raise RegistryError(f"policy {policy!r} has no live version to roll back")
        self._check_move(policy, version, State.ROLLED_BACK)
        if version == rollout.live:
            if rollout.previous_live is None:
                raise RegistryError(f"policy {policy!r} v{version} is live and there is no previous live version "
                                    "to restore; promote another version to live instead")
            await self._serve(policy, rollout.previous_live)
        record = await self._write(self.registry.move, policy, version, State.ROLLED_BACK, who=who, why=why)
        await self._after_change(policy)
        log.warning("policy %s v%d rolled back by %s: %s", policy, version, who, why)
        return record

    async def pin(self, policy: str, selector: str, version: int | None, *, who: str, why: str) -> Rollout:
        """Hold the sessions of `selector` ("session=<id>" or a label "<key>=<value>") on `version` (None: unpin)."""
        async with self._lock:
            return await self._pin(policy, selector, version, who=who, why=why)

    async def _pin(self, policy: str, selector: str, version: int | None, *, who: str, why: str) -> Rollout:
        if version is not None:
            record = self.registry.get(policy, version)
            if record.state in WITHDRAWN:
                raise RegistryError(f"policy {policy!r} v{version} is {record.state}; it cannot be pinned")
            await self._serve(policy, version)
        rollout = await self._write(self.registry.pin, policy, selector, version, who=who, why=why)
        self._refresh(policy)
        if version is None and policy not in self._gating:
            await self._reconcile(policy)
        return rollout

    async def set_canary(self, policy: str, *, fraction: float | None = None, labels: dict | None = None,
                         who: str, why: str) -> Rollout:
        async with self._lock:
            rollout = await self._write(self.registry.set_canary, policy, fraction=fraction, labels=labels, who=who,
                                        why=why)
            self._refresh(policy)
            return rollout

    async def pin_session(self, session_id: str, version: int) -> None:
        """The gate's evaluation: hold `session_id` on `version` of the policy being gated (audit who "gate").
        Its transitions are not logged: a candidate's evaluation episodes are no training data."""
        policy = self._gating_policy()
        self.evaluating.add(session_id)
        async with self._lock:  # the gate runs without the lock: its pins take it like any other move
            await self._pin(policy, f"session={session_id}", version, who="gate", why="evaluation in simulation")

    async def unpin_session(self, session_id: str) -> None:
        policy = self._gating_policy()
        self.evaluating.discard(session_id)
        async with self._lock:
            if f"session={session_id}" in self._rollout(policy).pins:
                await self._pin(policy, f"session={session_id}", None, who="gate", why="evaluation done")

    def _format_on_disk(self, name: str, version: int) -> str:
        imported = self._repo.imported_format(name, version) if self._repo is not None else None
        return imported or "torchscript"

    def declared(self, policy: str, action_spec: tuple[Spec, ...], *, identity: str | None, source: str = "") -> None:
        """A session's declared action spec (with its bounds), under its proven identity (else its peer and
        source): the gate's action sanity checks against the tightest of them (bridge.gateway.declared_bounds)."""
        self.bounds.declare(policy, action_spec, identity=identity, source=source)

    def action_spec(self, policy: str, served: ServedPolicy) -> tuple[Spec, ...]:
        """What the gate judges actions against: the served outputs with the bounds sessions declared."""
        from bridge.gate import with_bounds

        outputs = tuple(s for s in served.outputs if s.name != LOG_PROB)
        return with_bounds(outputs, self.bounds.specs(policy))

    def _gating_policy(self) -> str:
        if len(self._gating) != 1:
            raise RegistryError(f"pin_session is for the gate's evaluation; policies in the gate now: "
                                f"{sorted(self._gating)}")
        return next(iter(self._gating))

    def _check_move(self, policy: str, version: int, to: State) -> None:
        record = self.registry.get(policy, version)
        if to not in MOVES[record.state]:
            allowed = ", ".join(sorted(MOVES[record.state])) or "nothing: it is final"
            raise RegistryError(f"policy {policy!r} v{version} is {record.state}; it may not move to {to} "
                                f"(allowed: {allowed})")

    async def _after_change(self, policy: str) -> None:
        rollout = self._refresh(policy)
        if rollout.live is not None:
            await self._catalog.promote(policy, rollout.live)
        await self._reconcile(policy)

    # -- judging and advancing -----------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.plan.tick_s)
            for name in list(self._rollouts):
                try:
                    async with self._lock:
                        await self._advance(name)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # reported, and tried again at the next tick
                    message = f"rollout {name}: {type(exc).__name__}: {exc}"
                    if not self.errors or self.errors[-1] != message:
                        log.error("%s", message)
                        self.errors = [*self.errors[-99:], message]

    async def _advance(self, name: str) -> None:
        """One judging round: roll back a regressed canary (or live, when staged); move a shadow that
        has its steps to canary and a canary that has its episodes to live; unload what nobody needs."""
        r, plan = self._rollout(name), self.plan
        monitor = self.router.monitor(name)
        if r.canary is not None and r.live is not None:
            verdict = monitor.verdict(r.canary, r.live)
            if verdict.regressed:
                await self._rollback(name, r.canary, who="auto", why=f"canary regressed: {verdict.reason}")
                return
            episodes = self.stats.get(name, r.canary)["episodes"]
            if plan.mode == "staged" and episodes >= plan.canary_episodes and verdict.judged:
                self._probation[name] = r.canary
                await self._write(self.registry.move, name, r.canary, State.LIVE, who="auto",
                                  why=f"canary: {episodes} episodes, {verdict.reason}")
                await self._after_change(name)
                return
        if plan.mode == "staged" and r.live is not None and r.live == self._probation.get(name) \
                and r.previous_live is not None:  # a live version restored by a rollback is not judged again
            verdict = monitor.verdict(r.live, r.previous_live)
            if verdict.regressed:
                await self._rollback(name, r.live, who="auto", why=f"live regressed: {verdict.reason}")
                return
        if plan.mode == "staged" and r.shadow is not None and r.canary is None:
            figures = self.stats.get(name, r.shadow)
            if figures["shadow_steps"] >= plan.shadow_steps:
                await self._write(self.registry.set_canary, name, fraction=plan.canary_fraction,
                                  labels=dict(plan.canary_labels), who="auto", why="rollout staged")
                await self._write(self.registry.move, name, r.shadow, State.CANARY, who="auto",
                                  why=f"shadow: {figures['shadow_steps']} steps, mean action divergence "
                                      f"{figures['shadow_divergence']:.4g}")
                self._refresh(name)
                return
        if name not in self._gating:
            await self._reconcile(name)

    # -- what Triton serves --------------------------------------------------------------------------------------

    def _needed(self, name: str, rollout: Rollout) -> set[int]:
        return {v for v in (rollout.live, rollout.previous_live, rollout.canary, rollout.shadow,
                            *rollout.pins.values(), self._gating.get(name), self._gate_base.get(name)) if v is not None}

    def _retire(self, repo: ModelRepository, name: str, keep: set[int]) -> list[int]:
        retired = [v for v in repo.versions(name) if v not in keep]
        for version in retired:
            repo.retire(name, version)
            log.info("policy %s v%d unloaded: no session acts with it and the rollout does not need it", name,
                     version)
        return retired

    async def _reconcile(self, name: str) -> None:
        """Unload the versions nobody needs; verify Triton serves exactly what is on disk."""
        if self._repo is None:
            return
        keep = self._needed(name, self._rollout(name)) | self._in_use(name)
        if not await asyncio.to_thread(self._retire, self._repo, name, keep):  # renames + fsyncs: off the loop
            return
        await self._control.load_model(name)
        await self._verify_ready(name)

    async def _verify_ready(self, name: str) -> list[int]:
        expected = self._repo.versions(name)
        ready = await self._control.ready_versions(name)
        if ready != expected:
            raise SwapFailed(f"policy {name!r}: Triton serves versions {ready} after load_model, the repository "
                             f"holds {expected}")
        return ready

    async def _serve(self, name: str, version: int) -> None:
        """Make sure `version` is READY (restoring a retired folder, loading it, checking its fingerprint)."""
        ready = await self._control.ready_versions(name)
        if version not in ready:
            if self._repo is None:
                raise SwapFailed(f"policy {name!r} v{version} is not served by Triton (ready: {ready}) and this "
                                 "gateway has no model repository to load it from")
            await asyncio.to_thread(restore_version, self._repo, name, version)
            await self._control.load_model(name)
            ready = await self._verify_ready(name)
            if version not in ready:
                raise SwapFailed(f"policy {name!r} v{version} is not READY after load_model (ready: {ready})")
            served = await self._catalog.ensure(name, version)
            await self._fingerprint.verify(self._repo, served)
        await self._catalog.ensure(name, version)

    # -- reads ---------------------------------------------------------------------------------------------------

    def _rollout(self, name: str) -> Rollout:
        rollout = self._rollouts.get(name)
        return rollout if rollout is not None else self._refresh(name)

    def _refresh(self, name: str) -> Rollout:
        try:
            rollout = self.registry.rollout(name)
        except RegistryError:
            rollout = Rollout(name, None, None, None, None, 0.0, {}, {})
        self.router.set(rollout)
        return rollout

    def rollouts(self) -> dict[str, Rollout]:
        return dict(self._rollouts)

    def version_stats(self, policy: str) -> dict[int, dict]:
        """Per version: steps, episodes, mean_return, latency_p50_ms/p99_ms, errors, guard_interventions,
        shadow_steps, shadow_errors, shadow_divergence (mean abs action difference vs the acting version)."""
        return self.stats.table(policy)

    def freshness(self) -> dict:
        """Per session and per policy (fleet): how far the acting version is behind the trainer's newest
        version (versions) and for how long the newest has existed while an older one acts (seconds)."""
        now = time.time_ns()
        newest = {name: self._newest_of(name) for name in self._rollouts}
        sessions = {}
        for s in self._sessions():
            top = newest.get(s.policy.name)
            if top is None:
                continue
            lag = max(0, top[0] - s.policy.version)
            sessions[s.id] = {"policy": s.policy.name, "version": s.policy.version, "newest": top[0],
                              "version_lag": lag, "time_lag_s": (now - top[1]) / 1e9 if lag else 0.0}
        fleet = {}
        for name, top in newest.items():
            if top is None:
                continue
            rows = [v for v in sessions.values() if v["policy"] == name]
            fleet[name] = {"newest": top[0], "live": self._rollouts[name].live, "sessions": len(rows),
                           "max_version_lag": max((r["version_lag"] for r in rows), default=0),
                           "mean_version_lag": float(np.mean([r["version_lag"] for r in rows])) if rows else 0.0,
                           "max_time_lag_s": max((r["time_lag_s"] for r in rows), default=0.0)}
        return {"sessions": sessions, "policies": fleet}

    def _newest_of(self, name: str) -> tuple[int, int] | None:
        if name not in self._newest:
            records = [r for r in self.registry.versions(name) if r.state is not State.REJECTED]
            self._newest[name] = (records[-1].version, records[-1].created_ns) if records else None
        return self._newest[name]

    async def _write(self, fn, *args, **kwargs):
        """A registry change off the event loop (it fsyncs): sessions keep being answered meanwhile."""
        return await asyncio.to_thread(fn, *args, **kwargs)


def _header_specs(header: policies_pb2.PublishHeader) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
    try:
        return specs_from_proto(header.inputs), specs_from_proto(header.outputs)
    except TensorError as exc:
        raise PublishError(f"the specs in the header: {exc}") from exc


def _hex(digest: str) -> str:
    digest = digest.lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise PublishError(f"sha256 {digest!r} in the header is not 64 hex digits")
    return digest
