"""assign(): pins, then canary (labels or a stable fraction), then live; the same answer in every process."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

from bridge.registry import Rollout, assign, session_hash, shadow_of


def rollout(**kw) -> Rollout:
    base = dict(policy="hopper", live=3, previous_live=2, shadow=None, canary=4, canary_fraction=0.25,
                canary_labels={}, pins={})
    return Rollout(**{**base, **kw})


IDS = [f"robot-{i}/env-{i % 7}" for i in range(4000)]


def test_fraction_of_sessions_in_the_canary():
    for fraction in (0.0, 0.05, 0.25, 0.5, 1.0):
        got = [assign(rollout(canary_fraction=fraction), s, {}) for s in IDS]
        assert set(got) <= {3, 4}
        assert abs(got.count(4) / len(IDS) - fraction) <= 0.03, (fraction, got.count(4))
    assert all(assign(rollout(canary=None, canary_fraction=1.0), s, {}) == 3 for s in IDS[:100])


def test_raising_the_fraction_only_adds_sessions():
    small = {s for s in IDS if assign(rollout(canary_fraction=0.1), s, {}) == 4}
    large = {s for s in IDS if assign(rollout(canary_fraction=0.3), s, {}) == 4}
    assert small < large


def test_stable_across_processes():
    """Another interpreter (another hash seed) puts the same sessions in the canary."""
    here = [session_hash("hopper", s) for s in IDS[:500]]
    code = ("import json, runpy, sys; session_hash = runpy.run_path(sys.argv[1])['session_hash']; "
            "print(json.dumps([session_hash('hopper', s) for s in json.load(sys.stdin)]))")
    out = subprocess.run([sys.executable, "-c", code, inspect.getfile(session_hash)], input=json.dumps(IDS[:500]),
                         capture_output=True, text=True, check=True, timeout=120,
                         env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert json.loads(out.stdout) == here
    assert len(set(here)) == 500 and all(0 <= h < 1 for h in here)
    other_policy = [session_hash("walker", s) for s in IDS[:500]]
    assert other_policy != here, "each policy draws its own canary sessions"


def test_label_canary():
    r = rollout(canary_fraction=1.0, canary_labels={"robot": "arm_2", "site": "lab"})
    assert assign(r, "s1", {"robot": "arm_2", "site": "lab", "extra": "x"}) == 4
    assert assign(r, "s1", {"robot": "arm_2"}) == 3, "every canary label must match"
    assert assign(r, "s1", {"robot": "arm_1", "site": "lab"}) == 3
    assert assign(r, "s1", {}) == 3, "labels replace the fraction"


def test_pins_come_first():
    r = rollout(canary_fraction=1.0, pins={"session=s1": 2, "robot=arm_2": 1, "site=lab": 5})
    assert assign(r, "s1", {"robot": "arm_2"}) == 2, "a session pin beats a label pin"
    assert assign(r, "s2", {"robot": "arm_2"}) == 1, "a label pin beats the canary"
    assert assign(r, "s2", {"site": "lab", "robot": "arm_2"}) == 1, "several label pins: the first by selector"
    assert assign(r, "s2", {"robot": "arm_3"}) == 4
    assert assign(rollout(canary=None, live=None), "s2", {}) is None
    r = rollout(canary=None, pins={"site=Lab A=west": 1})
    assert assign(r, "s3", {"site": "Lab A=west"}) == 1, "a pin splits at the first '='"
    assert assign(r, "s3", {"site=Lab A": "west"}) == 3, "a label key with '=' never matches a pin"


def test_shadow_of():
    assert shadow_of(rollout(shadow=5)) == 5 and shadow_of(rollout()) is None
