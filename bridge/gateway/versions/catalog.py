"""Which policies the gateway serves, what tensors they take and give, and which version a
session gets.

    catalog = PolicyCatalog(client, default="hopper")
    policy = await catalog.resolve("")           # "" = the default policy
    policy.name, policy.version, policy.inputs, policy.outputs
    await catalog.promote("hopper", 2)           # after a verified load: sessions move to v2
    catalog.current("hopper")                    # the live version (no Triton call)
    await catalog.ensure("hopper", 3)            # any served version's specs, cached
    catalog.get("hopper", 3)                     # the cached one, or None (no Triton call)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from bridge.gateway.errors import PolicyUnavailable, UnknownPolicy
from protos.codec import RAW, Spec, encoding_name


class PolicyServer(Protocol):
    """What the catalog needs from Triton (inference_server.PolicyClient fits)."""

    async def ready_versions(self, model: str) -> list[int]: ...

    async def model_io(self, model: str, version: int) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]: ...


@dataclass(frozen=True)
class ServedPolicy:
    name: str
    version: int
    inputs: tuple[Spec, ...]
    outputs: tuple[Spec, ...]

    @property
    def log_prob(self) -> bool:
        """A stochastic policy also gives the log-probability of the action it sampled."""
        return any(s.name == LOG_PROB for s in self.outputs)


LOG_PROB = "log_prob"  # the output a stochastic policy reports its action's log-probability in


class PolicyCatalog:
    """Which version of each policy is live: at first the newest ready version in Triton, then
    whatever `promote` says (the rollout controller, after a version was loaded and verified).
    Also the specs of every version in use (`ensure`, `get`): sessions switch without a Triton call."""

    def __init__(self, server: PolicyServer, *, default: str):
        self._server = server
        self.default = default
        self._current: dict[str, ServedPolicy] = {}
        self._versions: dict[tuple[str, int], ServedPolicy] = {}

    async def resolve(self, name: str = "") -> ServedPolicy:
        name = name or self.default
        if not name:
            raise UnknownPolicy("no policy requested and the gateway has no default policy")
        if name in self._current:
            return self._current[name]
        try:
            ready = await self._server.ready_versions(name)
        except Exception as exc:
            raise PolicyUnavailable(f"cannot list versions of policy {name!r}: {exc}") from exc
        if not ready:
            raise UnknownPolicy(f"policy {name!r} has no ready version in Triton")
        return await self.promote(name, max(ready))

    async def promote(self, name: str, version: int) -> ServedPolicy:
        policy = self._current[name] = await self.ensure(name, version)
        return policy

    async def ensure(self, name: str, version: int) -> ServedPolicy:
        policy = self._versions.get((name, version))
        if policy is None:
            inputs, outputs = await self._server.model_io(name, version)
            policy = self._versions[(name, version)] = ServedPolicy(name, version, inputs, outputs)
        return policy

    def get(self, name: str, version: int) -> ServedPolicy | None:
        return self._versions.get((name, version))

    def current(self, name: str) -> ServedPolicy:
        return self._current[name]


def check_compatible(policy: ServedPolicy, observation: Sequence[Spec], action: Sequence[Spec]) -> str | None:
    """Why a session's declared specs cannot be served by `policy`, or None if they can.

    Every policy input must be declared as an observation tensor (extra observation tensors are
    fine: they are logged, not inferred); every action tensor must be a policy output (extra
    outputs, e.g. a stochastic policy's `log_prob` and `action_mean`, stay in the gateway). An encoded
    observation (a camera's JPEG or PNG) must decode to exactly the policy's input: its uint8 (H, W, C).
    """
    declared = {s.name: s for s in observation}
    for spec in policy.inputs:
        got = declared.get(spec.name)
        if got is None:
            return f"observation_spec lacks {spec.name!r}, an input of policy {policy.name!r}"
        if replace(got, encoding=spec.encoding) != spec:
            sent = f" ({encoding_name(got.encoding)})" if got.encoding != RAW else ""
            return (f"observation_spec {spec.name!r}{sent} is {got.dtype.name}{list(got.shape)}, policy "
                    f"{policy.name!r} takes {spec.dtype.name}{list(spec.shape)}")
    outputs = {s.name: s for s in policy.outputs}
    given = {s.name: s for s in action}
    if given.keys() - outputs.keys():
        return f"action_spec names {sorted(given)} are not all outputs of policy {policy.name!r}: {sorted(outputs)}"
    for name, spec in given.items():
        if outputs[name] != spec:
            return (f"action_spec {name!r} is {spec.dtype.name}{list(spec.shape)}, policy "
                    f"{policy.name!r} gives {outputs[name].dtype.name}{list(outputs[name].shape)}")
    return None
