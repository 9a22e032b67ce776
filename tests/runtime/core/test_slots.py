"""Concurrency slots and resource locks (seed 000, "Interruption"), through the public API.

"Concurrency-slot and same-file lock waits also occur before the tool timeout starts, but both
observe the active Request signal. Cancellation removes a queued waiter without consuming
capacity or disturbing FIFO order. If resource grant and cancellation happen in the same turn,
the pipeline rechecks the signal and releases every acquired lease before returning the
cancellation result." In one process on every store, across processes sharing a SQLite file or
a PostgreSQL server, and past a worker killed while it holds a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import add_spec, build_and_import, spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slot_tools import Done, Work, most_at_once, parent_spec, work_spec

from blade_codegen.pack import readme
from blade_codegen.plan import plan
from blade_codegen.problems import SpecError
from blade_codegen.resolve import resolve_specs
from blade_runtime import CallContext, Principal, RegistrationError, Runtime
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolSuccess
from blade_runtime.core.store import Store, StoreUnavailable
from blade_runtime.stores.memory import MemoryStore

TOOLS = Path(__file__).parents[2] / "slot_tools.py"
WAIT_S = 30.0  # every wait is bounded; generous for a loaded machine


def run(coroutine: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coroutine

    return asyncio.run(main())


async def until(condition: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.005)


class Gated:
    """``work`` whose calls run until the test opens their gate (by ``n``), in entry order."""

    def __init__(self) -> None:
        self.gates: dict[int, asyncio.Event] = {}
        self.entered: list[int] = []
        self.running = 0
        self.most = 0

    def gate(self, n: int) -> asyncio.Event:
        return self.gates.setdefault(n, asyncio.Event())

    async def __call__(self, ctx: Any) -> Done:
        n = ctx.input.n
        self.entered.append(n)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            if ctx.input.path == "fail":
                raise RuntimeError("it failed")
            if ctx.input.path == "suspend" and type(ctx.entry).__name__ == "InitialEntry":
                ctx.suspend("gate", {"ok": True})
            await self.gate(n).wait()
        finally:
            self.running -= 1
        return Done(n=n)


def waiting(store: Store, call_id: str) -> bool:
    return any(not row.held for row in store.slots(call_id=call_id))


def test_at_most_the_limit_run_at_once_in_fifo_order_and_a_cancelled_waiter_leaves(
    store: Store,
) -> None:
    """Concurrency 2 on every store: two run, the rest wait in the order they came; the
    waiter cancelled while it waits never runs, takes no slot and leaves the others' order."""

    async def main() -> None:
        runtime = Runtime(store=store)
        tool = Gated()
        runtime.register(work_spec(concurrency=2), tool)
        calls: dict[int, asyncio.Task[Any]] = {}
        for n in range(6):  # each queued before the next comes
            calls[n] = asyncio.create_task(runtime.call("work", {"n": n}, call_id=f"c{n}"))
            if n < 2:
                await until(lambda n=n: n in tool.entered, f"c{n} runs")
            else:
                await until(lambda n=n: waiting(store, f"c{n}"), f"c{n} waits")
        assert tool.entered == [0, 1]
        held = {row.call_id for row in store.slots() if row.held}
        assert held == {"c0", "c1"}
        assert runtime.cancel_call("c3")  # a waiter in the middle of the queue
        cancelled = await calls[3]
        assert isinstance(cancelled, ToolError) and cancelled.code is ErrorCode.CANCELLED
        assert store.slots(call_id="c3") == []  # it left the queue
        tool.gate(0).set()
        await until(lambda: 2 in tool.entered, "c2 runs")
        tool.gate(1).set()
        await until(lambda: 4 in tool.entered, "c4 runs")  # c3's place went to c4, not lost
        for n in (2, 4, 5):
            tool.gate(n).set()
        results = [await calls[n] for n in (0, 1, 2, 4, 5)]
        assert all(isinstance(r, ToolSuccess) for r in results)
        assert tool.entered == [0, 1, 2, 4, 5] and tool.most == 2
        assert store.slots() == []
        if store.durable:  # the wait is in the call's stored history, for every worker's streams
            kinds = [e.kind for e in store.events("default") if e.call_id == "c2"]
            assert kinds == ["started", "waiting", "acquired", "result"]
            waited = [e.kind for e in store.events("default") if e.call_id == "c3"]
            assert waited == ["started", "waiting", "result"]  # cancelled while it waited
        await runtime.close()

    run(main())


