"""The weights of an imported TorchScript archive, read in a subprocess so that the gate can check
them (names, shapes, all finite) without the gateway loading the file itself.

    weights = read_weights(data)        # {name: tensor}; ArtifactError if the archive does not load

The subprocess (`python -m inference_server.torchscript_weights FILE`) runs `torch.jit.load` on
the file and writes its state_dict to stdout as safetensors; only those bytes come back. It runs
with this process's rights (as the Triton stub that serves the file does): it isolates the
gateway's memory and event loop from the file, it is not a sandbox.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from inference_server.artifact import ArtifactError

TIMEOUT_S = 120.0


def read_weights(data: bytes, *, timeout_s: float = TIMEOUT_S) -> dict:
    """The archive's state_dict (torch tensors, read from safetensors bytes)."""
    import safetensors.torch

    with tempfile.TemporaryDirectory(prefix="tether-import-") as folder:
        path = Path(folder) / "policy.pt"
        path.write_bytes(data)
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        try:
            run = subprocess.run([sys.executable, "-m", "inference_server.torchscript_weights", str(path)],
                                 capture_output=True, timeout=timeout_s, env=env, stdin=subprocess.DEVNULL,
                                 cwd=Path(__file__).resolve().parents[1])
        except subprocess.TimeoutExpired:
            raise ArtifactError(f"reading the TorchScript archive's weights took over {timeout_s:g} s") from None
    if run.returncode != 0:
        tail = run.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["(no message)"]
        raise ArtifactError(f"the TorchScript archive does not load (torch.jit.load): {tail[0][:500]}")
    try:
        return safetensors.torch.load(run.stdout)
    except Exception as exc:
        raise ArtifactError(f"the weights read from the TorchScript archive are unreadable: {exc}") from None


def main(argv: list[str]) -> None:
    import warnings

    import safetensors.torch
    import torch

    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = torch.jit.load(argv[0], map_location="cpu")
    state = {name: tensor.detach().clone().contiguous() for name, tensor in module.state_dict().items()}
    sys.stdout.buffer.write(safetensors.torch.save(state))
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
