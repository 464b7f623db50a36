"""`with` for what starts and stops: a mixin, so a class writes only its `start` and its `stop` (or `close`).

    class Server(Started):       # `with Server() as s:` calls s.start(), and s.stop() however the block ends
        def start(self): ...
        def stop(self): ...

    class Store(Closing):        # `with Store() as s:` calls s.close() however the block ends
        def close(self): ...
"""

from __future__ import annotations

from typing import Self


class Started:
    """`with x:` calls `x.start()` on entry and `x.stop()` on exit; `as` gives `x`."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


class Closing:
    """`with x:` gives `x` and calls `x.close()` on exit."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class AsyncStarted:
    """`async with x:` awaits `x.start()` on entry and `x.close()` on exit; `as` gives `x`."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()
