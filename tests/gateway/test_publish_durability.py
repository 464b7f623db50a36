"""Point 8 of issue 14, durability: a published version's folder (its files, the folder, the model
folder) and its tether.json (and the version folder again) are fsynced before the registry commits
a state that depends on them (gated, then live). A real gateway on a real Triton, real gRPC; only
os.fsync is wrapped, to record which path each call made durable and when."""

from __future__ import annotations

import asyncio
import fnmatch
import os

import grpc

from protos import policies_pb2_grpc
from tests.gateway.rollout_helpers import publish, variant
from tests.support.gateways import running_gateway


def test_the_version_folder_and_its_metadata_are_fsynced_before_the_registry_commits_them(triton, tmp_path,
                                                                                           monkeypatch):
    module = triton.add_policy("durable")
    model = str(triton.repo.root / "durable")
    order: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def fsync(fd):
        order.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    async def scenario():
        async with running_gateway(triton.url, triton_timeout_s=60, policy="durable",
                                   **triton.publishing(tmp_path)) as gw, \
                grpc.aio.insecure_channel(gw.address) as channel:
            real_move = gw.registry.move

            def move(policy, version, to, **kw):
                record = real_move(policy, version, to, **kw)
                order.append(("commit", f"v{version} {to}"))
                return record

            gw.registry.move = move
            monkeypatch.setattr(os, "fsync", fsync)
            reply = await publish(policies_pb2_grpc.PoliciesStub(channel), "durable", variant(module, scale=1.1))
            assert reply.version == 2 and gw.rollout.rollouts()["durable"].live == 2

    asyncio.run(scenario())
    commits = [i for i, (kind, _) in enumerate(order) if kind == "commit"]
    assert [order[i][1] for i in commits] == ["v2 gated", "v2 live"], order
    before = [path for kind, path in order[:commits[0]] if kind == "fsync"]
    wanted = {"a file of the staged folder": f"{model}/.v2-*/policy.pt",
              "the staged folder": f"{model}/.v2-*",
              "the model folder (the rename)": model,
              "tether.json (its temp file, before the rename)": f"{model}/2/.tether.json.*.tmp",  # common.files
              "the version folder (tether.json's rename)": f"{model}/2"}
    for what, pattern in wanted.items():
        assert any(fnmatch.fnmatchcase(path, pattern) for path in before), f"{what} not fsynced first: {before}"
    staged = next(i for i, path in enumerate(before) if fnmatch.fnmatchcase(path, f"{model}/.v2-*/policy.pt"))
    metadata = next(i for i, path in enumerate(before) if fnmatch.fnmatchcase(path, f"{model}/2/.tether.json.*.tmp"))
    assert staged < before.index(model) < metadata < len(before) - 1 - \
        before[::-1].index(f"{model}/2"), before  # files, rename, metadata, its rename: in that order
