"""Retention: how long settled history stays in the store, and the sweep that deletes the rest.

A settled call older than the policy goes with everything of its own: its actions, ToolData,
events, files and triggers (``Store.prune``). Work that may still need a runtime (running,
resumable, suspended or pending calls) is never deleted, however old. The sweep deletes in
batches, each one short transaction run off the event loop, so that workers writing meanwhile
wait for no long lock (DBOS keeps workflow history the same way: a time and a row threshold).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from blade_runtime.core.storage import StoreAccess
from blade_runtime.core.store import Pruned, Store, clock

BATCH = 500
"""Settled calls deleted per transaction."""

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


@dataclass(frozen=True, slots=True)
class Retention:
    """What settled history to keep: calls settled within ``older_than_s`` seconds, and (of the
    rest, when given) the newest ``keep``; either may be None (no limit of that kind). The
    runtime's recovery loop sweeps every ``every_s`` seconds."""

    older_than_s: float | None = None
    keep: int | None = None
    every_s: float = 60.0

    def __post_init__(self) -> None:
        if self.older_than_s is None and self.keep is None:
            raise ValueError("Retention keeps everything: give older_than_s, keep, or both")
        if self.older_than_s is not None and self.older_than_s < 0:
            raise ValueError("Retention(older_than_s=...) is a number of seconds, at least 0")
        if self.keep is not None and self.keep < 0:
            raise ValueError("Retention(keep=...) is a number of calls, at least 0")
        if self.every_s <= 0:
            raise ValueError("Retention(every_s=...) is a positive number of seconds")


def duration_s(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` or a number of seconds, as seconds
    (``ValueError`` naming what it takes)."""
    found = _DURATION.fullmatch(text)
    if found is None:
        raise ValueError(
            f"{text!r} is not a duration: a number and a unit, s, m, h, d or w (30d, 12h)"
        )
    return float(found.group(1)) * _UNITS[found.group(2)]


def prune_all(
    store: Store, older_than_s: float | None, keep: int | None, *, dry_run: bool = False
) -> Pruned:
    """Every batch the policy lets go, on the calling thread (the operators' CLI)."""
    before = None if older_than_s is None else clock() - older_than_s
    if dry_run:  # nothing is deleted, so one batch as large as the store says all
        return store.prune(settled_before=before, keep=keep, limit=2**31 - 1, dry_run=True)
    total = Pruned()
    while True:
        done = store.prune(settled_before=before, keep=keep, limit=BATCH)
        total += done
        if done.calls < BATCH:
            return total


async def sweep(io: StoreAccess, retention: Retention) -> Pruned:
    """Delete what ``retention`` lets go, a batch per transaction in the store's threads,
    letting the event loop run between batches."""
    before = None if retention.older_than_s is None else clock() - retention.older_than_s
    total = Pruned()
    while True:
        done: Pruned = await io.thread(
            io.store.prune, settled_before=before, keep=retention.keep, limit=BATCH
        )
        total += done
        if done.calls < BATCH:
            return total
        await asyncio.sleep(0)
