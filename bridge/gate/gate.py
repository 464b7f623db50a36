"""The safety gate: every check a candidate version must pass before any session acts with it.

Usage (plain text: it needs Triton, and for evaluation a gateway and simulators):

    gate = Gate(client=policy_client, experience_dir=run_dir / "experience",
                evaluator=SimEvaluator(address=gateway.address, env="InvertedPendulum-v5", pin=pin, unpin=unpin),
                config=GateConfig(eval_env="InvertedPendulum-v5", eval_margin=0.1, max_jerk=0.5))
    artifact = gate.check_artifact(weights, architecture)            # before writing the version folder
    ... write the Triton version folder, load_model ...
    served = await gate.check_served(policy="pendulum", version=3, incumbent=2, header=header,
                                     action_spec=action_spec)          # consistency, action_sanity, evaluation
    report = GateReport((artifact, *served))
    report.passed, report.failed, report.to_dict()                     # e.g. False, ["evaluation"], {...}

`check_served` runs every check that can run and reports each (it does not stop at the first
failure); the incumbent's evaluation returns are reused while the incumbent stays the same. A
check that cannot run here (no probe batch allowed, no eval env, no incumbent, no experience log
or no data in it) passes as "skipped: <why>" with no figures.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

import bridge.gate.checks as checks
from bridge.gate.checks import DEFAULT_TOLERANCES, SERVING_TOLERANCES, CheckResult
from bridge.gate.samples import LogIndex, recent_observations
from protos import policies_pb2
from protos.codec import Spec, TensorError, decode_all

if TYPE_CHECKING:
    import torch

log = logging.getLogger("tether.gate")


class PolicyServer(Protocol):
    """What the gate needs from Triton (inference_server.PolicyClient fits)."""

    async def infer(self, model: str, version: int, inputs: Mapping[str, np.ndarray],
                    outputs: Sequence[str]) -> dict[str, np.ndarray]: ...

    async def model_io(self, model: str, version: int) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]: ...


class Evaluator(Protocol):
    """Episode returns of `policy` at exactly `version` (same seeds on every call)."""

    async def returns(self, policy: str, version: int, episodes: int) -> list[float]: ...


@dataclass(frozen=True, kw_only=True)
class GateConfig:
    """What the gate demands. `eval_margin`: the candidate's mean return may be at most this
    fraction (of |incumbent mean|) below the incumbent's. `tolerances`: (rtol, atol) per dtype name."""

    eval_env: str | None = None          # the env of evaluation episodes; None = evaluation skipped
    eval_envs: Mapping[str, str] = field(default_factory=dict, hash=False)  # per policy, over eval_env
    eval_episodes: int = 5
    eval_margin: float = 0.1
    eval_max_steps: int | None = None    # an episode's step limit (None = the env's own)
    sanity_samples: int = 256            # recorded observations run through the candidate
    sanity_batch: int = 32               # rows per Triton request (<= the model's max_batch_size)
    bound_tolerance: float = 1e-6        # of the bound range
    max_jerk: float | None = None        # max |a_t - a_{t-1}| / range; None = reported, not judged
    tolerances: Mapping[str, tuple[float, float]] = field(default_factory=lambda: DEFAULT_TOLERANCES, hash=False)
    # per serving format ("torchscript", "onnx"), over `tolerances`: how close Triton's runtime serves the trainer's
    serving_tolerances: Mapping[str, Mapping[str, tuple[float, float]]] = field(
        default_factory=lambda: SERVING_TOLERANCES, hash=False)
    require_probe: bool = True           # no probe batch in the header: consistency fails (else: skipped)
    reuse_incumbent: bool = True         # the incumbent's returns are evaluated once per (policy, version)

    def __post_init__(self):
        for name in ("eval_episodes", "sanity_samples", "sanity_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GateConfig.{name} must be an integer >= 1, got {value!r}")
        if not (isinstance(self.eval_margin, int | float) and 0 <= self.eval_margin < float("inf")):
            raise ValueError(f"GateConfig.eval_margin must be a finite number >= 0, got {self.eval_margin!r}")
        if self.eval_max_steps is not None and (not isinstance(self.eval_max_steps, int) or self.eval_max_steps < 1):
            raise ValueError(f"GateConfig.eval_max_steps must be None or an integer >= 1, got {self.eval_max_steps!r}")
        if not 0 <= self.bound_tolerance < float("inf"):
            raise ValueError(f"GateConfig.bound_tolerance must be >= 0, got {self.bound_tolerance!r}")
        if self.max_jerk is not None and not 0 <= self.max_jerk < float("inf"):
            raise ValueError(f"GateConfig.max_jerk must be None or a number >= 0, got {self.max_jerk!r}")
        for policy, env in self.eval_envs.items():
            if not (isinstance(policy, str) and policy and isinstance(env, str) and env):
                raise ValueError(f"GateConfig.eval_envs maps policy names to env names, got {policy!r}: {env!r}")
        for dtype, pair in self.tolerances.items():
            if len(pair) != 2 or not all(0 <= x < float("inf") for x in pair):
                raise ValueError(f"GateConfig.tolerances[{dtype!r}] must be (rtol, atol) >= 0, got {pair!r}")
        for serving, table in self.serving_tolerances.items():
            for dtype, pair in table.items():
                if len(pair) != 2 or not all(0 <= x < float("inf") for x in pair):
                    raise ValueError(f"GateConfig.serving_tolerances[{serving!r}][{dtype!r}] must be (rtol, atol) "
                                     f">= 0, got {pair!r}")

    def tolerances_for(self, serving: str | None) -> Mapping[str, tuple[float, float]]:
        """(rtol, atol) per dtype for a version served by `serving` ("torchscript", "onnx"; None: unknown).

        >>> GateConfig().tolerances_for("onnx")["float32"], GateConfig().tolerances_for(None)["float32"]
        ((1e-05, 4e-05), (0.0001, 0.0001))
        """
        return {**self.tolerances, **self.serving_tolerances.get(serving or "", {})}

    def env_for(self, policy: str) -> str | None:
        """The env `policy`'s candidates are evaluated in (None: not evaluated)."""
        return self.eval_envs.get(policy, self.eval_env)


