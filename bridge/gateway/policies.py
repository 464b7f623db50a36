"""Which policies the gateway serves, what tensors they take and give, and which version a
session gets.

    catalog = PolicyCatalog(client, default="hopper")
    policy = await catalog.resolve("")           # "" = the default policy
    policy.name, policy.version, policy.inputs, policy.outputs
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from bridge.gateway.errors import PolicyUnavailable, UnknownPolicy
from protos.codec import Spec


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


class PolicyCatalog:
    """Resolves a requested policy to the version sessions are served now: the newest ready
    version in Triton."""

    def __init__(self, server: PolicyServer, *, default: str):
        self._server = server
        self.default = default
        self._io: dict[tuple[str, int], tuple[tuple[Spec, ...], tuple[Spec, ...]]] = {}

    async def resolve(self, name: str = "") -> ServedPolicy:
        name = name or self.default
        if not name:
            raise UnknownPolicy("no policy requested and the gateway has no default policy")
        try:
            ready = await self._server.ready_versions(name)
        except Exception as exc:
            raise PolicyUnavailable(f"cannot list versions of policy {name!r}: {exc}") from exc
        if not ready:
            raise UnknownPolicy(f"policy {name!r} has no ready version in Triton")
        version = max(ready)
        key = (name, version)
        if key not in self._io:
            self._io[key] = await self._server.model_io(name, version)
        inputs, outputs = self._io[key]
        return ServedPolicy(name, version, inputs, outputs)


def check_compatible(policy: ServedPolicy, observation: Sequence[Spec], action: Sequence[Spec]) -> str | None:
    """Why a session's declared specs cannot be served by `policy`, or None if they can.

    Every policy input must be declared as an observation tensor (extra observation tensors are
    fine: they are logged, not inferred); the action spec must be exactly the policy's outputs.
    """
    declared = {s.name: s for s in observation}
    for spec in policy.inputs:
        got = declared.get(spec.name)
        if got is None:
            return f"observation_spec lacks {spec.name!r}, an input of policy {policy.name!r}"
        if got != spec:
            return (f"observation_spec {spec.name!r} is {got.dtype.name}{list(got.shape)}, policy "
                    f"{policy.name!r} takes {spec.dtype.name}{list(spec.shape)}")
    wanted = {s.name: s for s in policy.outputs}
    given = {s.name: s for s in action}
    if wanted.keys() != given.keys():
        return f"action_spec names {sorted(given)} differ from policy {policy.name!r} outputs {sorted(wanted)}"
    for name, spec in wanted.items():
        if given[name] != spec:
            return (f"action_spec {name!r} is {given[name].dtype.name}{list(given[name].shape)}, policy "
                    f"{policy.name!r} gives {spec.dtype.name}{list(spec.shape)}")
    return None
