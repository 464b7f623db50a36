"""The policy-format registry (inference_server.formats): every format in FORMATS passes the same contract
(export -> detect -> check -> run -> weights -> reweight, on a real torch module), a file of one format is
refused by the others, and an unknown format or file is named in the error. A new format gets these tests by
its registry line; serving it in Triton is tests/inference_server/test_import.py's part."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inference_server.artifact import ArtifactError
from inference_server.formats import (
    ARCHITECTURE,
    FORMATS,
    ONNX,
    TORCHSCRIPT,
    PolicyFormat,
    check_artifact,
    detect,
    format_named,
    served_in,
)
from inference_server.formats.torchscript import script

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.* in torch >= 2.9


def test_each_format_is_registered_once_with_every_member_of_the_protocol():
    members = set(PolicyFormat.__annotations__) | {n for n in vars(PolicyFormat) if not n.startswith("_")}
    assert list(FORMATS) == ["torchscript", "onnx"] and ARCHITECTURE is TORCHSCRIPT
    for name, fmt in FORMATS.items():
        assert fmt.name == name and format_named(name) is fmt
        assert not members - set(dir(fmt)), f"{name} lacks {sorted(members - set(dir(fmt)))}"
        assert fmt.wrapper.is_file() and all(p.is_file() for p in fmt.versions_model.values())
    assert len({f.file for f in FORMATS.values()}) == len(FORMATS)


def test_an_unknown_format_or_file_is_named_in_the_error(specs):
    with pytest.raises(ArtifactError, match=r"format 'keras' must be one of \('torchscript', 'onnx'\)"):
        format_named("keras")
    with pytest.raises(ValueError, match="format 'keras'"):  # ArtifactError is a ValueError
        check_artifact("keras", b"", *specs)
    with pytest.raises(ArtifactError, match=r"neither a TorchScript archive nor an ONNX model \(12 bytes\)"):
        detect(b"not a policy")


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=list(FORMATS))
def test_a_format_exports_detects_checks_runs_and_reweights_its_own_file(fmt, mlp, specs, reference, obs_batch,
                                                                         tmp_path):
    obs, act = specs
    module = mlp(0).eval()
    data = fmt.export(script(module, obs), obs, act)
    assert detect(data) is fmt
    check_artifact(fmt.name, data, obs, act)
    declared = fmt.read_specs(data)
    assert declared is None or [s.name for s in declared[0] + declared[1]] == ["obs", "action"]
    for other in FORMATS.values():
        if other is not fmt:
            with pytest.raises(ArtifactError):
                other.check(data, obs, act)
    out = fmt.run(data, {"obs": obs_batch}, obs, act)
    np.testing.assert_allclose(out["action"], reference(module, obs_batch), rtol=1e-5, atol=1e-5)
    weights = fmt.weights(data)
    assert weights.keys() == module.state_dict().keys()
    torch.testing.assert_close(weights["net.0.weight"], module.state_dict()["net.0.weight"])

    base, into, moved = tmp_path / f"base-{fmt.file}", tmp_path / fmt.file, mlp(1).eval()
    base.write_bytes(data)
    fmt.reweight(base, script(moved, obs), into)
    out = fmt.run(into.read_bytes(), {"obs": obs_batch}, obs, act)
    np.testing.assert_allclose(out["action"], reference(moved, obs_batch), rtol=1e-5, atol=1e-5)


def test_a_version_folder_is_served_in_the_format_whose_file_it_holds(tmp_path):
    (tmp_path / ARCHITECTURE.file).write_bytes(b"")
    assert served_in(tmp_path) is TORCHSCRIPT  # a module-written version served by torch
    (tmp_path / ONNX.file).write_bytes(b"")
    assert served_in(tmp_path) is ONNX  # ... or beside its TorchScript, by onnxruntime
    for fmt in FORMATS.values():
        folder = tmp_path / fmt.name
        folder.mkdir()
        (folder / fmt.file).write_bytes(b"")
        assert served_in(folder) is fmt  # an imported file