class Gate:
    """Runs the checks of one candidate at a time (see the module docstring)."""

    def __init__(self, *, client: PolicyServer, experience_dir: Path | None, evaluator: Evaluator | None,
                 config: GateConfig):
        self.client = client
        self.experience_dir = None if experience_dir is None else Path(experience_dir)
        self.evaluator = evaluator
        self.config = config
        self._incumbent_returns: dict[tuple[str, int, int, str], list[float]] = {}
        self._log_index = LogIndex()  # where the log's messages are (used from one thread at a time)

    def check_artifact(self, weights: Mapping[str, torch.Tensor], architecture: Mapping[str, torch.Tensor] | None,
                       *, sha256: str | None = None, data: bytes | None = None,
                       digest: str | None = None) -> CheckResult:
        """Integrity: expected tensor names, dtypes and shapes (vs `architecture`), all finite, and
        the sha256 of `data` (or the `digest` computed on receipt) against the header's `sha256`."""
        started = time.monotonic()
        result = checks.integrity(weights, architecture, sha256=sha256, data=data, digest=digest)
        return replace(result, figures={**result.figures, "seconds": round(time.monotonic() - started, 4)})

    async def check_served(self, *, policy: str, version: int, incumbent: int | None,
                           header: policies_pb2.PublishHeader, action_spec: Sequence[Spec],
                           serving: str | None = None) -> list[CheckResult]:
        """Consistency and action sanity (at once), then evaluation of `version` as Triton serves it.
        `serving`: the version's runtime ("torchscript", "onnx"), which picks the consistency tolerance."""
        action_spec = tuple(action_spec)
        # consistency and action sanity together: the sanity check's log read (a thread) overlaps the probe's
        # round trip to the version's fresh Triton stub (its first request)
        results = [*await asyncio.gather(
                       self._guarded("consistency", self.consistency(policy, version, header, serving=serving)),
                       self._guarded("action_sanity", self.action_sanity(policy, version, action_spec))),
                   await self._guarded("evaluation", self.evaluation(policy, version, incumbent))]
        for r in results:
            log.info("gate %s v%d %s: %s %s", policy, version, r.name, "passed" if r.passed else "FAILED", r.detail)
        return results

    async def _guarded(self, name: str, coro) -> CheckResult:
        """A check that raised (Triton unreachable, a broken log, ...) fails, saying why: the gate fails closed.
        A check that ran gets the figure "seconds" (its wall time)."""
        started = time.monotonic()
        try:
            result = await coro
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("gate check %s could not complete: %s: %s", name, type(exc).__name__, exc)
            return CheckResult(name, False, {"seconds": time.monotonic() - started},
                               f"could not complete: {type(exc).__name__}: {exc}")
        if result.is_skipped:
            return result
        return replace(result, figures={**result.figures, "seconds": round(time.monotonic() - started, 4)})

    async def consistency(self, policy: str, version: int, header: policies_pb2.PublishHeader, *,
                          serving: str | None = None) -> CheckResult:
        """The probe batch through Triton at exactly `version` against the trainer's outputs, within the
        tolerance of its serving format (GateConfig.tolerances_for), or the header's atol when it sets one."""
        try:
            inputs, expected = decode_all(header.probe_inputs), decode_all(header.probe_outputs)
        except TensorError as exc:
            return CheckResult("consistency", False, {}, f"the probe batch does not decode: {exc}")
        if not inputs or not expected:
            why = "the header has no probe_inputs/probe_outputs to compare the served version with"
            return CheckResult("consistency", False, {}, why) if self.config.require_probe \
                else CheckResult.skipped("consistency", why)
        served = await self.client.infer(policy, version, inputs, sorted(expected))
        try:
            result = checks.compare_outputs(served, expected, tolerances=self.config.tolerances_for(serving),
                                            atol=header.atol)
        except ValueError as exc:
            return CheckResult("consistency", False, {}, str(exc))
        return replace(result, detail=f"{result.detail} (served by {serving})") if serving else result

    async def evaluation(self, policy: str, version: int, incumbent: int | None) -> CheckResult:
        """K episodes of the candidate and of the incumbent, same seeds, one after the other."""
        config = self.config
        env = config.env_for(policy)
        if env is None or self.evaluator is None:
            what = f"no eval env configured for policy {policy!r}" if env is None \
                else "no evaluator (simulator) configured"
            return CheckResult.skipped("evaluation", what)
        if incumbent is None:
            return CheckResult.skipped("evaluation", "no incumbent version to compare with")
        candidate_returns = await self.evaluator.returns(policy, version, config.eval_episodes)
        key = (policy, incumbent, config.eval_episodes, env)
        incumbent_returns = self._incumbent_returns.get(key) if config.reuse_incumbent else None
        if incumbent_returns is None:
            incumbent_returns = await self.evaluator.returns(policy, incumbent, config.eval_episodes)
            self._incumbent_returns = {key: incumbent_returns}  # only the newest incumbent is kept
        result = checks.evaluation(candidate_returns, incumbent_returns, margin=config.eval_margin)
        detail = f"v{version} vs incumbent v{incumbent} in {env}: {result.detail}"
        return CheckResult("evaluation", result.passed, result.figures, detail)

    async def action_sanity(self, policy: str, version: int, action_spec: tuple[Spec, ...]) -> CheckResult:
        """Recorded observations through `version`: bounds, finiteness and jerk of its actions."""
        if self.experience_dir is None or not self.experience_dir.is_dir():
            return CheckResult.skipped("action_sanity", "no experience log to take observations from")
        if not action_spec:
            return CheckResult("action_sanity", False, {}, "no action spec given to check the actions against")
        inputs, outputs = await self.client.model_io(policy, version)
        batch = await asyncio.to_thread(recent_observations, self.experience_dir, policy=policy, inputs=inputs,
                                        count=self.config.sanity_samples, index=self._log_index)
        if not len(batch):
            return CheckResult.skipped("action_sanity", f"the experience log has no observations of policy "
                                                        f"{policy!r} that fit its inputs")
        served = {s.name for s in outputs}
        names = [s.name for s in action_spec]
        means = {name: f"{name}_mean" for name in names if f"{name}_mean" in served}  # a stochastic policy
        parts: list[dict[str, np.ndarray]] = []
        step = self.config.sanity_batch
        for start in range(0, len(batch), step):
            rows = {k: v[start:start + step] for k, v in batch.inputs.items()}
            parts.append(await self.client.infer(policy, version, rows, list(dict.fromkeys([*names, *means.values()]))))
        got = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
        actions = {name: got[means.get(name, name)] for name in names}
        return checks.action_sanity(actions, action_spec, pairs=batch.pairs, sampled={n: got[n] for n in means},
                                    bound_tolerance=self.config.bound_tolerance, max_jerk=self.config.max_jerk)
