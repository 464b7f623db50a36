"""Spec.bounds()/Spec.safe_value(): the one reading of a spec's low/high that sim, the gate and the gateway use."""

from __future__ import annotations

import numpy as np
import pytest

from bridge.gate.checks import action_sanity, with_bounds
from bridge.gateway.session.vector import _safe_rows
from protos.codec import Spec, TensorError
from sim.env import bounds
from sim.vector import safe_action

# per element on a 2-D shape: the gate's old copy could not broadcast 4 values to (2, 2)
GRID = Spec("a", np.float32, (2, 2), low=(0.5, -1.0, -2.0, 0.25), high=(1.0, 1.0, 2.0, 3.0))


def test_sim_gate_and_gateway_read_the_same_bounds_and_safe_action():
    low, high = GRID.bounds()
    assert low.tolist() == [[0.5, -1.0], [-2.0, 0.25]] and high.tolist() == [[1.0, 1.0], [2.0, 3.0]]
    assert all((a == b).all() for a, b in zip(bounds(GRID), (low, high), strict=True))
    expected = [[0.5, 0.0], [0.0, 0.25]]
    assert GRID.safe_value().tolist() == expected and GRID.safe_value().dtype == np.float32
    assert safe_action([GRID], 3)["a"].tolist() == [expected] * 3
    assert _safe_rows((GRID,), 3)["a"].tolist() == [expected] * 3
    # the gate judges against the same bounds: the safe action passes, one step outside fails
    safe = np.asarray([expected], np.float32)
    assert action_sanity({"a": safe}, [GRID]).passed
    assert not action_sanity({"a": safe - 1.0}, [GRID]).passed
    merged = with_bounds((Spec("a", np.float32, (2, 2)),), [(GRID,)])[0]
    assert merged.low == GRID.low and merged.high == GRID.high


def test_unbounded_spec():
    spec = Spec("a", np.float64, (3,))
    assert not spec.bounded and bounds(spec) is None
    low, high = spec.bounds()
    assert np.isneginf(low).all() and np.isposinf(high).all()
    assert spec.safe_value().tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(("low", "high", "message"), [((0.0, 1.0), (), "2 low bounds for shape"),
                                                      ((2.0,), (1.0,), "low bound above high bound")])
def test_bad_bounds_name_the_tensor(low, high, message):
    with pytest.raises(TensorError, match=f"a: {message}"):
        Spec("a", np.float32, (3,), low=low, high=high).bounds()
