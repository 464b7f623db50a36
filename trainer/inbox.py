"""What a receiving thread hands to the training loop: whole batches in, at most `max_items` out.

    inbox = Inbox()
    inbox.put([t1, t2, t3])                  # the receiving thread, per batch
    inbox.take(max_items=2)                  # the loop: [t1, t2]; t3 waits for the next take
    inbox.take(timeout=0.5)                  # [t3], or [] after 0.5 s with nothing
"""

from __future__ import annotations

import queue
from typing import Generic, TypeVar

__all__ = ["Inbox"]

T = TypeVar("T")


class Inbox(Generic[T]):
    """A queue of batches; `take` returns what came (waiting up to `timeout` for the first batch) and keeps
    anything beyond `max_items` for the next take, in order."""

    def __init__(self) -> None:
        self._batches: queue.Queue[list[T]] = queue.Queue()
        self._pending: list[T] = []

    def put(self, batch: list[T]) -> None:
        self._batches.put(batch)

    def take(self, *, timeout: float = 0.0, max_items: int | None = None) -> list[T]:
        items, self._pending = self._pending, []
        try:
            if not items:
                items = list(self._batches.get(timeout=timeout) if timeout > 0 else self._batches.get_nowait())
            while max_items is None or len(items) < max_items:
                items.extend(self._batches.get_nowait())
        except queue.Empty:
            pass
        if max_items is not None and len(items) > max_items:
            items, self._pending = items[:max_items], items[max_items:]
        return items
