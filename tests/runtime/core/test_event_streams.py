"""Event streams left open for a long time: a reader that never reads costs a bounded window, a
principal's stream holds only its own events (never another tenant's, not even in memory), an
idle stream waits on the store instead of reading it, and a dropped stream is gone at once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from records import a_call, ev

from blade_runtime import Principal, Runtime
from blade_runtime.core.events import Subscription
from blade_runtime.core.store import Event, Store, now


def _settle_many(store: Store, count: int, run_id: str, tenant: str = "", owner: str = "") -> None:
    for _ in range(count):
        call = a_call(run_id=run_id, tenant=tenant)
        call.principal = owner
        store.begin(call, ev(call, "started"))
        store.settle(call.claim, None, ev(call, "result"))


async def _take(subscription: Subscription, count: int, limit_s: float = 20) -> list[Any]:
    taken = []
    iterator = subscription.__aiter__()
    while len(taken) < count:
        taken.append(await asyncio.wait_for(iterator.__anext__(), limit_s))
    return taken


def test_a_reader_that_does_not_read_holds_a_window_and_loses_nothing(store: Store) -> None:
    """Another process commits 250 events while the reader takes none: the subscription holds
    at most its window (it reads the store a page at a time as room is made), then hands out
    every event once, in commit order."""
    if not store.durable:
        return  # nothing outside this process writes to a memory store (the next test)

    async def scenario() -> tuple[int, list[int]]:
        runtime = Runtime(store=store)
        subscription = runtime.subscribe("r-window", after=0, window=40)
        reading = asyncio.ensure_future(_take(subscription, 1))  # the pump runs
        await asyncio.sleep(0.2)
        await asyncio.to_thread(_settle_many, store, 125, "r-window")
        first = await reading
        await asyncio.sleep(0.5)  # time enough to read all 249 others, were it unbounded
        held = subscription._queue.qsize()
        rest = await _take(subscription, 249)
        await subscription.aclose()
        await runtime.close()
        return held, [e.seq for e in first + rest]

    held, seqs = asyncio.run(scenario())
    assert held <= 40
    assert seqs == sorted(set(seqs)) and len(seqs) == 250


def test_a_principal_s_stream_holds_only_its_own_events(store: Store) -> None:
    """Events carry whose they are: a principal's subscription (this process's events and what
    the store holds alike) never holds another tenant's, nor another principal's of its tenant;
    an anonymous call's events are its tenant's."""
    whose = (("acme", "alice"), ("acme", ""), ("acme", "bob"), ("globex", "carol"))

    async def scenario() -> tuple[list[Any], int]:
        runtime = Runtime(store=store)
        alice = Principal("alice", "acme")
        subscription = runtime.subscribe("r-mine", after=0, principal=alice)
        for tenant, owner in whose:  # this process's transient events
            runtime.events.publish(
                Event("r-mine", f"c-{owner}", "progress", {}, now(), 0, tenant, owner)
            )
        for tenant, owner in whose:  # stored ones, as another process commits them
            await asyncio.to_thread(_settle_many, store, 1, "r-mine", tenant, owner)
        expected = 2 + (4 if store.durable else 0)
        taken = await _take(subscription, expected)
        await asyncio.sleep(0.3)
        left = subscription._queue.qsize()
        subscription.drop()
        await runtime.close()
        return taken, left

    taken, left = asyncio.run(scenario())
    assert {(e.tenant, e.principal) for e in taken} == {("acme", "alice"), ("acme", "")}
    assert left == 0  # nothing of bob's or carol's waits behind them either


def test_an_idle_stream_waits_instead_of_reading_and_a_dropped_one_is_gone(store: Store) -> None:
    reads: list[float] = []

    async def scenario() -> tuple[int, bool]:
        runtime = Runtime(store=store)
        counting = store.events

        def events(*args: Any, **kwargs: Any) -> Any:
            reads.append(time.monotonic())
            return counting(*args, **kwargs)

        store.events = events  # type: ignore[method-assign]
        try:
            subscription = runtime.subscribe("r-idle", after=0)
            reading = asyncio.ensure_future(_take(subscription, 1, limit_s=60))
            await asyncio.sleep(0.3)
            reads.clear()
            await asyncio.sleep(2.0)
            idle_reads = len(reads)
            subscription.drop()
            gone = not runtime.events.active
            reading.cancel()
            await runtime.close()
            return idle_reads, gone
        finally:
            del store.events  # type: ignore[method-assign]

    idle_reads, gone = asyncio.run(scenario())
    if store.url.startswith("postgresql"):
        assert idle_reads <= 4  # a NOTIFY would wake it; else a look every second
    elif store.durable:
        assert idle_reads <= 60  # SQLite polls its run's index every 50 ms
    else:
        assert idle_reads == 0
    assert gone
