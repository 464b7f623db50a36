"""Parse and validate a reward config into frozen `TermSpec`s; its canonical form and version.

    >>> terms = parse_terms({"reward": {"terms": [{"type": "alive_bonus", "weight": 2}]}})
    >>> terms[0].name, terms[0].weight
    ('alive_bonus', 2.0)
    >>> version(terms) == version(parse_terms({"reward": {"terms": [{"weight": 2.0, "type": "alive_bonus"}]}}))
    True
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["SEMANTICS", "RewardConfigError", "TermSpec", "TYPES", "parse_terms", "canonical", "version"]


class RewardConfigError(ValueError):
    """A reward config (or its fit to a session's specs) is wrong; names the term, its index and the field.

    `term_index` (0-based, as listed), `term_name` and `field` are None where they do not apply.
    """

    def __init__(self, detail: str, *, term_index: int | None = None, term_name: str | None = None,
                 field: str | None = None, source: str | None = None):
        where = f"reward term {term_index} ({term_name or '?'}): " if term_index is not None else "reward config: "
        super().__init__(f"{source + ': ' if source else ''}{where}{detail}")
        self.term_index, self.term_name, self.field, self.source = term_index, term_name, field, source


_REQUIRED = object()
_VECTORS = ("goal", "low", "high")
_CONDITION = {"observation": _REQUIRED, "indices": None, "goal": None, "below": None, "above": None,
              "bonus": 0.0, "terminate": False}
# type -> {field: default}; _REQUIRED marks a field without a default. Every type also takes `name`.
TYPES: dict[str, dict[str, Any]] = {
    "env_reward": {"weight": 1.0},
    "alive_bonus": {"weight": 1.0},
    "goal_distance": {"observation": _REQUIRED, "indices": None, "goal": _REQUIRED, "weight": _REQUIRED},
    "action_magnitude": {"action": _REQUIRED, "indices": None, "weight": _REQUIRED},
    "action_smoothness": {"action": _REQUIRED, "indices": None, "weight": _REQUIRED},
    "joint_limit_proximity": {"observation": _REQUIRED, "indices": None, "low": _REQUIRED, "high": _REQUIRED,
                              "margin": 0.0, "weight": _REQUIRED},
    "success": dict(_CONDITION),
    "failure": dict(_CONDITION),
}
CONDITION_TYPES = ("success", "failure")


@dataclass(frozen=True)
class TermSpec:
    """One validated term. `tensor` and `role` ("observation" or "action") are None for terms that read none;
    `indices` None selects every element of the (flattened) tensor."""

    index: int
    name: str
    type: str
    weight: float = 1.0
    role: str | None = None
    tensor: str | None = None
    indices: tuple[int, ...] | None = None
    goal: tuple[float, ...] | None = None
    low: tuple[float, ...] | None = None
    high: tuple[float, ...] | None = None
    margin: float = 0.0
    below: float | None = None
    above: float | None = None
    bonus: float = 0.0
    terminate: bool = False

    @property
    def width(self) -> int | None:
        """How many values the term selects, where the config says (indices or a vector); else None."""
        if self.indices is not None:
            return len(self.indices)
        return next((len(getattr(self, name)) for name in _VECTORS if getattr(self, name) is not None), None)

    def fields(self) -> dict[str, Any]:
        """The term's config fields with defaults filled in, as plain JSON values (its canonical form)."""
        out: dict[str, Any] = {"type": self.type, "name": self.name}
        for key in TYPES[self.type]:
            value = self.tensor if key in ("observation", "action") else getattr(self, key)
            out[key] = list(value) if isinstance(value, tuple) else value
        return out


def parse_terms(config: Any, *, source: str | None = None) -> tuple[TermSpec, ...]:
    """Validate a config mapping `{"reward": {"terms": [...]}}` (other top-level keys are left alone)."""
    def fail(detail: str) -> RewardConfigError:
        return RewardConfigError(detail, source=source)

    if not isinstance(config, Mapping) or "reward" not in config:
        raise fail(f"expected a mapping with a 'reward' section, got {_show(config)}")
    section = config["reward"]
    if not isinstance(section, Mapping):
        raise fail(f"'reward' must be a mapping with 'terms', got {_show(section)}")
    if set(section) - {"terms"}:
        raise fail(f"unknown key(s) {sorted(map(str, set(section) - {'terms'}))} in 'reward' (it takes: terms)")
    items = section.get("terms")
    if not isinstance(items, Sequence) or isinstance(items, str | bytes) or not items:
        raise fail(f"'reward.terms' must be a non-empty list of terms, got {_show(items)}")
    terms: list[TermSpec] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        term = _parse_term(i, item, source)
        if term.name in seen:
            raise RewardConfigError(f"field 'name': duplicate term name {term.name!r} (term {seen[term.name]} "
                                    f"has it too; set a distinct `name:`)", term_index=i, term_name=term.name,
                                    field="name", source=source)
        seen[term.name] = i
        terms.append(term)
    return tuple(terms)


def _parse_term(i: int, item: Any, source: str | None) -> TermSpec:
    label = item.get("type") if isinstance(item, Mapping) and isinstance(item.get("type"), str) else None

    def fail(field: str, detail: str, name: str | None = label) -> RewardConfigError:
        return RewardConfigError(f"field '{field}' {detail}", term_index=i, term_name=name, field=field,
                                 source=source)

    if not isinstance(item, Mapping):
        raise RewardConfigError(f"a term must be a mapping with a 'type', got {_show(item)}", term_index=i,
                                source=source)
    kind = item.get("type")
    if not isinstance(kind, str) or kind not in TYPES:
        raise fail("type", f"{'is required' if kind is None else 'has unknown type ' + _show(kind)}; "
                           f"known types: {', '.join(TYPES)}", name=None)
    name = item.get("name", kind)
    if not isinstance(name, str) or not name.strip():
        raise fail("name", f"must be a non-empty string, got {_show(name)}")
    schema = TYPES[kind]
    for key in item:
        if key not in schema and key not in ("type", "name"):
            raise fail(str(key), f"is not a field of {kind} (it takes: {', '.join(['name', *schema])})", name)
    values: dict[str, Any] = {}
    for key, default in schema.items():
        if key not in item or (item[key] is None and default is None):  # null: the default, as to_dict writes
            if default is _REQUIRED:
                raise fail(key, "is required", name)
            values[key] = default
            continue
        values[key] = _parse_value(key, item[key], lambda detail, key=key: fail(key, detail, name))
    _check_term(kind, values, lambda key, detail: fail(key, detail, name))
    role = "observation" if "observation" in schema else "action" if "action" in schema else None
    return TermSpec(index=i, name=name, type=kind, role=role, tensor=values.pop(role) if role else None,
                    **values)


def _parse_value(key: str, value: Any, fail) -> Any:
    if key in ("observation", "action"):
        if not isinstance(value, str) or not value:
            raise fail(f"must name a tensor (a non-empty string), got {_show(value)}")
        return value
    if key == "terminate":
        if not isinstance(value, bool):
            raise fail(f"must be true or false, got {_show(value)}")
        return value
    if key == "indices":
        if not isinstance(value, list) or not value:
            raise fail(f"must be a non-empty list of element indices, got {_show(value)}")
        for v in value:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise fail(f"must hold non-negative integers, got {_show(v)}")
        if len(set(value)) != len(value):
            raise fail(f"repeats an index: {value}")
        return tuple(value)
    if key in _VECTORS:
        if not isinstance(value, list) or not value:
            raise fail(f"must be a non-empty list of numbers, got {_show(value)}")
        return tuple(_number(v, fail) for v in value)
    return _number(value, fail)  # weight, margin, below, above, bonus


def _check_term(kind: str, v: dict[str, Any], fail) -> None:
    width = len(v["indices"]) if v.get("indices") is not None else None
    for key in _VECTORS:
        vec = v.get(key)
        if vec is None:
            continue
        if width is None:
            width = len(vec)
            first = key
        elif len(vec) != width:
            if v.get("indices") is not None:
                raise fail(key, f"has {len(vec)} values, indices select {width}")
            raise fail(key, f"has {len(vec)} values, '{first}' has {width}")
    if kind == "joint_limit_proximity":
        for j, (lo, hi) in enumerate(zip(v["low"], v["high"], strict=True)):
            if not lo < hi:
                raise fail("high", f"must exceed 'low' for every element; element {j}: low {lo}, high {hi}")
        if v["margin"] < 0:
            raise fail("margin", f"must be >= 0, got {v['margin']}")
        span = min(hi - lo for lo, hi in zip(v["low"], v["high"], strict=True))
        if 2 * v["margin"] >= span:
            raise fail("margin", f"{v['margin']} leaves no free range: twice the margin must be below the "
                                 f"narrowest range high - low = {span}")
    if kind in CONDITION_TYPES:
        if (v["below"] is None) == (v["above"] is None):
            raise fail("below", "or 'above' is required (exactly one: the condition is distance < below, "
                                "or distance > above)")
        if v["below"] is not None and v["below"] <= 0:
            raise fail("below", f"must be > 0 (a distance is never below {v['below']})")
        if v["above"] is not None and v["above"] < 0:
            raise fail("above", f"must be >= 0, got {v['above']}")


def _number(value: Any, fail) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        hint = ""
        if isinstance(value, str):
            try:
                float(value)
                hint = " (YAML reads a number like 1e-2 as text; write 1.0e-2)"
            except ValueError:
                pass
        raise fail(f"must be a number, got {_show(value)}{hint}")
    if not math.isfinite(value):
        raise fail(f"must be finite, got {value}")
    return float(value) + 0.0  # -0.0 -> 0.0, so equal values hash alike


def _show(value: Any) -> str:
    text = repr(value)
    return (text if len(text) <= 60 else text[:57] + "...") + f" ({type(value).__name__})"


# Bump when what a term computes changes for the same config, so that versions tell the two apart.
SEMANTICS = 1


def canonical(terms: Sequence[TermSpec]) -> str:
    """The config's content as compact JSON with sorted keys and defaults filled in, plus `SEMANTICS`:
    what `version` hashes."""
    return json.dumps({"reward": {"terms": [t.fields() for t in terms]}, "semantics": SEMANTICS}, sort_keys=True,
                      separators=(",", ":"), allow_nan=False)


def version(terms: Sequence[TermSpec]) -> str:
    """"sha256:" and the first 16 hex digits of the hash of `canonical(terms)`."""
    return "sha256:" + hashlib.sha256(canonical(terms).encode()).hexdigest()[:16]
