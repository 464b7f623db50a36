"""Which shard a session's transitions belong to: `Experience.Subscribe` (the gateway side) and a trainer rank
reading the NATS stream (`trainer.nats_source`) must split sessions the same way.

    >>> [shard_of(f"robot-{i}", 2) for i in range(6)], shard_of("robot-0", 1)
    ([0, 0, 1, 0, 1, 1], 0)
"""

from __future__ import annotations

import hashlib

__all__ = ["shard_of"]


def shard_of(session: str, num_shards: int) -> int:
    """The shard a session's transitions go to: the first 8 bytes (little-endian) of the BLAKE2b-64
    digest of its UTF-8 name, modulo num_shards. Stable across processes and Python versions (unlike
    hash()), and well mixed (crc32 is linear: "robot-0".."robot-3" all land on shard 0 of 2)."""
    if num_shards <= 1:
        return 0
    return int.from_bytes(hashlib.blake2b(session.encode(), digest_size=8).digest(), "little") % num_shards
