"""The trainer's architectures for a served policy: which module fits the specs the gateway serves.

    served = PoliciesClient(address, Credentials.from_env()).fetch("pendulum")   # bridge.client.policies
    policy = build_policy("gaussian", served.inputs, served.outputs, hidden=hidden_sizes(served.state_dict))
    policy.load_state_dict(served.state_dict, strict=True)

    >>> from protos.codec import Spec
    >>> import numpy as np
    >>> m = build_policy("mlp", [Spec("obs", np.float32, (3,))], [Spec("action", np.float32, (1,))], hidden=(8,))
    >>> hidden_sizes(m.state_dict())
    (8,)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from bridge.client.weights import WeightsError
from protos.codec import Spec
from trainer.policy import GaussianPolicy, MLPPolicy

__all__ = ["ARCHS", "build_policy", "hidden_sizes"]

ARCHS = ("gaussian", "mlp", "camera")  # camera: images + state -> chunks (trainer.camera_policy)


def build_policy(arch: str, inputs: Sequence[Spec], outputs: Sequence[Spec], *,
                 hidden: tuple[int, ...] = (64, 64), seed: int | None = None) -> torch.nn.Module:
    """The architecture `arch` ("gaussian" | "mlp" | "camera") for a policy served with these specs (a camera
    policy's sizes: its defaults, or `trainer.camera_policy.camera_policy_for` with the served weights)."""
    if arch not in ARCHS:
        raise ValueError(f"arch {arch!r} must be one of {ARCHS}")
    if arch == "camera":
        from trainer.camera_policy import camera_policy_for

        return camera_policy_for(inputs, outputs, seed=seed)
    if len(inputs) != 1:
        raise ValueError(f"the trainer's policies take one observation tensor, the served policy takes "
                         f"{[s.name for s in inputs]}")
    if not outputs:
        raise ValueError("the served policy declares no outputs")
    if arch == "gaussian":
        names = [s.name for s in outputs]
        expected = [s.name for s in GaussianPolicy.output_specs(outputs[0])]
        if names != expected:
            raise ValueError(f"--arch gaussian needs outputs {expected}, the served policy has {names}")
        return GaussianPolicy(inputs[0], outputs[0], hidden=hidden, seed=seed)
    if len(outputs) != 1:
        raise ValueError(f"--arch mlp has one output, the served policy has {[s.name for s in outputs]}")
    return MLPPolicy(inputs[0], outputs[0], hidden=hidden, seed=seed)


def hidden_sizes(state_dict: Mapping[str, torch.Tensor]) -> tuple[int, ...]:
    """The hidden layer sizes of a GaussianPolicy/MLPPolicy state_dict (`net.{i}.weight` rows)."""
    layers = sorted((int(k.split(".")[1]), v) for k, v in state_dict.items()
                    if k.startswith("net.") and k.endswith(".weight") and k.split(".")[1].isdigit())
    if not layers:
        raise WeightsError(f"no net.<i>.weight tensors among {sorted(state_dict)[:8]}: not an MLP policy")
    return tuple(int(w.shape[0]) for _, w in layers[:-1])
