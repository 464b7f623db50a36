"""KEY=VALUE parsing, as every command line writes it: repeated (`--label robot=arm_2 --label site=lab`)
or comma-joined (`--labels robot=arm_2,site=lab`), or both at once.

    >>> parse_pairs(["robot=arm_2", "site=lab,cell=3"])
    {'robot': 'arm_2', 'site': 'lab', 'cell': '3'}
    >>> parse_pairs("robot=arm_2,site=lab")
    {'robot': 'arm_2', 'site': 'lab'}
    >>> parse_pairs(["robot"], what="--label")
    Traceback (most recent call last):
    ...
    ValueError: --label 'robot' must be KEY=VALUE
    >>> split_pair("hopper=rewards/hopper.yaml", what="--rewards")
    ('hopper', 'rewards/hopper.yaml')
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["parse_pairs", "split_pair"]


def split_pair(item: str, *, what: str = "item", commas: bool = False) -> tuple[str, str]:
    """One KEY=VALUE into (key, value); the value may itself hold '='. Empty key or value is refused,
    naming `what`."""
    key, sep, value = item.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key or not value:
        raise ValueError(f"{what} {item!r} must be KEY=VALUE")
    return key, value


def parse_pairs(items: str | Iterable[str] | None, *, what: str = "label") -> dict[str, str]:
    """KEY=VALUE pairs from one string or several, each comma-separated or not, into a dict (later wins).

    None or empty gives {}. A pair without '=' or with an empty side raises ValueError naming it.
    """
    if items is None:
        return {}
    if isinstance(items, str):
        items = [items]
    pairs: dict[str, str] = {}
    for item in items:
        for part in item.split(","):
            if part.strip():
                key, value = split_pair(part, what=what)
                pairs[key] = value
    return pairs
