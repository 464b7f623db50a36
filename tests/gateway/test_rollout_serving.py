"""The serving reconciler (bridge.gateway.rollout.serving) against a real Triton: what is not kept is retired and
unloaded, a retired version that must serve is restored, loaded and fingerprinted, and a swap that did not take
effect is reported (SwapFailed), never silent."""

from __future__ import annotations

import asyncio

import pytest

from bridge.gateway.rollout.serving import ServingReconciler
from bridge.gateway.versions.catalog import PolicyCatalog
from bridge.gateway.versions.verify import SwapFailed
from inference_server import PolicyClient, TritonServer


def test_the_reconciler_unloads_what_is_not_kept_restores_what_must_serve_and_reports_a_swap_that_failed(triton):
    repo = triton.repo
    triton.add_policy("srv", versions=3, seed=1)

    async def scenario(server: TritonServer) -> dict:
        client = PolicyClient(server.grpc_url, timeout_s=30.0)
        seen = {}
        try:
            catalog = PolicyCatalog(client, default="srv")
            serving = ServingReconciler(control=client, catalog=catalog, repository=repo)
            seen["start"] = await client.ready_versions("srv")
            await serving.reconcile("srv", {1, 3})
            seen["kept"] = (await client.ready_versions("srv"), repo.versions("srv"), repo.retired_versions("srv"))
            await serving.serve("srv", 2)  # back from .retired, loaded, its outputs checked against its file
            seen["restored"] = (await client.ready_versions("srv"), repo.retired_versions("srv"),
                                (await catalog.ensure("srv", 2)).version)
            repo.retire("srv", 3)  # behind Triton's back: it still serves v3, the repository no longer holds it
            with pytest.raises(SwapFailed, match=r"Triton serves versions \[1, 2, 3\] after load_model, the "
                                                 r"repository holds \[1, 2\]"):
                await serving.verify_ready("srv")
            await client.load_model("srv")
            bare = ServingReconciler(control=client, catalog=catalog, repository=None)
            await bare.reconcile("srv", set())  # without a repository nothing is unloaded
            seen["bare"] = await client.ready_versions("srv")
            with pytest.raises(SwapFailed, match="v3 is not served by Triton .* no model repository"):
                await bare.serve("srv", 3)
            seen["digest"] = serving.sha256("srv", 1)
            seen["format"] = serving.format_on_disk("srv", 1)
        finally:
            await client.close()
        return seen

    seen = asyncio.run(scenario(triton.server))
    assert seen["start"] == [1, 2, 3]
    assert seen["kept"] == ([1, 3], [1, 3], [2])
    assert seen["restored"] == ([1, 2, 3], [], 2)
    assert seen["bare"] == [1, 2]
    assert len(seen["digest"]) == 64 and seen["format"] == "torchscript"