def test_the_wait_happens_before_the_timeout_starts() -> None:
    """A call that waits longer than its timeout for its slot still gets its whole timeout."""

    async def main() -> None:
        runtime = Runtime(store=MemoryStore())
        log: list[int] = []

        async def slow(ctx: Any) -> Done:
            await asyncio.sleep(0.2)
            log.append(ctx.input.n)
            return Done(n=ctx.input.n)

        runtime.register(work_spec(concurrency=1, timeout_ms=600), slow)
        results = await asyncio.gather(*(runtime.call("work", {"n": n}) for n in range(5)))
        # the last waited 0.8 s (beyond its 0.6 s timeout) and then ran 0.2 s of its own
        assert [r.status for r in results] == ["success"] * 5, results
        assert log == [0, 1, 2, 3, 4]
        await runtime.close()

    run(main())


def test_a_timeout_counts_only_the_run() -> None:
    """The deadline still ends a call that runs too long, after its wait; its slot is freed."""

    async def main() -> None:
        store = MemoryStore()
        runtime = Runtime(store=store)
        tool = Gated()
        runtime.register(work_spec(concurrency=1, timeout_ms=200), tool)
        first = asyncio.create_task(runtime.call("work", {"n": 0}, call_id="t0"))
        await until(lambda: 0 in tool.entered, "t0 runs")
        second = asyncio.create_task(runtime.call("work", {"n": 1}, call_id="t1"))
        timed_out = await first
        assert isinstance(timed_out, ToolError) and timed_out.code is ErrorCode.TIMEOUT
        await until(lambda: 1 in tool.entered, "t1 runs once t0 timed out")
        tool.gate(1).set()
        assert isinstance(await second, ToolSuccess)
        assert store.slots() == []
        await runtime.close()

    run(main())


def test_released_on_every_exit(store: Store) -> None:
    """An error, a cancellation while running and a suspension each free the slot; the
    suspended call's resumed entry queues again before it runs."""

    async def main() -> None:
        runtime = Runtime(store=store)
        tool = Gated()
        runtime.register(work_spec(concurrency=1), tool)
        failed = await runtime.call("work", {"n": 0, "path": "fail"}, call_id="e0")
        assert isinstance(failed, ToolError) and failed.code is ErrorCode.TOOL_ERROR
        assert store.slots() == []

        running = asyncio.create_task(runtime.call("work", {"n": 1}, call_id="e1"))
        await until(lambda: 1 in tool.entered, "e1 runs")
        runtime.cancel_call("e1")
        cancelled = await running
        assert isinstance(cancelled, ToolError) and cancelled.code is ErrorCode.CANCELLED
        assert store.slots() == []

        suspended = await runtime.call("work", {"n": 2, "path": "suspend"}, call_id="e2")
        assert isinstance(suspended, ToolPending)
        assert store.slots() == []  # a person may take hours: nothing is held meanwhile
        holder = asyncio.create_task(runtime.call("work", {"n": 3}, call_id="e3"))
        await until(lambda: 3 in tool.entered, "e3 runs while e2 is suspended")
        resumed = asyncio.create_task(runtime.submit(suspended.action.action_id, {"ok": True}))
        await until(lambda: waiting(store, "e2"), "e2's resumed entry queues")
        assert tool.entered.count(2) == 1
        tool.gate(3).set()
        tool.gate(2).set()
        assert isinstance(await holder, ToolSuccess)
        assert isinstance(await resumed, ToolSuccess)
        assert tool.entered == [0, 1, 2, 3, 2] and tool.most == 1
        assert store.slots() == []
        await runtime.close()

    run(main())


def test_a_holder_whose_slot_was_taken_is_stopped() -> None:
    """A runtime that stalled past its lease while it held a slot finds the slot given to
    another (here: its row deleted, as another worker's look deletes a lapsed one): its
    heartbeat stops the call as LEASE_LOST, so two calls never run where one may."""

    async def main() -> None:
        store = MemoryStore()
        runtime = Runtime(store=store, lease_s=0.3)
        tool = Gated()
        runtime.register(work_spec(concurrency=1), tool)
        holder = asyncio.create_task(runtime.call("work", {"n": 0}, call_id="s0"))
        await until(lambda: 0 in tool.entered, "s0 runs")
        assert store.release_slots("s0", runtime.owner) == 1  # taken while it ran
        lost = await holder
        assert isinstance(lost, ToolError) and lost.code is ErrorCode.LEASE_LOST
        assert "concurrency slot lapsed" in lost.message
        await runtime.close()

    run(main())


