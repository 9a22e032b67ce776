"""A run's event subscription: its store reader ends when cancelled, whenever that comes."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from blade_runtime.core.events import EventHub


class Restless:
    """A durable store whose runs always have news: the reader never stops waking."""

    durable = True

    def head(self, run_id: str) -> int:
        return 0

    def events(self, run_id: str, after: int = 0) -> list[Any]:
        return []

    async def changed(self, timeout_s: float) -> None:
        await asyncio.sleep(0)


def test_a_subscriptions_reader_ends_when_cancelled_at_any_point_of_its_loop() -> None:
    """asyncio.run cancels a left-over reader once: a cancellation that reached it while it
    cleaned up after a wake-up was swallowed, and the reader read the store forever (a test
    run hung in asyncio.run's teardown)."""

    async def trial(delay: float) -> bool:
        subscription = EventHub(Restless()).subscribe("r")  # type: ignore[arg-type]
        reading = asyncio.ensure_future(subscription.__anext__())
        await asyncio.sleep(0)
        pump = subscription._pump
        assert pump is not None
        await asyncio.sleep(delay)
        for _ in range(random.randint(0, 20)):
            await asyncio.sleep(0)  # a point anywhere in the reader's loop
        pump.cancel()
        await asyncio.wait({pump}, timeout=1.0)
        ended = pump.done()
        if not ended:  # let it go, so that this test fails rather than hangs in teardown
            subscription._closed = True
            pump.cancel()
            await asyncio.wait({pump}, timeout=1.0)
        reading.cancel()
        return ended

    async def main() -> list[bool]:
        return [await trial(random.random() / 1000) for _ in range(200)]

    random.seed(7)
    assert all(asyncio.run(main()))
