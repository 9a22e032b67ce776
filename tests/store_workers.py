"""What the store conformance suite runs in other processes (forked.py: each a process of its own).

Each worker opens the store from its URL, waits at a barrier so that all start together, does its
part and puts what it won on a queue.
"""

from __future__ import annotations

import time
from typing import Any

from blade_runtime.core.store import (
    ActionAlreadyResolved,
    Event,
    Resolution,
    now,
)
from blade_runtime.stores.urls import open_store


def resolve_all(
    url: str, worker: int, actions: list[tuple[str, str]], barrier: Any, out: Any
) -> None:
    """Try to resolve every action; report the ones this worker won."""
    store = open_store(url)
    won: list[str] = []
    try:
        barrier.wait(timeout=60)
        for action_id, call_id in actions:
            resolution = Resolution("submitted", now(), resume={"by": worker})
            event = Event("run-1", call_id, "resumed", {"by": worker}, now())
            try:
                store.resolve(action_id, resolution, event)
            except ActionAlreadyResolved:
                continue
            won.append(action_id)
    finally:
        store.close()
    out.put((worker, won))


def sweep(url: str, worker: int, barrier: Any, out: Any) -> None:
    """Claim in small sweeps until nothing is left; report every call this worker claimed."""
    store = open_store(url)
    claimed: list[str] = []
    try:
        barrier.wait(timeout=60)
        while True:
            got = store.claim(f"worker-{worker}", 30.0, limit=3)
            if not got:
                break
            claimed += [c.call.call_id for c in got]
    finally:
        store.close()
    out.put((worker, claimed))


def hold(url: str, owner: str, ready: Any) -> None:
    """Attach as ``owner`` and stay alive until killed."""
    store = open_store(url)
    store.attach(owner)
    ready.set()
    time.sleep(600)