def test_a_store_that_fails_while_a_call_waits_ends_it_unrun() -> None:
    """The store refuses a waiter's look: the call ends STORE_UNAVAILABLE, its implementation
    never entered, and nothing of it is left in the queues."""

    class Failing(MemoryStore):
        fail = False

        def acquire_slots(self, *args: Any, **kwargs: Any) -> bool:
            if self.fail:
                raise StoreUnavailable("the store is down")
            return super().acquire_slots(*args, **kwargs)

    async def main() -> None:
        store = Failing()
        runtime = Runtime(store=store)
        tool = Gated()
        runtime.register(work_spec(concurrency=1), tool)
        holder = asyncio.create_task(runtime.call("work", {"n": 0}, call_id="f0"))
        await until(lambda: 0 in tool.entered, "f0 runs")
        waiter = asyncio.create_task(runtime.call("work", {"n": 1}, call_id="f1"))
        await until(lambda: waiting(store, "f1"), "f1 waits")
        store.fail = True
        refused = await waiter
        assert isinstance(refused, ToolError) and refused.code is ErrorCode.STORE_UNAVAILABLE
        assert "it did not run" in refused.message and tool.entered == [0]
        assert store.slots(call_id="f1") == []
        store.fail = False
        tool.gate(0).set()
        assert isinstance(await holder, ToolSuccess)
        await runtime.close()

    run(main())


def test_an_implementation_that_ignores_its_cancellation_keeps_its_lock_until_it_exits() -> None:
    """Cancelled, it ignores the cancellation past the grace: its caller gets CANCELLED (and
    its own registration refuses calls), but it may still be touching the resource, so another
    tool's call on the same resource waits until it really exits."""

    async def main() -> None:
        store = MemoryStore()
        runtime = Runtime(store=store, cleanup_grace_s=0.05)
        exited = asyncio.Event()
        entered: list[str] = []

        async def stubborn(ctx: Any) -> Done:
            entered.append(ctx.call.name)
            while ctx.call.name == "edit" and not exited.is_set():
                with contextlib.suppress(asyncio.CancelledError):  # ignores every cancellation
                    await exited.wait()  # and cleans up for as long as the test says
            return Done(n=ctx.input.n)

        for name in ("edit", "read"):
            runtime.register(work_spec(), stubborn, name=name, locks=["file:/path"])
        first = asyncio.create_task(
            runtime.call("edit", {"n": 0, "path": "/x"}, call_id="d0", run_id="r1")
        )
        await until(lambda: entered == ["edit"], "d0 runs")
        runtime.cancel_call("d0")
        cancelled = await first
        assert isinstance(cancelled, ToolError) and cancelled.code is ErrorCode.CANCELLED
        second = asyncio.create_task(
            runtime.call("read", {"n": 1, "path": "/x"}, call_id="d1", run_id="r2")
        )
        await until(lambda: waiting(store, "d1"), "d1 waits for the detached d0")
        await asyncio.sleep(0.1)
        assert entered == ["edit"]
        exited.set()
        assert isinstance(await second, ToolSuccess) and entered == ["edit", "read"]
        assert store.slots() == []
        await runtime.close()

    run(main())


def test_a_lock_keeps_calls_on_equal_values_apart() -> None:
    """``locks=["/path"]``: calls on the same path run one at a time, on other paths at once;
    a call whose input has no path locks nothing; two tenants never share a lock."""

    async def main() -> None:
        store = MemoryStore()
        runtime = Runtime(store=store)
        tool = Gated()
        runtime.register(work_spec(), tool, locks=["/path"])

        def call(n: int, path: str | None, tenant: str = "") -> asyncio.Task[Any]:
            arguments: dict[str, Any] = {"n": n} if path is None else {"n": n, "path": path}
            context = CallContext(Principal("p", tenant)) if tenant else None
            return asyncio.create_task(
                runtime.call("work", arguments, call_id=f"l{n}", context=context)
            )

        calls = [call(0, "/a"), call(1, "/a"), call(2, "/b"), call(3, None), call(4, "/a", "t2")]
        await until(lambda: sorted(tool.entered) == [0, 2, 3, 4], "all but l1 run")
        assert waiting(store, "l1")
        tool.gate(0).set()
        await until(lambda: 1 in tool.entered, "l1 runs once l0 ended")
        for n in (1, 2, 3, 4):
            tool.gate(n).set()
        assert all(isinstance(result, ToolSuccess) for result in await asyncio.gather(*calls))
        await runtime.close()

    run(main())


