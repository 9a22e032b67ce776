"""Fail closed: callbacks (hooks, permission policies) that outlive their budget block their event.

A callback runs in a task of its own, so a budget holds even when the callback swallows
cancellation. Past the budget (or when the call is cancelled) the task is cancelled and given a
short grace; one still running after it is left to finish on its own, and until it does, every
later dispatch of the same event is refused: the runtime does not start more work behind a
callback it could not stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from blade_runtime.core.context import CancellationSignal

T = TypeVar("T")

GRACE_S = 0.05
"""How long a cancelled callback may take to stop before it counts as still running."""


class Overran(Exception):
    """The callback did not finish within its budget (or before its call was cancelled)."""

    def __init__(self, event: str, why: str) -> None:
        super().__init__(f"{event}: {why}")
        self.event = event


class Blocked(Overran):
    """An earlier callback of the event is still running past its budget: refused at once."""


class Guard:
    """The callbacks still running past their budget, by event."""

    def __init__(self) -> None:
        self._stuck: dict[str, set[asyncio.Task[Any]]] = {}

    def blocked(self, event: str) -> bool:
        return bool(self._stuck.get(event))

    def stuck(self) -> list[asyncio.Task[Any]]:
        return [task for tasks in self._stuck.values() for task in tasks]

    def stuck_events(self) -> list[str]:
        """The events with a callback still running past its budget."""
        return [event for event, tasks in self._stuck.items() if tasks]

    async def run(
        self,
        event: str,
        awaitable: Awaitable[T],
        timeout_s: float | None,
        signal: CancellationSignal | None = None,
        stops: CancellationSignal | None = None,
    ) -> T:
        """``awaitable``'s result, or ``Overran`` (``Blocked`` before it even starts).
        ``stops``: the callback's own signal, cancelled when its budget runs out (before its
        task is), so that a callback that checks it stops of its own accord."""
        if self._stuck.get(event):
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise Blocked(event, "an earlier callback is still running past its budget")
        task = asyncio.ensure_future(awaitable)
        waiters: set[asyncio.Future[Any]] = {task}
        cancelled = None
        if signal is not None:
            cancelled = asyncio.ensure_future(signal.wait())
            waiters.add(cancelled)
        try:
            await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await self._stop(event, task)
            raise
        finally:
            if cancelled is not None:
                cancelled.cancel()
        if task.done():
            return task.result()
        if stops is not None:  # its own signal first: a callback that honours it ends here
            stops.cancel(f"the {event} callback ran past its budget of {timeout_s} s")
            await asyncio.wait({task}, timeout=GRACE_S)
        if not task.done():
            await self._stop(event, task)
        elif not task.cancelled():
            task.exception()  # too late all the same: what it raised is not reported twice
        why = "its call was cancelled" if signal is not None and signal.cancelled else "budget"
        raise Overran(event, f"the callback did not finish ({why})")

    async def _stop(self, event: str, task: asyncio.Task[Any]) -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait({task}, timeout=GRACE_S)
        if not task.done():
            stuck = self._stuck.setdefault(event, set())
            stuck.add(task)
            task.add_done_callback(stuck.discard)
