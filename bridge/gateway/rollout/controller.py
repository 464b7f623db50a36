"""The life of a policy version in the gateway, from Publish to live (or out), and which version
each session acts with.

    Publish ─▶ candidate ─(gate: integrity; write folder + load_model + READY; consistency,
               evaluation, action sanity)─▶ gated ─┬─ direct ─▶ live
                                                   └─ staged ─▶ shadow (N steps, never actuated)
                                                                ─▶ canary (a fraction or labels, K episodes)
                                                                ─▶ live, or rolled_back (automatic, why audited)
    any failed check ─▶ rejected (folder retired, unloaded; the live version keeps serving)

    rollout = RolloutController(registry=registry, catalog=catalog, control=client, batcher=batcher,
                                publisher=publisher, repository=repo, plan=RolloutPlan(mode="staged"), gate=gate,
                                in_use=lambda policy: {3})
    await rollout.start(["hopper"])             # restore after a restart, register what Triton serves
    reply = await rollout.publish(header, upload, who="trainer:ppo@host")
    rollout.acting("hopper", "arm_2", {"robot": "arm_2"})     # the ServedPolicy this session acts with
    await rollout.promote("hopper", 4, State.CANARY, who="operator:alice", why="try it", fraction=0.1)
    await rollout.rollback("hopper", who="operator:alice", why="jerky")   # the live one; the previous is back
    await rollout.pin("hopper", "robot=arm_2", 3, who="operator:alice", why="hold arm_2")
    rollout.version_stats("hopper"), rollout.freshness()
    await rollout.stop()

The controller wires the pieces and carries out their moves:
    bridge.registry (model.move_refused)   which state may move to which: the rules, once
    rollout_publish.PublishPipeline        number, gate, write, load, verify a new version; enter it in the plan
    rollout_decide.decide                  pure: rollout + what sessions showed -> roll back / go live / canary / hold
    rollout_serving.ServingReconciler      Triton's loaded versions vs the ones the rollout needs
    rollout_router.RolloutRouter           the hot path: which version a session acts with, its stats
    rollout_views.Freshness                read model: sessions' lag behind the newest version

Locking: every change of state takes the rollout lock for a short move (registry commit, load/unload,
verification), never for a gate check. A publish holds the gate lock (one candidate in the gate at a
time) and the rollout lock only to number its version, to swap its folder in (write, load_model,
READY) and, after the gate, to re-check and enter the plan: an operator's Rollback, Promote or Pin,
and the judging loop's automatic rollback, go through while a candidate is being evaluated. A
candidate whose incumbent was withdrawn during its gate (an operator or the judging loop rolled it
back) is rejected (`GateSuperseded`, ABORTED): it was judged against a version no longer live; one
whose incumbent went on in an ordinary way (a canary went live) goes on, judged by its plan.

Several gateways on one PostgreSQL registry (bridge.gateway.rollout.follow): each follows the epoch the others
commit (`follow`: the rollouts re-read in one snapshot, their versions served, sessions routed by them); only the
one holding the leader lock judges and advances the plan, rolls back automatically, rejects candidates a crash
interrupted and reconciles what Triton serves. While the database is unreachable the last rollouts read keep
serving and changes are refused (RegistryUnavailable: UNAVAILABLE) at once or within a probe's timeout
(bridge.registry.view.check), never a hang; no read of the shared registry runs on the event loop while sessions
step (the leader's reconcile reads in a thread, one at a time).

Size: ~520 lines, one class on purpose. The rules and mechanics already live in the modules named above; what
is left here is carrying out their moves under the one rollout lock (start/restore, operator moves, the judging
loop, reconcile), and splitting it would spread that lock's invariants over several classes.

Every change of state goes through the registry (an audit event with who/why). Versions nobody
needs (not live, previous live, canary, shadow or pinned, and no session acting with them) are
retired from the repository and unloaded; after every load or unload the controller checks what
Triton serves (the READY list, and for restored versions an output fingerprint): a swap that did
not take effect raises `SwapFailed`, it is never silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from bridge.gateway.rollout.bounds import DeclaredBounds
from bridge.gateway.rollout.config import RolloutPlan
from bridge.gateway.rollout.decide import Action, Observed, decide
from bridge.gateway.rollout.follow import SharedRollout
from bridge.gateway.rollout.publish import PublishPipeline
from bridge.gateway.rollout.router import RolloutRouter
from bridge.gateway.rollout.serving import ServingReconciler, needed
from bridge.gateway.rollout.views import Freshness
from bridge.gateway.session.batcher import MicroBatcher
from bridge.gateway.versions.catalog import LOG_PROB, PolicyCatalog, ServedPolicy
from bridge.gateway.versions.publisher import Publisher
from bridge.gateway.versions.uploads import Upload
from bridge.gateway.versions.verify import SwapFailed, spec_dicts
from bridge.registry import (
    WITHDRAWN,
    DuplicateVersion,
    Registry,
    RegistryError,
    RegistryUnavailable,
    Rollout,
    State,
    VersionRecord,
    move_refused,
)
from bridge.registry.view import CHECK_TIMEOUT_S, view_of
from inference_server import ModelRepository, PolicyClient
from protos import policies_pb2
from protos.codec import Spec

log = logging.getLogger("tether.gateway")


class RolloutController:
    """See the module docstring. Changes run under one lock, held only for short moves (never
    through a gate check); the hot path (`acting`, `stepped`, `episode_ended`) reads cached
    rollouts and never waits for the registry or Triton."""

    def __init__(self, *, registry: Registry, catalog: PolicyCatalog, control: PolicyClient, batcher: MicroBatcher,
                 publisher: Publisher, repository: ModelRepository | None, plan: RolloutPlan,
                 in_use: Callable[[str], set[int]], gate=None, sessions: Callable[[], list] = list):
        self.registry, self.plan, self.gate = registry, plan, gate
        self._catalog, self._control, self._batcher = catalog, control, batcher
        self._publisher, self._in_use, self._sessions = publisher, in_use, sessions
        self.lock = asyncio.Lock()  # short state moves (registry, repository, Triton's loaded versions)
        self.router = RolloutRouter(catalog=catalog, batcher=batcher, thresholds=plan.thresholds)
        self.stats, self._rollouts = self.router.stats, self.router.rollouts_now
        # sessions talk to the router directly (the VersionRouter role): no hop through the controller
        self.acting, self.stepped = self.router.acting, self.router.stepped
        self.episode_ended = self.router.episode_ended
        self.fresh = Freshness(registry, view=view_of(registry) if registry.shared else None)  # sessions' lag
        self._probation: dict[str, int] = {}            # policy -> the live version judged vs the previous one
        self.bounds = DeclaredBounds()                  # the action bounds sessions declared, by who declared them
        self.evaluating: set[str] = set()               # the gate's evaluation sessions (pinned, not logged)
        self.serving = ServingReconciler(control=control, catalog=catalog, repository=repository)
        self._publishing = PublishPipeline(host=self, registry=registry, catalog=catalog, publisher=publisher)
        self._loop_task: asyncio.Task | None = None
        self.errors: list[str] = []                     # background failures (also logged)
        # a shared registry: the epoch other gateways commit, and the one leader (bridge.gateway.rollout.follow)
        self.shared = SharedRollout(registry, catch_up=self.follow, router=self.router)
        self._keep_read: asyncio.Future | None = None   # the leader's reconcile read of a shared registry, in flight

    # -- start, stop, restore ------------------------------------------------------------------------------------

    async def start(self, policies: list[str]) -> None:
        """Bring the registry and Triton into agreement for `policies` (plus every policy the registry
        knows): versions Triton serves that the registry lacks are registered (the newest as live);
        live/previous live/canary/shadow/pinned versions are loaded and verified; candidates a
        crash interrupted are rejected; the rest is unloaded. Then the judging loop starts."""
        await self.shared.start()  # a shared registry: the leader lock tried first (a follower writes less below)
        names = sorted(set(policies) | set(self.registry.policies()))
        async with self.lock:
            for name in names:
                await self._restore(name)
        self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="rollout")

    @property
    def leading(self) -> bool:
        """Whether this gateway judges, rolls back and reconciles (always, unless another gateway on the same
        PostgreSQL registry holds the leader lock)."""
        return self.shared.leading

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
            async with self.lock:
                if policy not in self._rollouts:
                    await self._restore(policy)

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        await self.shared.stop()
        await self.router.stop()

    async def follow(self) -> int | None:
        """Another gateway committed (or the database came back): re-read the rollouts of the policies served
        here in one snapshot and serve them (versions made READY, sessions routed by them); the epoch read, or
        None while the registry is unreachable (the last rollouts keep serving)."""
        async with self.lock:  # after this gateway's own moves, never between one and its refresh
            try:
                epoch, rollouts = await asyncio.to_thread(self.registry.snapshot, list(self._rollouts))
            except RegistryUnavailable as exc:
                log.warning("rollout: %s; serving the rollouts read before", exc)
                return None
            for name, rollout in rollouts.items():
                if rollout == self._rollouts.get(name):
                    continue
                for version in sorted(self._needed(name, rollout)):
                    try:
                        await self.serving.serve(name, version)
                    except Exception as exc:  # noqa: BLE001 (routed anyway: the registry is the truth; logged)
                        log.error("rollout %s: v%d of epoch %d cannot be served here: %s", name, version, epoch, exc)
                before = self._rollouts.get(name)
                self.router.set(rollout)
                if rollout.live is not None:
                    await self._catalog.promote(name, rollout.live)
                if rollout.live is not None and (before is None or before.live != rollout.live):
                    await self._on_probation(name, rollout.live)
                log.info("rollout %s follows epoch %d: live v%s, canary v%s, shadow v%s", name, epoch, rollout.live,
                         rollout.canary, rollout.shadow)
            return epoch

    async def _restore(self, name: str) -> None:
        ready = await self.serving.ready(name)
        known = {r.version: r for r in self.registry.versions(name)}
        has_live = any(r.state is State.LIVE for r in known.values())
        for version in sorted((v for v in ready if v not in known), reverse=True):
            if has_live:  # an older stray version: not registered, unloaded below (its folder kept in .retired)
                log.warning("rollout: %s v%d serves but is not in the registry, which has a live version: it is "
                            "unloaded", name, version)
                continue
            served = await self._catalog.ensure(name, version)
            with contextlib.suppress(DuplicateVersion):  # another gateway on a shared registry registered it first
                await self._write(self.registry.add, name, version, sha256=self.serving.sha256(name, version),
                                  format=self.serving.format_on_disk(name, version), lineage={},
                                  inputs=spec_dicts(served.inputs),
                                  outputs=spec_dicts(served.outputs), who="gateway", why="serving at start",
                                  state=State.LIVE)
            has_live = True
        for record in self.registry.versions(name) if self.leading else ():  # another gateway's may be in its gate
            if record.state is State.CANDIDATE:
                await self._write(self.registry.move, name, record.version, State.REJECTED, who="gateway",
                                  why="its gate was interrupted by a gateway restart")
        rollout = self.refresh(name)
        for version in sorted(self._needed(name, rollout)):
            try:
                await self.serving.serve(name, version)
            except SwapFailed as exc:  # without its live version the policy cannot serve: that stops the start
                if version == rollout.live:
                    raise
                log.error("rollout %s: v%d (%s) cannot be served: %s", name, version,
                          self.registry.get(name, version).state, exc)
        if rollout.live is not None:
            await self._catalog.promote(name, rollout.live)
        for record in self.registry.versions(name) if self.leading else ():  # gated before a restart: goes on
            if record.state is State.GATED:
                await self.serving.serve(name, record.version)
                await self.enter_plan(name, record.version)
        await self.reconcile(name)
        log.info("rollout %s restored: live v%s, canary v%s (fraction %g, labels %s), shadow v%s, pins %s", name,
                 rollout.live, rollout.canary, rollout.canary_fraction, rollout.canary_labels, rollout.shadow,
                 rollout.pins)

    # -- publish (bridge.gateway.rollout.publish) ---------------------------------------------------------------

    async def publish(self, header: policies_pb2.PublishHeader, upload: Upload, *,
                      who: str | None = None) -> policies_pb2.PublishReply:
        """Register, gate, write, load, verify and roll out one new version (PublishPipeline.publish);
        `upload`: its bytes, streamed to disk (bridge.gateway.versions.uploads)."""
        return await self._publishing.publish(header, upload, who=who)

    def numbered(self, name: str, version: int) -> None:
        self.fresh.numbered(name, version)

    def withdrawn(self, name: str) -> None:
        self.fresh.withdrawn(name)

    async def enter_plan(self, name: str, version: int) -> None:
        """A gated version enters the plan: live at once (direct, or the policy's first version), else shadow."""
        if self.plan.mode == "direct" or self.rollout(name).live is None:  # a first version protects nothing
            why = "rollout direct" if self.plan.mode == "direct" else "the policy's first version"
            await self._write(self.registry.move, name, version, State.LIVE, who="auto", why=why)
            await self._catalog.promote(name, version)
        else:
            rollout = self.rollout(name)
            if rollout.shadow is not None:
                await self._write(self.registry.move, name, rollout.shadow, State.RETIRED, who="auto",
                                  why=f"superseded by v{version}")
            await self._write(self.registry.move, name, version, State.SHADOW, who="auto",
                              why=f"rollout staged: shadow for {self.plan.shadow_steps} steps")
        self.refresh(name)

    # -- operator actions (RPCs, console) ------------------------------------------------------------------------

    async def promote(self, policy: str, version: int, to: State, *, who: str, why: str,
                      fraction: float | None = None, labels: dict | None = None) -> VersionRecord:
        to = State(to)
        if to not in (State.SHADOW, State.CANARY, State.LIVE):
            raise RegistryError(f"promote moves a version to shadow, canary or live, not {to}")
        await self._reachable(f"promote of {policy} v{version}")
        async with self.lock:
            await asyncio.to_thread(self._check_move, policy, version, to)
            await self.serving.serve(policy, version)
            if to is State.CANARY and (fraction is not None or labels is not None):
                await self._write(self.registry.set_canary, policy, fraction=fraction, labels=labels, who=who, why=why)
            if to is State.SHADOW and (shadow := self.rollout(policy).shadow) not in (None, version):
                await self._write(self.registry.move, policy, shadow, State.RETIRED, who=who,
                                  why=f"superseded by v{version}")
            record = await self._write(self.registry.move, policy, version, to, who=who, why=why)
            if to is State.LIVE:
                self._probation[policy] = version
            await self._after_change(policy)
            return record

    async def rollback(self, policy: str, version: int | None = None, *, who: str, why: str) -> VersionRecord:
        """Roll back `version` (None: the live one, and the previous live version is live again)."""
        await self._reachable(f"rollback of {policy}")
        async with self.lock:
            return await self._rollback(policy, version, who=who, why=why)

    async def _on_probation(self, name: str, live: int) -> None:
        """Another gateway made `live` live: judged vs the previous live version (by whichever gateway leads),
        unless a rollback restored it (the registry's "restored: ..." move)."""
        try:
            events = await asyncio.to_thread(self.registry.latest_events, name, limit=50)
        except RegistryError:
            return
        entered = [e for e in events if e.kind == "state" and e.version == live and e.to_state == str(State.LIVE)]
        if entered and not entered[-1].why.startswith("restored:"):
            self._probation[name] = live
        else:
            self._probation.pop(name, None)

    async def _rollback(self, policy: str, version: int | None, *, who: str, why: str) -> VersionRecord:
        rollout = self.rollout(policy)
        version = rollout.live if version is None else version
        if version is None:
            raise RegistryError(f"policy {policy!r} has no live version to roll back")
        await asyncio.to_thread(self._check_move, policy, version, State.ROLLED_BACK)
        if version == rollout.live:
            await self.serving.serve(policy, rollout.previous_live)
        record = await self._write(self.registry.move, policy, version, State.ROLLED_BACK, who=who, why=why)
        await self._after_change(policy)
        log.warning("policy %s v%d rolled back by %s: %s", policy, version, who, why)
        return record

    async def pin(self, policy: str, selector: str, version: int | None, *, who: str, why: str) -> Rollout:
        """Hold the sessions of `selector` ("session=<id>" or a label "<key>=<value>") on `version` (None: unpin)."""
        await self._reachable(f"pin of {policy} {selector}")
        async with self.lock:
            return await self._pin(policy, selector, version, who=who, why=why)

    async def _pin(self, policy: str, selector: str, version: int | None, *, who: str, why: str) -> Rollout:
        if version is not None:
            record = await asyncio.to_thread(self.registry.get, policy, version)
            if record.state in WITHDRAWN:
                raise RegistryError(f"policy {policy!r} v{version} is {record.state}; it cannot be pinned")
            await self.serving.serve(policy, version)
        rollout = await self._write(self.registry.pin, policy, selector, version, who=who, why=why)
        self.refresh(policy)
        if version is None and policy not in self._publishing.gating:
            await self.reconcile(policy)
        return rollout

    async def set_canary(self, policy: str, *, fraction: float | None = None, labels: dict | None = None,
                         who: str, why: str) -> Rollout:
        await self._reachable(f"canary of {policy}")
        async with self.lock:
            rollout = await self._write(self.registry.set_canary, policy, fraction=fraction, labels=labels, who=who,
                                        why=why)
            self.refresh(policy)
            return rollout

    async def pin_session(self, session_id: str, version: int) -> None:
        """The gate's evaluation: hold `session_id` on `version` of the policy being gated (audit who "gate").
        Its transitions are not logged: a candidate's evaluation episodes are no training data."""
        policy = self._gating_policy()
        self.evaluating.add(session_id)
        async with self.lock:  # the gate runs without the lock: its pins take it like any other move
            await self._pin(policy, f"session={session_id}", version, who="gate", why="evaluation in simulation")

    async def unpin_session(self, session_id: str) -> None:
        policy = self._gating_policy()
        self.evaluating.discard(session_id)
        async with self.lock:
            if f"session={session_id}" in self.rollout(policy).pins:
                await self._pin(policy, f"session={session_id}", None, who="gate", why="evaluation done")

    def declared(self, policy: str, action_spec: tuple[Spec, ...], *, identity: str | None, source: str = "") -> None:
        """A session's declared action spec (with its bounds), under its proven identity (else its peer and
        source): the gate's action sanity checks against the tightest of them (bridge.gateway.rollout.bounds)."""
        self.bounds.declare(policy, action_spec, identity=identity, source=source)

    def action_spec(self, policy: str, served: ServedPolicy) -> tuple[Spec, ...]:
        """What the gate judges actions against: the served outputs with the bounds sessions declared."""
        from bridge.gate import with_bounds

        outputs = tuple(s for s in served.outputs if s.name != LOG_PROB)
        return with_bounds(outputs, self.bounds.specs(policy))

    def _gating_policy(self) -> str:
        if len(self._publishing.gating) != 1:
            raise RegistryError(f"pin_session is for the gate's evaluation; policies in the gate now: "
                                f"{sorted(self._publishing.gating)}")
        return next(iter(self._publishing.gating))

    def _check_move(self, policy: str, version: int, to: State) -> None:
        """The registry's rules (bridge.registry.move_refused), checked before anything is loaded."""
        state = self.registry.get(policy, version).state
        previous = self.rollout(policy).previous_live if state is State.LIVE else None
        if (refused := move_refused(policy, version, state, to, previous_live=previous)) is not None:
            raise RegistryError(refused)

    async def _after_change(self, policy: str) -> None:
        rollout = self.refresh(policy)
        if rollout.live is not None:
            await self._catalog.promote(policy, rollout.live)
        await self.reconcile(policy)

    # -- judging and advancing -----------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.plan.tick_s)
            if not self.leading:  # another gateway on the shared registry judges and reconciles
                continue
            for name in list(self._rollouts):
                try:
                    async with self.lock:
                        await self._advance(name)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # reported, and tried again at the next tick
                    message = f"rollout {name}: {type(exc).__name__}: {exc}"
                    if not self.errors or self.errors[-1] != message:
                        log.error("%s", message)
                        self.errors = [*self.errors[-99:], message]

    async def _advance(self, name: str) -> None:
        """One judging round: `decide` (bridge.gateway.rollout.decide) on what the sessions showed, then its move
        carried out; on a hold, unload what nobody needs."""
        r = self.rollout(name)
        move = decide(r, self._observed(name, r), plan=self.plan, probation=self._probation.get(name))
        if move.action is Action.ROLL_BACK:
            await self._rollback(name, move.version, who="auto", why=move.why)
        elif move.action is Action.GO_LIVE:
            self._probation[name] = move.version
            await self._write(self.registry.move, name, move.version, State.LIVE, who="auto", why=move.why)
            await self._after_change(name)
        elif move.action is Action.START_CANARY:
            await self._write(self.registry.set_canary, name, fraction=self.plan.canary_fraction,
                              labels=dict(self.plan.canary_labels), who="auto", why="rollout staged")
            await self._write(self.registry.move, name, move.version, State.CANARY, who="auto", why=move.why)
            self.refresh(name)
        elif name not in self._publishing.gating:
            await self.reconcile(name)

    def _observed(self, name: str, r: Rollout) -> Observed:
        """What `decide` judges: the monitor's verdicts and the per-version counts (no I/O: in-memory windows)."""
        monitor, judged = self.router.monitor(name), r.canary is not None and r.live is not None
        # reading a version's stats makes its row: only the rows decide can use (a staged shadow with no canary)
        shadow = self.stats.get(name, r.shadow) if self.plan.mode == "staged" and r.shadow is not None \
            and r.canary is None else {}
        return Observed(
            canary=monitor.verdict(r.canary, r.live) if judged else None,
            live=monitor.verdict(r.live, r.previous_live) if r.live is not None and r.previous_live is not None
            else None,
            canary_episodes=int(self.stats.get(name, r.canary)["episodes"]) if judged else 0,
            shadow_steps=int(shadow.get("shadow_steps", 0)), shadow_divergence=shadow.get("shadow_divergence", 0.0))

    # -- what Triton serves (bridge.gateway.rollout.serving) -------------------------------------------------------

    def _needed(self, name: str, rollout: Rollout) -> set[int]:
        return needed(rollout, self._publishing.gating.get(name), self._publishing.gate_base.get(name))

    def keep(self, name: str, versions: list[VersionRecord] | None = None) -> set[int]:
        """The versions of `name` that stay on disk: the rollout's, the gate's, and those sessions act with (on a
        shared registry also every candidate or gated version: another gateway's publish may be gating it)."""
        keep = self._needed(name, self.rollout(name)) | self._in_use(name)
        if self.registry.shared:  # and those other gateways' sessions stepped with lately
            records = self.registry.versions(name) if versions is None else versions  # `versions`: read already
            keep |= {r.version for r in records if r.state in (State.CANDIDATE, State.GATED)}
            keep |= self.shared.in_use_elsewhere(name)
        return keep

    async def reconcile(self, name: str) -> None:
        """Unload the versions nobody needs; verify what Triton serves (the leader only, on a shared registry)."""
        if self.leading:
            keep = await self._keep_off_loop(name) if self.registry.shared else self.keep(name)
            await self.serving.reconcile(name, keep)

    async def _keep_off_loop(self, name: str) -> set[int]:
        """`keep`, its read of the registry in a thread, one at a time: RegistryUnavailable while the one before has
        not been answered or this one is not within CHECK_TIMEOUT_S (nothing is unloaded then)."""
        pending = self._keep_read
        if pending is not None and not pending.done():
            raise RegistryUnavailable(f"registry unreachable: {self.registry.where}: the reconcile of {name} waits "
                                      "for the database's answer to the one before")
        pending = self._keep_read = asyncio.get_running_loop().run_in_executor(None, self.registry.versions, name)
        pending.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            return self.keep(name, await asyncio.wait_for(asyncio.shield(pending), CHECK_TIMEOUT_S))
        except TimeoutError:
            raise RegistryUnavailable(f"registry unreachable: {self.registry.where}: the reconcile of {name} had no "
                                      f"answer within {CHECK_TIMEOUT_S:g} s") from None

    async def _reachable(self, what: str) -> None:
        """A shared registry's probe before an operator's change: RegistryUnavailable at once (or within the probe's
        timeout) while the database does not answer, before anything is sent (bridge.registry.view)."""
        if self.registry.shared:
            await view_of(self.registry).check(what)

    # -- reads ---------------------------------------------------------------------------------------------------

    def rollout(self, name: str) -> Rollout:
        rollout = self._rollouts.get(name)
        return rollout if rollout is not None else self.refresh(name)

    def refresh(self, name: str) -> Rollout:
        try:
            rollout = self.registry.rollout(name)
        except RegistryUnavailable:  # the database is away: the rollout read before keeps serving
            cached = self._rollouts.get(name)
            if cached is None:
                raise
            return cached
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
        return self.fresh.report(self._rollouts, self._sessions())

    async def _write(self, fn, *args, **kwargs):
        """A registry change off the event loop (it fsyncs): sessions keep being answered meanwhile."""
        return await asyncio.to_thread(fn, *args, **kwargs)
