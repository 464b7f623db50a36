"""ModelRepository: layout, config, atomic versions and early errors that name the bad value."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from inference_server import ModelRepository
from protos.codec import Spec

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.* in torch >= 2.9


class TwoHeads(torch.nn.Module):
    """Two inputs (one int64), two outputs: returns a tuple in action-spec order."""

    def forward(self, obs: torch.Tensor, mode: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return obs[:, :2] * 2.0, mode + 1


class NotScriptable(torch.nn.Module):
    """Takes *observations, which TorchScript rejects, so write_version falls back to tracing."""

    def forward(self, *observations):
        return torch.cat(observations, dim=1)[:, :2].sin()


def test_layout_and_config(tmp_path, mlp, specs):
    repo = ModelRepository(tmp_path)
    folder = repo.write_version("policy", 1, mlp(0), *specs, max_batch_size=8, max_queue_delay_us=50)
    assert folder == tmp_path / "policy" / "1"
    assert sorted(p.name for p in folder.iterdir()) == ["__pycache__", "model.py", "policy.pt"]  # model.py compiled
    config = (tmp_path / "policy" / "config.pbtxt").read_text()
    for line in ['name: "policy"', 'backend: "python"', "max_batch_size: 8",
                 "max_queue_delay_microseconds: 50", "KIND_CPU count: 1", "version_policy: { all { } }",
                 '{ name: "obs" data_type: TYPE_FP32 dims: [ 3 ] }',
                 '{ name: "action" data_type: TYPE_FP32 dims: [ 2 ] }']:
        assert line in config
    repo.write_version("policy", 3, mlp(1), *specs)
    assert repo.versions("policy") == [1, 3]
    staging = [p.name for p in (tmp_path / "policy").iterdir() if p.name.startswith(".")]
    assert staging == []


def test_saved_policy_matches_module(tmp_path, mlp, specs, reference, obs_batch):
    module = mlp(7)
    folder = ModelRepository(tmp_path).write_version("p", 1, module, *specs)
    loaded = torch.jit.load(str(folder / "policy.pt"))
    np.testing.assert_allclose(reference(loaded, obs_batch), reference(module, obs_batch), rtol=1e-6)


def test_multiple_inputs_outputs_and_dtypes(tmp_path):
    obs = (Spec("obs", np.float32, (4,)), Spec("mode", np.int64, (1,)))
    act = (Spec("move", np.float32, (2,)), Spec("next_mode", np.int64, (1,)))
    ModelRepository(tmp_path).write_version("two", 1, TwoHeads(), obs, act)
    config = (tmp_path / "two" / "config.pbtxt").read_text()
    positions = [config.index(f'"{name}"') for name in ("obs", "mode", "move", "next_mode")]
    assert positions == sorted(positions)
    assert '{ name: "mode" data_type: TYPE_INT64 dims: [ 1 ] }' in config


def test_trace_fallback(tmp_path):
    obs, act = (Spec("obs", np.float32, (3,)),), (Spec("action", np.float32, (2,)),)
    module = NotScriptable().train()
    with pytest.raises(Exception, match="variable number of arguments"):
        torch.jit.script(module)
    folder = ModelRepository(tmp_path).write_version("traced", 1, module, obs, act)
    x = np.ones((3, 3), np.float32)
    np.testing.assert_allclose(torch.jit.load(str(folder / "policy.pt"))(torch.from_numpy(x)).numpy(),
                               np.sin(x[:, :2]), rtol=1e-6)
    assert module.training  # the caller's module is left as it was


@pytest.mark.parametrize(("model", "version", "needle"), [
    ("../escape", 1, "'../escape'"), ("", 1, "''"), ("a/b", 1, "'a/b'"), (".hidden", 1, "'.hidden'"),
    ("ok", 0, "version 0"), ("ok", -2, "version -2"), ("ok", "1", "version '1'"),
    ("ok", True, "version True"),
])
def test_bad_model_or_version(tmp_path, mlp, specs, model, version, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        ModelRepository(tmp_path).write_version(model, version, mlp(0), *specs)
    assert not any(tmp_path.iterdir())


def test_existing_version_is_refused(tmp_path, mlp, specs):
    repo = ModelRepository(tmp_path)
    repo.write_version("p", 2, mlp(0), *specs)
    before = (tmp_path / "p" / "2" / "policy.pt").read_bytes()
    with pytest.raises(FileExistsError, match="version 2 of model 'p'"):
        repo.write_version("p", 2, mlp(1), *specs)
    assert (tmp_path / "p" / "2" / "policy.pt").read_bytes() == before


def test_output_shape_mismatch_names_the_output(tmp_path, mlp, specs):
    obs, _ = specs
    with pytest.raises(ValueError, match=r"output 'action' has shape \[2, 2\] .* expected \[2, 5\]"):
        ModelRepository(tmp_path).write_version("p", 1, mlp(0), obs, (Spec("action", np.float32, (5,)),))
    assert ModelRepository(tmp_path).versions("p") == []


def test_output_dtype_and_count_mismatch(tmp_path, mlp, specs):
    obs, _ = specs
    with pytest.raises(ValueError, match="output 'action' has dtype float32, expected float64"):
        ModelRepository(tmp_path).write_version("p", 1, mlp(0), obs, (Spec("action", np.float64, (2,)),))
    two = (Spec("a", np.float32, (2,)), Spec("b", np.float32, (2,)))
    with pytest.raises(ValueError, match=r"returns 1 tensors, action spec names \['a', 'b'\]"):
        ModelRepository(tmp_path).write_version("p", 1, mlp(0), obs, two)


def test_input_shape_mismatch(tmp_path, mlp, specs):
    _, act = specs
    with pytest.raises(ValueError, match=r"fails on zero observations of shapes \[\[2, 4\]\]"):
        ModelRepository(tmp_path).write_version("p", 1, mlp(0), (Spec("obs", np.float32, (4,)),), act)


def test_bad_specs(tmp_path, mlp, specs):
    obs, act = specs
    repo = ModelRepository(tmp_path)
    with pytest.raises(ValueError, match="observation_spec is empty"):
        repo.write_version("p", 1, mlp(0), (), act)
    with pytest.raises(ValueError, match="'obs' is used twice"):
        repo.write_version("p", 1, mlp(0), obs, (Spec("obs", np.float32, (2,)),))
    with pytest.raises(ValueError, match="tensor 'obs' has an empty shape"):
        repo.write_version("p", 1, mlp(0), (Spec("obs", np.float32, ()),), act)
    with pytest.raises(ValueError, match="tensor name 'bad name'"):
        repo.write_version("p", 1, mlp(0), (Spec("bad name", np.float32, (3,)),), act)
    with pytest.raises(TypeError, match="must be a torch.nn.Module, got str"):
        repo.write_version("p", 1, "not a module", obs, act)
    with pytest.raises(ValueError, match="max_batch_size 0"):
        repo.write_version("p", 1, mlp(0), obs, act, max_batch_size=0)


def test_spec_change_between_versions_is_refused(tmp_path, mlp, specs):
    obs, act = specs
    repo = ModelRepository(tmp_path)
    repo.write_version("p", 1, mlp(0), obs, act)
    renamed = (Spec("act", np.float32, (2,)),)
    with pytest.raises(ValueError, match="specs of version 2 differ"):
        repo.write_version("p", 2, mlp(0), obs, renamed)
    assert repo.versions("p") == [1]