def test_a_waiting_call_is_announced_and_listed() -> None:
    """A call that waits is announced (``waiting`` with its keys, then ``acquired``) and
    listed by ``store.slots()`` as waiting; a call that never waits is not announced."""

    async def main() -> None:
        store = MemoryStore()
        runtime = Runtime(store=store)
        tool = Gated()
        runtime.register(work_spec(concurrency=1), tool)
        seen: list[tuple[str, str]] = []
        subscription = runtime.subscribe("default")

        async def watch() -> None:
            async for event in subscription:
                seen.append((event.call_id, event.kind))

        watcher = asyncio.create_task(watch())
        first = asyncio.create_task(runtime.call("work", {"n": 0}, call_id="v0"))
        await until(lambda: 0 in tool.entered, "v0 runs")
        second = asyncio.create_task(runtime.call("work", {"n": 1}, call_id="v1"))
        await until(lambda: ("v1", "waiting") in seen, "v1 is announced waiting")
        [row] = store.slots(call_id="v1")
        assert (row.slot_key, row.held, row.capacity) == ("tool:work", False, 1)
        tool.gate(0).set()
        tool.gate(1).set()
        await first
        await second
        await until(lambda: ("v1", "result") in seen, "v1's result")
        kinds = [kind for call_id, kind in seen if call_id == "v1"]
        assert kinds.index("waiting") < kinds.index("acquired") < kinds.index("result")
        assert ("v0", "waiting") not in seen
        watcher.cancel()
        await runtime.close()

    run(main())


def test_worker_concurrency_bounds_each_runtime_and_concurrency_all_of_them() -> None:
    """Two runtimes (workers) of one store: ``worker_concurrency=1`` lets each run one call at
    a time, both at once; with ``concurrency=1`` too, one of them in all."""

    async def main(limit: int | None) -> tuple[int, int, int]:
        store = MemoryStore()
        running = [0, 0, 0]  # worker 0, worker 1, both
        most = [0, 0, 0]

        def work(worker: int) -> Any:
            async def run(ctx: Any) -> Done:
                for at in (worker, 2):
                    running[at] += 1
                    most[at] = max(most[at], running[at])
                await asyncio.sleep(0.05)
                for at in (worker, 2):
                    running[at] -= 1
                return Done(n=ctx.input.n)

            return run

        runtimes = [Runtime(store=store), Runtime(store=store)]
        for worker, runtime in enumerate(runtimes):
            runtime.register(work_spec(), work(worker), worker_concurrency=1, concurrency=limit)
        results = await asyncio.gather(
            *(runtime.call("work", {"n": n}) for runtime in runtimes for n in range(4))
        )
        assert all(isinstance(result, ToolSuccess) for result in results)
        assert store.slots() == []
        for runtime in runtimes:
            await runtime.close()
        return most[0], most[1], most[2]

    assert run(main(None)) == (1, 1, 2)
    assert run(main(1)) == (1, 1, 1)


