"""A real tritonserver serving TorchScript policies: outputs, dynamic batching, bad requests,
explicit versions and a hot swap under load. One server for the whole module."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest
import torch

from inference_server import InferenceError, ModelControlError, ModelRepository, PolicyClient, TritonServer
from protos.codec import Spec

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TWO_OBS = (Spec("obs", np.float32, (4,)), Spec("mode", np.int64, (1,)))
TWO_ACT = (Spec("move", np.float32, (2,)), Spec("next_mode", np.int64, (1,)))


class TwoHeads(torch.nn.Module):
    def forward(self, obs: torch.Tensor, mode: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return obs[:, :2] * 2.0 + mode.float(), mode + 1


@pytest.fixture(scope="module")
def served(tmp_path_factory, mlp, specs):
    repo = ModelRepository(tmp_path_factory.mktemp("repository"))
    repo.write_version("policy", 1, mlp(1), *specs)
    repo.write_version("two", 1, TwoHeads(), TWO_OBS, TWO_ACT)
    with TritonServer(repo.root, models=["policy", "two"]) as server:
        yield repo, server


def run(coroutine_fn, url: str, **client_args):
    """Run `coroutine_fn(client)` with a fresh PolicyClient on `url`, closing it after."""

    async def main():
        client = PolicyClient(url, **client_args)
        try:
            return await coroutine_fn(client)
        finally:
            await client.close()

    return asyncio.run(main())


def test_outputs_match_the_torch_module(served, mlp, reference, obs_batch):
    _, server = served
    batches = [obs_batch, obs_batch[:1], np.random.default_rng(1).standard_normal((64, 3)).astype(np.float32)]

    async def infer_all(client):
        return [await client.infer("policy", 1, {"obs": b}, ["action"]) for b in batches]

    for batch, out in zip(batches, run(infer_all, server.grpc_url), strict=True):
        assert list(out) == ["action"] and out["action"].dtype == np.float32
        assert np.allclose(out["action"], reference(mlp(1), batch), atol=1e-6)


def test_several_inputs_outputs_and_int64(served):
    _, server = served
    obs = np.arange(12, dtype=np.float32).reshape(3, 4)
    mode = np.array([[0], [1], [5]], dtype=np.int64)
    out = run(lambda c: c.infer("two", 1, {"obs": obs, "mode": mode}, ["move", "next_mode"]), server.grpc_url)
    np.testing.assert_array_equal(out["move"], obs[:, :2] * 2 + mode)
    np.testing.assert_array_equal(out["next_mode"], mode + 1)
    assert out["next_mode"].dtype == np.int64


def test_concurrent_requests_are_batched_and_split_back(served, mlp, reference):
    _, server = served
    rng = np.random.default_rng(2)
    batches = [rng.standard_normal((1 + i % 4, 3)).astype(np.float32) for i in range(24)]

    async def concurrently(client):
        return await asyncio.gather(*(client.infer("policy", 1, {"obs": b}, ["action"]) for b in batches))

    for batch, out in zip(batches, run(concurrently, server.grpc_url), strict=True):
        assert np.allclose(out["action"], reference(mlp(1), batch), atol=1e-6)


def test_metadata(served):
    _, server = served
    assert re.fullmatch(r"2\.\d+\.\d+", server.version)
    assert re.fullmatch(r"127\.0\.0\.1:\d+", server.grpc_url) and server.http_url.startswith("http://127.0.0.1:")

    async def query(client):
        await client.wait_ready(timeout=5)
        return await client.server_version(), await client.ready_versions("policy")

    assert run(query, server.grpc_url) == (server.version, [1])


@pytest.mark.parametrize(("version", "inputs", "needle"), [
    (9, {"obs": np.zeros((1, 3), np.float32)}, "version 9"),
    (1, {"observation": np.zeros((1, 3), np.float32)}, "observation"),
    (1, {"obs": np.zeros((1, 3), np.float64)}, "FP64"),
    (1, {"obs": np.zeros((1, 4), np.float32)}, r"\[1,4\]"),
    (1, {"obs": np.zeros((65, 3), np.float32)}, "batch-size must be <= 64"),
])
def test_bad_requests_raise_inference_error(served, version, inputs, needle):
    _, server = served
    with pytest.raises(InferenceError, match=needle) as info:
        run(lambda c: c.infer("policy", version, inputs, ["action"]), server.grpc_url)
    assert server.grpc_url in str(info.value) and "'policy'" in str(info.value)
    assert info.value.model == "policy" and info.value.version == version and info.value.code
    good = {"obs": np.zeros((1, 3), np.float32)}
    out = run(lambda c: c.infer("policy", 1, good, ["action"]), server.grpc_url)
    assert out["action"].shape == (1, 2)  # the server keeps serving


def test_unload_and_reload(served):
    _, server = served
    args = ("two", 1, {"obs": np.zeros((1, 4), np.float32), "mode": np.zeros((1, 1), np.int64)}, ["move"])
    server.unload_model("two")
    assert run(lambda c: c.ready_versions("two"), server.grpc_url) == []
    with pytest.raises(InferenceError, match="'two' version 1"):
        run(lambda c: c.infer(*args), server.grpc_url)
    server.load_model("two")
    assert run(lambda c: c.infer(*args), server.grpc_url)["move"].shape == (1, 2)
    with pytest.raises(ModelControlError, match="'missing'"):
        server.load_model("missing")


def test_hot_swap_under_load(served, mlp, specs, reference, obs_batch):
    """Write version 2 and load it while requests keep flowing to version 1: none fails."""
    repo, server = served
    repo.write_version("policy", 2, mlp(2), *specs)
    assert repo.versions("policy") == [1, 2]

    async def swap(client):
        results = {"ok": 0, "errors": []}
        loading = asyncio.create_task(asyncio.to_thread(server.load_model, "policy"))

        async def worker():
            for _ in range(5000):  # bounded: the load takes a few seconds
                try:
                    out = await client.infer("policy", 1, {"obs": obs_batch}, ["action"])
                    assert np.allclose(out["action"], reference(mlp(1), obs_batch), atol=1e-6)
                    results["ok"] += 1
                except InferenceError as exc:
                    results["errors"].append(str(exc))
                if loading.done():
                    return

        await asyncio.gather(worker(), worker(), worker())
        await loading
        return results, await client.ready_versions("policy"), await asyncio.gather(
            client.infer("policy", 1, {"obs": obs_batch}, ["action"]),
            client.infer("policy", 2, {"obs": obs_batch}, ["action"]))

    results, versions, (v1, v2) = run(swap, server.grpc_url)
    assert results["errors"] == [] and results["ok"] > 10
    assert versions == [1, 2]
    assert np.allclose(v1["action"], reference(mlp(1), obs_batch), atol=1e-6)
    assert np.allclose(v2["action"], reference(mlp(2), obs_batch), atol=1e-6)
    assert not np.allclose(v1["action"], v2["action"])
