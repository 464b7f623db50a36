"""The rollout's publish pipeline: one new version numbered and registered, gated, written, loaded, verified and
entered into the plan, or rejected and withdrawn (the live version keeps serving throughout).

    pipeline = PublishPipeline(host=controller, registry=registry, catalog=catalog, publisher=publisher)
    reply = await pipeline.publish(header, upload, who="trainer:ppo@host")   # PublishError / VerificationFailed /
                                                                          # GateSuperseded when refused
    pipeline.gating          # {policy: the version in the gate now}, pipeline.gate_base: its architecture's base

Locking: the pipeline holds its gate lock for a whole publish (one candidate in the gate at a time) and the host's
rollout lock only to number the version, to swap its folder in (write, load_model, READY) and, after the gate, to
re-check and enter the plan; the gate's served checks (an evaluation in simulation: tens of seconds) run without it,
so an operator's Rollback, Promote or Pin go through meanwhile. A candidate whose incumbent stopped being live during
its gate in a withdrawn way (rolled back) is rejected (`GateSuperseded`); one whose incumbent went on in an ordinary
way (a canary went live) goes on, with a note. The host (the RolloutController) is reached through `PlanHost`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from google.protobuf import json_format

from bridge.gateway.errors import UnknownPolicy
from bridge.gateway.rollout.serving import ServingReconciler
from bridge.gateway.versions.catalog import PolicyCatalog, ServedPolicy
from bridge.gateway.versions.publisher import GateSuperseded, Publisher, PublishError, VerificationFailed
from bridge.gateway.versions.uploads import Upload
from bridge.gateway.versions.verify import spec_dicts
from bridge.registry import WITHDRAWN, Registry, Rollout, State
from protos import policies_pb2
from protos.codec import Spec, TensorError, specs_from_proto

log = logging.getLogger("tether.gateway")


class PlanHost(Protocol):
    """What the pipeline needs of the rollout controller: its lock (short moves), the cached rollout, the versions
    that stay on disk, the plan a gated version enters, the serving reconciler, and the gate."""

    lock: asyncio.Lock
    serving: ServingReconciler
    gate: object

    def rollout(self, name: str) -> Rollout: ...
    def refresh(self, name: str) -> Rollout: ...
    def keep(self, name: str) -> set[int]: ...
    def action_spec(self, policy: str, served: ServedPolicy) -> tuple[Spec, ...]: ...
    def numbered(self, name: str, version: int) -> None: ...
    def withdrawn(self, name: str) -> None: ...
    async def enter_plan(self, name: str, version: int) -> None: ...
    async def reconcile(self, name: str) -> None: ...


class PublishPipeline:
    """See the module docstring."""

    def __init__(self, *, host: PlanHost, registry: Registry, catalog: PolicyCatalog, publisher: Publisher):
        self._host, self._registry, self._catalog, self._publisher = host, registry, catalog, publisher
        self._gate_lock = asyncio.Lock()  # one candidate in the gate at a time; operators never wait for it
        self.gating: dict[str, int] = {}     # policy -> the version in the gate now
        self.gate_base: dict[str, int] = {}  # policy -> the version whose architecture it builds on

    async def publish(self, header: policies_pb2.PublishHeader, upload: Upload, *,
                      who: str | None = None) -> policies_pb2.PublishReply:
        """Register, gate, write, load, verify and roll out one new version (see the module docstring);
        `upload`: its bytes on disk (bridge.gateway.versions.uploads).
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
            async with self._host.lock:  # short: number the version and register it
                rollout = self._host.rollout(name)
                base = rollout.live if rollout.live is not None else current.version if current is not None else None
                known = [r.version for r in self._registry.versions(name)]
                version = max([0, *repo.versions(name), *repo.retired_versions(name), *known, base or 0]) + 1
                inputs, outputs = (current.inputs, current.outputs) if current is not None else _header_specs(header)
                await self._write(self._registry.add, name, version, sha256=_hex(header.sha256),
                                  format=header.format or "safetensors",
                                  lineage=json_format.MessageToDict(header.lineage, preserving_proto_field_name=True),
                                  inputs=spec_dicts(inputs), outputs=spec_dicts(outputs), who=who, why=why)
                self._host.numbered(name, version)
                self.gating[name] = version
                if base is not None:
                    self.gate_base[name] = base  # kept on disk (not retired) until the publish ends
            numbered = time.monotonic()
            try:
                reply, incumbent, passed = await self._gate_and_load(name, version, base, header, upload)
                checked = time.monotonic()
                async with self._host.lock:  # short: re-check what the gate judged against, then enter the plan
                    note = self.still_valid(name, version, incumbent)
                    await self._write(self._registry.move, name, version, State.GATED, who="gate",
                                      why="passed: " + ", ".join(passed) + note)
                    self.gating.pop(name, None)
                    self.gate_base.pop(name, None)
                    await self._host.enter_plan(name, version)
                    await self._host.reconcile(name)
            except BaseException as exc:
                self.gating.pop(name, None)
                self.gate_base.pop(name, None)
                async with self._host.lock:
                    await self._reject(name, version, exc)
                raise
        done = time.monotonic()
        reply.load_seconds = done - started
        log.info("policy %s v%d published by %s (parent v%d, trainer step %d): %s, %.2f s (numbered %.3f s, "
                 "integrity to served checks %.3f s, into the plan %.3f s)", name, version, who,
                 header.lineage.parent_version, header.lineage.trainer_step, self._registry.get(name, version).state,
                 reply.load_seconds, numbered - started, checked - numbered, done - checked)
        return reply

    def still_valid(self, name: str, version: int, incumbent: int | None) -> str:
        """After the gate (run without the rollout lock): the candidate must still be a candidate, and the
        version it was judged against must not have been withdrawn meanwhile (rolled back by an operator or
        by the judging loop): GateSuperseded otherwise. Returns a note when the live version moved on in an
        ordinary way (a canary went live): the candidate goes on, its plan judges it against the new one."""
        record = self._registry.get(name, version)
        if record.state is not State.CANDIDATE:
            raise GateSuperseded(f"policy {name!r} v{version} became {record.state} during its gate: not promoted")
        live = self._host.refresh(name).live
        if live == incumbent:
            return ""
        moved = self._registry.get(name, incumbent).state if incumbent is not None else None
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
                             upload: Upload) -> tuple[policies_pb2.PublishReply, int | None, list[str]]:
        """Integrity, then (under the rollout lock, short) the version folder written and loaded, then the
        served checks (consistency, action sanity, evaluation) without the lock. Returns the reply, the
        incumbent the checks judged against, and the names of the checks passed."""
        repo = self._publisher.repository()
        # decoded and checked in a thread, or (a large version) checked and built by a child process at a lower
        # priority: the sessions' steps never wait on it (Publisher.check)
        artifact, weights = await self._publisher.check(header, upload, name, base, self._host.gate)
        await self._write(self._registry.record_gate, name, version, [artifact.to_dict()])
        if not artifact.passed:
            raise PublishError(f"policy {name!r} v{version} rejected by the gate: integrity: {artifact.detail}")
        marks = [("integrity", time.monotonic())]
        async with self._host.lock:  # the swap: what is on disk and what Triton serves change together
            keep = self._host.keep(name) | {base}
            # the write step is one call (Publisher.write): safetensors over the base's architecture, or an imported
            # file; folder and tether.json fsynced before any registry state depends on them
            await asyncio.to_thread(self._host.serving.retire, repo, name, keep)  # the load_model below unloads these
            await self._publisher.write(name, version, header, weights, base)
            marks.append(("write", time.monotonic()))
            ready = await self._publisher.load(name, version)
            await self._host.serving.verify_ready(name)  # the unloads took effect too
            marks.append(("load", time.monotonic()))
            served = await self._catalog.ensure(name, version)
            await self._host.serving.verify_replicas(name, version, header)  # several replicas: each, recorded
            incumbent = self._host.rollout(name).live
            action_spec = self._host.action_spec(name, served)
            serving = repo.serving_format(name, version)  # torch or onnxruntime: the consistency tolerance
            marks.append(("metadata", time.monotonic()))
        # the gate's checks without the rollout lock (an evaluation in simulation takes tens of seconds)
        checks = await self._host.gate.check_served(policy=name, version=version, incumbent=incumbent, header=header,
                                                    action_spec=action_spec, serving=serving)
        marks.append(("served checks", time.monotonic()))
        log.info("policy %s v%d served by %s: %s", name, version, serving,
                 ", ".join(f"{what} {b - a:.3f} s" for (_, a), (what, b) in zip(marks, marks[1:], strict=False)))
        await self._write(self._registry.record_gate, name, version, [c.to_dict() for c in checks])
        failed = [c for c in checks if not c.passed]
        if failed:
            async with self._host.lock:  # a check that failed because its incumbent was withdrawn meanwhile: say so
                self.still_valid(name, version, incumbent)
            first = failed[0]
            raise VerificationFailed(f"policy {name!r} v{version} rejected by the gate: {first.name}: {first.detail}")
        error = next((c.figures.get("max_abs_error", 0.0) for c in checks if c.name == "consistency"), 0.0)
        reply = policies_pb2.PublishReply(policy=name, version=version, sha256=header.sha256, ready_versions=ready,
                                          max_abs_error=float(error))
        return reply, incumbent, [c.name for c in (artifact, *checks)]

    async def _reject(self, name: str, version: int, exc: BaseException) -> None:
        """Withdraw a version the gate (or anything on the way) refused; the live one keeps serving."""
        try:
            if self._registry.get(name, version).state is State.CANDIDATE:
                why = str(exc) or type(exc).__name__
                await self._write(self._registry.move, name, version, State.REJECTED, who="gate", why=why[:2000])
        except Exception as error:
            log.error("rollout: recording the rejection of %s v%d: %s", name, version, error)
        await self._publisher.withdraw(name, version)
        self._host.withdrawn(name)
        self._host.refresh(name)

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