def test_a_child_shares_what_its_parent_holds() -> None:
    """A parent holding the lock of a path calls a child tool that locks the same path: the
    child runs as part of its parent (it does not wait on it), and a call from outside waits
    for both to end."""

    async def main() -> None:
        store = MemoryStore()
        runtime = Runtime(store=store)
        tool = Gated()
        child = work_spec(locks=["file:/path"], suspends=False)
        runtime.register(child, tool)

        async def edit(ctx: Any) -> Done:
            done: Done = await ctx.tools.call(child, Work(n=ctx.input.n, path=ctx.input.path))
            return done

        runtime.register(parent_spec(locks=["file:/path"]), edit)
        parent = asyncio.create_task(runtime.call("edit", {"n": 0, "path": "/a"}, call_id="p0"))
        await until(lambda: 0 in tool.entered, "the child of p0 runs")
        outside = asyncio.create_task(runtime.call("work", {"n": 1, "path": "/a"}, call_id="o1"))
        await until(lambda: waiting(store, "o1"), "o1 waits for the parent")
        tool.gate(0).set()
        assert isinstance(await parent, ToolSuccess)
        await until(lambda: 1 in tool.entered, "o1 runs once the parent ended")
        tool.gate(1).set()
        assert isinstance(await outside, ToolSuccess)
        assert store.slots() == [] and runtime.calls.slots._lineage == {}
        await runtime.close()

    run(main())


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"concurrency": 0}, "concurrency=0 is not a positive integer"),
        ({"concurrency": True}, "concurrency=True is not a positive integer"),
        ({"worker_concurrency": -1}, "worker_concurrency=-1 is not a positive integer"),
        ({"locks": "/path"}, "pass a list: locks=['/path']"),
        ({"locks": ["path"]}, "neither a JSON pointer"),
        ({"locks": ["/a~2b"]}, "'~0' or '~1' only"),
    ],
)
def test_a_bad_declaration_is_refused_when_registered(
    options: dict[str, Any], problem: str
) -> None:
    runtime = Runtime(store=MemoryStore())
    with pytest.raises(RegistrationError, match=r"registering slots\.work\.v1") as refused:
        runtime.register(work_spec(), Gated(), **options)
    assert problem in str(refused.value)


def test_the_registration_overrides_the_spec() -> None:
    runtime = Runtime(store=MemoryStore())
    made = runtime.register(work_spec(concurrency=3, locks=["/path"]), Gated(), concurrency=1)
    assert made.limits is not None
    assert made.limits.concurrency == 1 and [lock.pointer for lock in made.limits.locks] == [
        "/path"
    ]
    plain = runtime.register(work_spec(), Gated(), name="plain")
    assert plain.limits is None


def test_a_spec_declares_them_into_code_manifest_and_readme(tmp_path: Path) -> None:
    """``concurrency`` and ``locks`` in a spec reach its SPEC (so a registration enforces them
    without options), the manifest and the package README."""
    arguments = {"type": "object", "properties": {"path": {"type": "string"}}}
    build_and_import(
        tmp_path,
        "sl_pkg",
        spec("sl.edit-file.v1", inputSchema=arguments, concurrency=2, locks=["file:/path"]),
    )
    module = importlib.import_module("sl_pkg.sl.edit_file_v1")
    assert (module.SPEC.concurrency, module.SPEC.locks) == (2, ("file:/path",))
    manifest = json.loads((tmp_path / "out" / "sl_pkg" / "manifest.json").read_text("utf-8"))
    [tool] = manifest["tools"]
    assert (tool["concurrency"], tool["locks"]) == (2, ["file:/path"])
    text = readme(plan(resolve_specs(tmp_path / "specs"), "sl_pkg", ""), "blade-tool-sl", [])
    assert "| side effect | non_idempotent; at most 2 at once; locks `file:/path` |" in text

    async def edit(ctx: Any) -> None:
        return None

    made = Runtime(store=MemoryStore()).register(module.SPEC, edit)
    assert made.limits is not None and made.limits.concurrency == 2
    assert [(lock.resource, lock.pointer) for lock in made.limits.locks] == [("file", "/path")]


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"locks": ["/pathh"]}, "points at 'pathh', which the inputSchema does not declare"),
        ({"locks": ["path"]}, "locks/0"),
        ({"concurrency": 0}, "concurrency"),
        ({"execution": "client", "outputSchema": {"type": "object"}, "concurrency": 1}, "client"),
    ],
)
def test_a_bad_spec_declaration_is_refused_with_its_pointer(
    tmp_path: Path, overrides: dict[str, Any], problem: str
) -> None:
    arguments = {"type": "object", "properties": {"path": {"type": "string"}}}
    add_spec(tmp_path / "specs", spec("sl.edit-file.v1", inputSchema=arguments, **overrides))
    with pytest.raises(SpecError) as refused:
        resolve_specs(tmp_path / "specs")
    assert problem in str(refused.value)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    limit=st.integers(1, 3),
    calls=st.lists(
        st.tuples(st.integers(0, 3), st.none() | st.integers(0, 30), st.integers(0, 2)),
        min_size=1,
        max_size=8,
    ),
)
def test_any_interleaving_keeps_the_limit_and_the_order(
    limit: int, calls: list[tuple[int, int | None, int]]
) -> None:
    """Calls that come at random moments, hold for random times, and are cancelled at random
    points (waiting or running): never more than the limit at once, every call not cancelled
    ends with its output, those cancelled while waiting never run, no call takes a slot a call
    that came before it waits for (FIFO), and nothing is left in the queues."""

    async def main() -> None:
        store = MemoryStore()
        runtime = Runtime(store=store)
        entered: list[tuple[int, int]] = []  # (n, how many ran once it entered)
        running = [0, 0]  # now, most

        async def work(ctx: Any) -> Done:
            running[0] += 1
            running[1] = max(running)
            entered.append((ctx.input.n, running[0]))
            try:
                await asyncio.sleep(ctx.input.hold_s)
            finally:
                running[0] -= 1
            return Done(n=ctx.input.n)

        runtime.register(work_spec(concurrency=limit), work)
        tasks: list[asyncio.Task[Any]] = []

        async def cancel(call_id: str, turns: int) -> None:
            for _ in range(turns):  # wherever the call is by then: queuing, waiting, running
                await asyncio.sleep(0)
            runtime.cancel_call(call_id)

        cancels = []
        for n, (delay_ms, turns, hold) in enumerate(calls):
            await asyncio.sleep(delay_ms / 1000)
            arguments = {"n": n, "hold_s": hold / 100}
            tasks.append(asyncio.create_task(runtime.call("work", arguments, call_id=f"h{n}")))
            if turns is not None:
                cancels.append(asyncio.create_task(cancel(f"h{n}", turns)))
        results = await asyncio.gather(*tasks)
        await asyncio.gather(*cancels)
        assert running[1] <= limit
        for n, result in enumerate(results):
            if isinstance(result, ToolSuccess):
                assert result.output.n == n and n in [m for m, _ in entered]
            else:
                assert calls[n][1] is not None and result.code is ErrorCode.CANCELLED
        # FIFO: a call enters before one that came earlier only while a slot is left for that
        # one too (it was granted, and had not woken yet): it never takes the earlier's slot
        for place, (n, busy) in enumerate(entered):
            if any(m < n for m, _ in entered[place + 1 :]):
                assert busy < limit, entered
        assert store.slots() == []
        await runtime.close()

    run(main())


