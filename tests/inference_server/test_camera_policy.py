"""The camera policy (trainer.camera_policy) served by the session's real tritonserver: a TorchScript version
(H = 16) and an ONNX version (H = 50, onnxruntime), each with two 224x224 uint8 cameras and a state vector; what
Triton returns for random images matches the torch module's own output."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc

from protos.codec import Spec
from tests.support.triton import LOAD_TIMEOUT_S
from trainer.camera_policy import CameraChunkPolicy, chunk_spec

STATE = Spec("observation", np.float32, (4,))
CAMERAS = (Spec("top", np.uint8, (224, 224, 3)), Spec("front", np.uint8, (224, 224, 3)))
ACTION = Spec("action", np.float32, (2,), low=(-1.0,), high=(1.0,))


def _feed(batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feed = {"observation": rng.uniform(-0.3, 0.3, (batch, 4)).astype(np.float32)}
    for cam in CAMERAS:
        feed[cam.name] = rng.integers(0, 256, (batch, *cam.shape), dtype=np.uint8)
    return feed


def _served(url: str, model: str, feed: dict[str, np.ndarray]) -> np.ndarray:
    client = triton_grpc.InferenceServerClient(url)
    inputs = []
    for name, array in feed.items():
        tensor = triton_grpc.InferInput(name, list(array.shape), "UINT8" if array.dtype == np.uint8 else "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs, model_version="1").as_numpy("action")


@pytest.mark.parametrize(("serve", "horizon"), [("torchscript", 16), ("onnx", 50)])
def test_served_camera_policy_matches_torch(triton, serve, horizon):
    policy = CameraChunkPolicy(STATE, CAMERAS, ACTION, horizon=horizon, seed=horizon).eval()
    name = triton.claim(f"camera_{serve}_{horizon}")
    folder = triton.repo.write_version(name, 1, policy, policy.inputs, policy.outputs, serve=serve)
    assert triton.repo.serving_format(name, 1) == serve and (folder / "policy.pt").exists()
    triton.server.load_model(name, timeout=LOAD_TIMEOUT_S)

    feed = _feed(4, seed=horizon)
    got = _served(triton.url, name, feed)
    with torch.no_grad():
        want = policy(*(torch.from_numpy(feed[s.name]) for s in policy.inputs)).numpy()
    assert got.shape == want.shape == (4, horizon, 2)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.abs(got).max() <= 1.0 and np.ptp(got, axis=0).max() > 1e-4  # bounded, and the images matter


def test_bad_specs_and_horizons_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"camera front: expected uint8 \(H, W, 3\) images, got uint8\[224, 224\]"):
        CameraChunkPolicy(STATE, [Spec("front", np.uint8, (224, 224))], ACTION)
    with pytest.raises(ValueError, match="horizon must be an integer in"):
        CameraChunkPolicy(STATE, CAMERAS, ACTION, horizon=0)
    with pytest.raises(ValueError, match="state observation: expected a float vector"):
        CameraChunkPolicy(Spec("observation", np.float32, (2, 2)), CAMERAS, ACTION)
    assert chunk_spec(Spec("a", np.float32, (2,), low=(-1.0, -2.0), high=(1.0, 2.0)), 3).low == (-1.0, -2.0) * 3
