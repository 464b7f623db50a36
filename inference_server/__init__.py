"""Triton serving for Tether policies: model repository, server process, async client.

    repo = ModelRepository(root)
    repo.write_version("policy", 1, module, observation_spec, action_spec)
    with TritonServer(repo.root, models=["policy"]) as server:
        client = PolicyClient(server.grpc_url)
        actions = await client.infer("policy", 1, {"obs": batch}, ["action"])
"""

from inference_server.client import InferenceError, PolicyClient
from inference_server.repository import ModelRepository
from inference_server.server import ModelControlError, TritonServer, TritonStartError, triton_binary

__all__ = ["InferenceError", "ModelControlError", "ModelRepository", "PolicyClient", "TritonServer",
           "TritonStartError", "triton_binary"]