# -- across processes ---------------------------------------------------------------------------


def _worker(url: str, log: Path, limit: int, hold_s: float, n: int, lease_s: float = 5.0) -> Any:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(TOOLS), url, str(log), str(limit), str(hold_s), str(n), str(lease_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _durable_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    from blade_runtime.stores.sqlite import SQLiteStore

    SQLiteStore(tmp_path / "slots.db").close()  # made once, before the workers race to
    return f"sqlite:///{tmp_path / 'slots.db'}"


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_two_processes_share_the_limit(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two workers of one store, each making 4 calls at once of a tool limited to 2: never
    more than 2 run at once across both, and all 8 succeed."""
    url = _durable_url(kind, tmp_path, request)
    log = tmp_path / "entries.log"
    workers = [_worker(url, log, 2, 0.15, 4) for _ in range(2)]
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        assert out.split() == ["success"] * 4, (out, err)
    most, ended = most_at_once(str(log))
    assert ended == 8 and most == 2


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_killed_holder_frees_its_slot_when_its_lease_lapses(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """kill -9 of a worker while its call holds the only slot: another worker's call, waiting
    for it, runs once the dead worker's lease (2 s here) has lapsed, not before it."""
    url = _durable_url(kind, tmp_path, request)
    log = tmp_path / "entries.log"
    holder = _worker(url, log, 1, 600.0, 1, lease_s=2.0)
    deadline = time.monotonic() + 60
    while not (log.exists() and "start" in log.read_text()):
        assert holder.poll() is None, holder.communicate()
        assert time.monotonic() < deadline, "the holder never started"
        time.sleep(0.02)
    waiter = _worker(url, log, 1, 0.0, 1, lease_s=2.0)
    from blade_runtime.stores.urls import open_store

    seen = open_store(url)
    try:
        while not any(not row.held for row in seen.slots()):  # the waiter queues behind it
            assert waiter.poll() is None, waiter.communicate()
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.02)
    finally:
        seen.close()
    assert log.read_text().count("start") == 1
    os.kill(holder.pid, signal.SIGKILL)
    killed_at = time.time()
    holder.communicate()
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0 and out.split() == ["success"], (out, err)
    starts = [float(line.split()[3]) for line in log.read_text().splitlines() if "start" in line]
    assert len(starts) == 2
    # the waiter entered after the kill, and not before the holder's lease could lapse (renewed
    # every third of it: 1.3 s after the kill, when its heartbeat kept time)
    assert starts[1] - killed_at > 0.5
    left = open_store(url)
    try:  # the dead worker's row went when the waiter released its own
        assert left.slots() == [] and left.release_slots("nobody", "none") == 0
        assert not left._fetch("SELECT 1 FROM blade_slots")  # type: ignore[attr-defined]
    finally:
        left.close()


def test_http_shows_a_call_waiting_for_its_slot(tmp_path: Path) -> None:
    """``GET /v1/calls/{id}`` of a call that waits: ``waiting`` and its slot, not held; once
    it runs, held; once it ended, none."""
    import httpx
    from http_support import ALICE, authenticate, serving

    from blade_runtime.serving.http import create_app
    from blade_runtime.stores.sqlite import SQLiteStore

    runtime = Runtime(store=SQLiteStore(tmp_path / "http.db"))
    tool = Gated()
    runtime.register(work_spec(concurrency=1), tool)
    alice = CallContext(Principal("alice", "acme"))
    with serving(create_app(runtime, authenticate=authenticate)) as server:
        loop = server.loop()

        def start(n: int) -> Any:
            made = runtime.call("work", {"n": n}, call_id=f"x{n}", context=alice)
            return asyncio.run_coroutine_threadsafe(made, loop)

        def seen(call_id: str) -> dict[str, Any]:
            response = httpx.get(f"{server.url}/v1/calls/{call_id}", headers=ALICE)
            assert response.status_code == 200, response.text
            found: dict[str, Any] = response.json()
            return found

        def poll(check: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + WAIT_S
            while not check():
                assert time.monotonic() < deadline, what
                time.sleep(0.01)

        first = start(0)
        poll(lambda: 0 in tool.entered, "x0 runs")
        second = start(1)
        poll(lambda: seen("x1").get("waiting") is True, "x1 is shown waiting")
        body = seen("x1")
        assert body["state"] == "running"
        assert body["slots"] == [{"key": "tool:work", "held": False, "capacity": 1}]
        assert seen("x0")["slots"] == [{"key": "tool:work", "held": True, "capacity": 1}]
        loop.call_soon_threadsafe(tool.gate(0).set)
        poll(lambda: 1 in tool.entered, "x1 runs")
        assert seen("x1")["waiting"] is False
        loop.call_soon_threadsafe(tool.gate(1).set)
        assert isinstance(first.result(WAIT_S), ToolSuccess)
        assert isinstance(second.result(WAIT_S), ToolSuccess)
        assert seen("x1")["slots"] == [] and seen("x1")["state"] == "settled"
        server.run(runtime.close())


def test_the_waiting_calls_are_a_metric() -> None:
    """``blade.tool.waiting``: how many calls wait for a slot or a lock, by tool."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from blade_runtime.otel import Telemetry

    def waiting_now(reader: InMemoryMetricReader) -> list[tuple[str, int]]:
        data = reader.get_metrics_data()
        return [
            (point.attributes["gen_ai.tool.name"], point.value)
            for resource in (data.resource_metrics if data else ())
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == "blade.tool.waiting"
            for point in metric.data.data_points
        ]

    async def main() -> None:
        store = MemoryStore()
        runtime = Runtime(store=store)
        reader = InMemoryMetricReader()
        runtime.observe(Telemetry(meter_provider=MeterProvider([reader]), store=store))
        tool = Gated()
        runtime.register(work_spec(concurrency=1), tool)
        calls = [
            asyncio.create_task(runtime.call("work", {"n": n}, call_id=f"m{n}")) for n in (0, 1, 2)
        ]
        await until(lambda: waiting(store, "m1") and waiting(store, "m2"), "two wait")
        assert waiting_now(reader) == [("work", 2)]
        for n in (0, 1, 2):
            tool.gate(n).set()
        await asyncio.gather(*calls)
        assert waiting_now(reader) == []
        await runtime.close()

    run(main())
