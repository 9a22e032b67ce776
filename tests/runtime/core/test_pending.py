"""Suspensions, client tools and pending actions; ToolData; stores; exactly-once; recovery."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from blade_runtime import ResumeEntry
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolResult, ToolSuccess
from blade_runtime.core.store import Event, StoreError
from blade_runtime.runtime import Runtime
from blade_runtime.stores.memory import MemoryStore
from blade_runtime.stores.sqlite import SQLiteStore
from blade_runtime.stores.sqlite_schema import SCHEMA_VERSION

REFUND = {
    "payment_id": "pay_1",
    "amount": {"amount_minor": 1250, "currency": "EUR"},
    "reason": "damaged",
}
DEPLOY = {"service": "api", "version": "v1.2.3", "environment": "staging"}
BIN = Path(sys.executable).parent


def run(coroutine: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coroutine

    return asyncio.run(main())


class Refunds:
    """The refund tool: suspends for approval, then refunds or declines; counts its entries."""

    def __init__(self, package: Any) -> None:
        from blade_specs.payments import refund_payment_v1 as refund

        self.module = refund
        self.entries: list[Any] = []
        self.histories: list[Any] = []
        self.again = False  # suspend once more on the first resume

    async def __call__(self, ctx: Any) -> Any:
        refund = self.module
        self.entries.append(ctx.entry)
        self.histories.append(list(ctx.suspend_history))
        entry = ctx.entry
        if isinstance(entry, ResumeEntry):
            if self.again and len(ctx.suspend_history) == 1:
                ctx.suspend(
                    "approval",
                    refund.RefundPaymentApprovalSuspend(prompt="Sure?", amount=ctx.input.amount),
                )
            if not entry.payload.approved:
                return refund.RefundPaymentOutputDeclined(
                    status="declined", by=entry.payload.approver
                )
            return refund.RefundPaymentOutputRefunded(status="refunded", refund_id="re_1")
        prompt = f"Refund {ctx.input.amount.amount_minor}?"
        ctx.suspend(
            "approval", refund.RefundPaymentApprovalSuspend(prompt=prompt, amount=ctx.input.amount)
        )

    def register(self, runtime: Runtime) -> None:
        refund = self.module
        runtime.register(
            refund.SPEC, self, context=lambda call: refund.RefundPaymentContext(operator_id="op")
        )


def runtime_with(package: Any, store: Any = None) -> tuple[Runtime, Refunds]:
    from blade_specs.browser import check_page_v1

    runtime = Runtime(store=store)
    refunds = Refunds(package)
    refunds.register(runtime)
    runtime.register_client(check_page_v1.SPEC)
    return runtime, refunds


def pending_of(result: ToolResult[Any]) -> ToolPending:
    assert isinstance(result, ToolPending), result
    return result


# -- suspend and resume ------------------------------------------------------------------------


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
def test_suspend_then_resume_with_an_invalid_submit_first(
    example_package: Any, tmp_path: Path, store_kind: str
) -> None:
    store = MemoryStore() if store_kind == "memory" else SQLiteStore(tmp_path / "s.db")
    runtime, refunds = runtime_with(example_package, store)

    async def scenario() -> tuple[Any, ...]:
        waiting = pending_of(
            await runtime.call("refund_payment", REFUND, call_id="c1", run_id="r1")
        )
        invalid = await runtime.submit(waiting.action.action_id, {"approved": "yes"})
        still = runtime.pending(run_id="r1")
        done = await runtime.submit(waiting.action.action_id, {"approved": True, "approver": "ann"})
        return waiting, invalid, still, done

    waiting, invalid, still, done = run(scenario())
    action = waiting.action
    assert action.name == "refund_payment.approval"
    assert action.input.prompt == "Refund 1250?" and action.input.amount.currency == "EUR"
    assert (action.origin.call_id, action.origin.run_id, action.origin.point) == (
        "c1",
        "r1",
        "approval",
    )
    assert waiting.content == {"pending": "refund_payment.approval", "action_id": action.action_id}
    assert isinstance(invalid, ToolError) and invalid.code == ErrorCode.INVALID_SUBMISSION
    assert "at /approved: must be of type boolean (got string)" in invalid.message
    assert 'the required property "approver" is missing' in invalid.message
    assert [a.action_id for a in still] == [action.action_id]
    assert isinstance(done, ToolSuccess) and done.content == {
        "status": "refunded",
        "refund_id": "re_1",
    }
    assert len(refunds.entries) == 2  # the initial entry and the one valid resume
    resume = refunds.entries[1]
    assert isinstance(resume, ResumeEntry) and resume.point == "approval"
    assert resume.payload.approver == "ann" and resume.action.action_id == action.action_id
    [episode] = refunds.histories[1]
    assert (episode.point, episode.state, episode.payload["prompt"]) == (
        "approval",
        "submitted",
        "Refund 1250?",
    )
    assert runtime.pending() == []
    store.close()


def test_a_suspension_survives_closing_and_reopening_the_store(
    example_package: Any, tmp_path: Path
) -> None:
    path = tmp_path / "store.db"
    first, _ = runtime_with(example_package, SQLiteStore(path))
    waiting = pending_of(run(first.call("refund_payment", REFUND, run_id="r7")))
    first.store.close()
    del first

    reopened, refunds = runtime_with(example_package, SQLiteStore(path))
    [view] = reopened.pending(name="refund_payment")
    assert view.action_id == waiting.action.action_id and view.input.prompt == "Refund 1250?"
    done = run(reopened.submit(view.action_id, {"approved": False, "approver": "bob"}))
    assert isinstance(done, ToolSuccess) and done.content == {"status": "declined", "by": "bob"}
    assert refunds.entries and isinstance(refunds.entries[0], ResumeEntry)
    record = reopened.store.call(waiting.call.call_id)
    assert record is not None and record.state == "settled"
    assert record.result == {"status": "success", "content": {"status": "declined", "by": "bob"}}


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_one_call_may_suspend_several_times(
    example_package: Any, kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Each entry reads the episodes before it (``ctx.suspend_history``) on every store: on
    PostgreSQL read before the entry, off the event loop; elsewhere when the tool asks."""
    from blade_runtime.stores.urls import open_store

    url = {"memory": "memory:", "sqlite": f"sqlite:///{tmp_path / 'h.db'}"}.get(kind)
    store = open_store(url or request.getfixturevalue("postgres_url"))
    runtime, refunds = runtime_with(example_package, store)
    refunds.again = True

    async def scenario() -> ToolResult[Any]:
        first = pending_of(await runtime.call("refund_payment", REFUND))
        second = pending_of(
            await runtime.submit(first.action.action_id, {"approved": True, "approver": "a"})
        )
        assert second.action.action_id != first.action.action_id
        return await runtime.submit(second.action.action_id, {"approved": True, "approver": "b"})

    assert isinstance(run(scenario()), ToolSuccess)
    run(runtime.close())
    store.close()
    assert [len(h) for h in refunds.histories] == [0, 1, 2]
    assert [e.state for e in refunds.histories[2]] == ["submitted", "submitted"]


def test_cancel_and_fail_settle_once_and_name_how(example_package: Any) -> None:
    runtime, _ = runtime_with(example_package)
    first = pending_of(run(runtime.call("refund_payment", REFUND)))
    second = pending_of(run(runtime.call("refund_payment", REFUND)))
    cancelled = run(runtime.cancel(first.action.action_id, "the customer withdrew"))
    assert isinstance(cancelled, ToolError) and cancelled.code == ErrorCode.CANCELLED
    assert cancelled.message == "The tool call was cancelled: the customer withdrew."
    failed = run(runtime.fail(second.action.action_id, "The approval system is down."))
    assert isinstance(failed, ToolError) and failed.code == ErrorCode.TOOL_FAILED
    late = run(runtime.submit(first.action.action_id, {"approved": True, "approver": "x"}))
    assert isinstance(late, ToolError) and late.code == ErrorCode.ACTION_ALREADY_RESOLVED
    assert f"{first.action.action_id} was already cancelled at" in late.message
    unknown = run(runtime.submit("act_nope", {}))
    assert isinstance(unknown, ToolError) and unknown.code == ErrorCode.UNKNOWN_ACTION


def test_cancelling_a_run_cancels_its_pending_actions(example_package: Any) -> None:
    runtime, _ = runtime_with(example_package)
    for run_id in ("a", "a", "b"):
        pending_of(run(runtime.call("refund_payment", REFUND, run_id=run_id)))
    assert run(runtime.cancel_run("a")) == 2
    assert [v.origin.run_id for v in runtime.pending()] == ["b"]


# -- client tools ------------------------------------------------------------------------------


def test_a_client_tool_call_waits_for_its_output(example_package: Any) -> None:
    from blade_specs.browser import check_page_v1

    runtime, _ = runtime_with(example_package)
    waiting = pending_of(run(runtime.call("check_page", {"url": "https://example.com"})))
    assert waiting.action.name == "check_page"
    assert isinstance(waiting.action.input, check_page_v1.CheckPageInput)
    bad = run(runtime.submit(waiting.action.action_id, {"status_code": "200"}))
    assert isinstance(bad, ToolError) and bad.code == ErrorCode.INVALID_SUBMISSION
    done = run(
        runtime.submit(waiting.action.action_id, check_page_v1.CheckPageOutput(status_code=200))
    )
    assert isinstance(done, ToolSuccess)
    assert isinstance(done.output, check_page_v1.CheckPageOutput) and done.content == {
        "status_code": 200
    }


# -- ToolData ----------------------------------------------------------------------------------


def deploy_runtime(package: Any, store: Any, impl: Any) -> Runtime:
    from blade_specs.deploy import deploy_service_v1

    runtime = Runtime(store=store)
    runtime.register(deploy_service_v1.SPEC, impl)
    return runtime


def test_data_is_durable_ordered_updated_in_place_and_transient_never_stored(
    example_package: Any, tmp_path: Path
) -> None:
    from blade_specs.deploy import deploy_service_v1 as deploy

    seen: list[Any] = []

    async def impl(ctx: Any) -> Any:
        progress = deploy.DeployServiceProgressData
        await ctx.data.write("progress", progress(step="build", status="running"), id="build")
        await ctx.data.write("progress", progress(step="push", status="running"), id="push")
        first = (await ctx.data.list("progress"))[0].updated_at
        await asyncio.sleep(0.002)
        await ctx.data.write("progress", progress(step="build", status="done"), id="build")
        await ctx.data.write("log", deploy.DeployServiceLogData(line="42%"), transient=True)
        await ctx.data.write("log", deploy.DeployServiceLogData(line="done"))
        items = await ctx.data.list("progress")
        seen.extend([first, items])
        return deploy.DeployServiceOutput(deployed=True, steps=len(items))

    store = SQLiteStore(tmp_path / "s.db")
    runtime = deploy_runtime(example_package, store, impl)

    async def scenario() -> tuple[ToolResult[Any], list[Event]]:
        events = runtime.subscribe("r1")
        result = await runtime.call("deploy_service", DEPLOY, call_id="c1", run_id="r1")
        events.close()
        return result, [event async for event in events]

    result, events = run(scenario())
    assert isinstance(result, ToolSuccess)
    first, items = seen
    assert [(i.id, i.value.status) for i in items] == [("build", "done"), ("push", "running")]
    assert items[0].updated_at > first  # updated in place: same position, new time
    stored = store.data("c1")
    assert [(d.channel, d.item_id) for d in stored] == [
        ("progress", "build"),
        ("progress", "push"),
        ("log", stored[2].item_id),
    ]
    assert all(d.value != {"line": "42%"} for d in stored)  # the transient record is not there
    kinds = [e.kind for e in events]
    assert kinds == ["started", "data", "data", "data", "data", "data", "result"]
    transient = [e for e in events if e.kind == "data" and e.payload["transient"]]  # type: ignore[index,call-overload]
    assert [e.payload["value"] for e in transient] == [{"line": "42%"}]  # type: ignore[index,call-overload]
    stored_seqs = [e.seq for e in events if e.seq]
    assert stored_seqs == sorted(stored_seqs) and len(stored_seqs) == len(events) - 1
    persisted = store.events("r1")
    assert [e.seq for e in persisted] == stored_seqs  # everything but the transient record


def test_values_that_are_not_lossless_json_are_rejected(
    example_package: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from blade_specs.deploy import deploy_service_v1 as deploy

    async def nan_record(ctx: Any) -> Any:
        await ctx.data.write("progress", {"step": "build", "status": "done", "detail": math.nan})
        return deploy.DeployServiceOutput(deployed=True, steps=1)

    runtime = deploy_runtime(example_package, None, nan_record)
    with caplog.at_level(logging.ERROR, logger="blade_runtime"):
        result = run(runtime.call("deploy_service", DEPLOY))
    assert isinstance(result, ToolError) and result.code == ErrorCode.TOOL_ERROR
    assert "at /detail: nan has no JSON form" in caplog.text

    refund_runtime, _ = runtime_with(example_package)
    waiting = pending_of(run(refund_runtime.call("refund_payment", REFUND)))
    bad = run(
        refund_runtime.submit(waiting.action.action_id, {"approved": True, "approver": math.inf})
    )
    assert isinstance(bad, ToolError) and bad.code == ErrorCode.INVALID_SUBMISSION
    assert "inf has no JSON form" in bad.message


def test_events_of_a_suspension_arrive_in_order(example_package: Any) -> None:
    runtime, _ = runtime_with(example_package)

    async def scenario() -> list[str]:
        events = runtime.subscribe("r1")
        waiting = pending_of(await runtime.call("refund_payment", REFUND, run_id="r1"))
        await runtime.submit(waiting.action.action_id, {"approved": True, "approver": "a"})
        events.close()
        return [event.kind async for event in events]

    assert run(scenario()) == ["started", "suspended", "resumed", "result"]


# -- exactly once ------------------------------------------------------------------------------


def test_twenty_threads_racing_to_submit_one_action(example_package: Any, tmp_path: Path) -> None:
    path = tmp_path / "race.db"
    runtime, _ = runtime_with(example_package, SQLiteStore(path))
    waiting = pending_of(run(runtime.call("check_page", {"url": "https://example.com"})))
    barrier = threading.Barrier(20)
    results: list[ToolResult[Any]] = []

    def racer(index: int) -> None:
        mine, _ = runtime_with(example_package, SQLiteStore(path))
        barrier.wait()
        results.append(run(mine.submit(waiting.action.action_id, {"status_code": 200 + index})))

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wins = [r for r in results if isinstance(r, ToolSuccess)]
    losses = [r for r in results if isinstance(r, ToolError)]
    assert len(wins) == 1 and len(losses) == 19
    assert all(
        r.code == ErrorCode.ACTION_ALREADY_RESOLVED and "already submitted" in r.message
        for r in losses
    )
    record = runtime.store.call(waiting.call.call_id)
    assert record is not None and record.result == {"status": "success", "content": wins[0].content}


RACER = """
import asyncio, sys
sys.path.insert(0, {out!r})
from blade_runtime import Runtime
from blade_runtime.stores.sqlite import SQLiteStore
from blade_specs.browser import check_page_v1
runtime = Runtime(store=SQLiteStore({db!r}))
runtime.register_client(check_page_v1.SPEC)
while not __import__("os").path.exists({go!r}):
    pass
result = asyncio.run(runtime.submit({action!r}, {{"status_code": {code}}}))
print(result.status, getattr(result, "code", ""))
"""


def test_four_processes_racing_to_submit_one_action(
    example_package: Any, built_examples: Path, tmp_path: Path
) -> None:
    db = tmp_path / "race.db"
    runtime, _ = runtime_with(example_package, SQLiteStore(db))
    waiting = pending_of(run(runtime.call("check_page", {"url": "https://example.com"})))
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RACER.format(
                    out=str(built_examples),
                    db=str(db),
                    go=str(go),
                    action=waiting.action.action_id,
                    code=200 + i,
                ),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    time.sleep(1.0)  # let them all import and wait at the line
    go.touch()
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert sorted(outputs) == ["error ACTION_ALREADY_RESOLVED"] * 3 + ["success"], outputs


# -- recovery ----------------------------------------------------------------------------------

CRASHER = """
import asyncio, sys, pathlib
sys.path.insert(0, {out!r})
from blade_runtime import Runtime
from blade_runtime.stores.sqlite import SQLiteStore
from blade_specs.crm import lookup_customer_v1 as lookup
from blade_specs.payments import refund_payment_v1 as refund

marks = pathlib.Path({marks!r})

async def hang(name):
    marks.joinpath(name).touch()
    await asyncio.sleep(3600)

async def refund_impl(ctx):
    await hang("refund")

async def lookup_impl(ctx):
    await hang("lookup")

runtime = Runtime(store=SQLiteStore({db!r}))
operator = refund.RefundPaymentContext(operator_id="op")
tenant = lookup.LookupCustomerContext(tenant_id="t")
runtime.register(refund.SPEC, refund_impl, context=lambda call: operator)
runtime.register(lookup.SPEC, lookup_impl, context=lambda call: tenant)

async def main():
    await asyncio.gather(
        runtime.call("refund_payment", {refund_args}, call_id="refund-1"),
        runtime.call("lookup_customer", {{"customer_id": "cus_1"}}, call_id="lookup-1"),
    )

asyncio.run(main())
"""


def test_a_killed_process_non_idempotent_call_is_interrupted_and_pure_one_replayed(
    example_package: Any, built_examples: Path, tmp_path: Path
) -> None:
    from blade_specs.crm import lookup_customer_v1 as lookup

    db, marks = tmp_path / "crash.db", tmp_path / "marks"
    marks.mkdir()
    script = CRASHER.format(
        out=str(built_examples), db=str(db), marks=str(marks), refund_args=repr(REFUND)
    )
    child = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while not ((marks / "refund").exists() and (marks / "lookup").exists()):
        assert time.monotonic() < deadline and child.poll() is None, "the child never started"
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()

    replays: list[str] = []

    async def lookup_impl(ctx: Any) -> Any:
        replays.append(ctx.input.customer_id)
        return lookup.LookupCustomerOutput(found=False)

    runtime, refunds = runtime_with(example_package, SQLiteStore(db))
    runtime.register(
        lookup.SPEC, lookup_impl, context=lambda call: lookup.LookupCustomerContext(tenant_id="t")
    )
    results = {r.call.call_id: r for r in run(runtime.recover())}
    refund = results["refund-1"]
    assert isinstance(refund, ToolError) and refund.code == ErrorCode.INTERRUPTED
    assert "reconcile" in refund.message
    assert refunds.entries == []  # never run again
    assert isinstance(results["lookup-1"], ToolSuccess) and replays == ["cus_1"]
    assert run(runtime.recover()) == []  # everything is settled now
    for call_id in ("refund-1", "lookup-1"):
        record = runtime.store.call(call_id)
        assert record is not None and record.state == "settled"


# -- the store and the operators' command ------------------------------------------------------


def test_store_schema_is_versioned(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    SQLiteStore(path).close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer than this blade-runtime knows"):
        SQLiteStore(path)


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "blade-runtime"), *args],
        capture_output=True,
        text=True,
        input=stdin,
        check=False,
    )


def test_operators_list_show_submit_and_cancel(example_package: Any, tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    runtime, refunds = runtime_with(example_package, SQLiteStore(db))
    suspended = pending_of(run(runtime.call("refund_payment", REFUND, run_id="r1")))
    client = pending_of(
        run(runtime.call("check_page", {"url": "https://example.com"}, run_id="r2"))
    )
    listed = json.loads(cli("pending", "list", "--store", str(db), "--json").stdout)
    assert {a["name"] for a in listed} == {"refund_payment.approval", "check_page"}
    shown = json.loads(
        cli("pending", "show", suspended.action.action_id, "--store", str(db)).stdout
    )
    assert shown["origin"]["run_id"] == "r1" and shown["payload"]["prompt"] == "Refund 1250?"
    assert shown["call"] == {"state": "suspended", "result": None}

    invalid = cli(
        "pending", "submit", suspended.action.action_id, '{"approved": 1}', "--store", str(db)
    )
    assert invalid.returncode == 1 and "at /approved: must be of type boolean" in invalid.stderr
    ok = cli(
        "pending",
        "submit",
        suspended.action.action_id,
        "-",
        "--store",
        str(db),
        stdin='{"approved": true, "approver": "ops"}',
    )
    assert ok.returncode == 0, ok.stderr
    again = cli("pending", "submit", suspended.action.action_id, "{}", "--store", str(db))
    assert again.returncode == 1 and "already submitted" in again.stderr
    # The suspended call is resumable; the next recovery re-enters the implementation.
    [resumed] = run(runtime.recover())
    assert isinstance(resumed, ToolSuccess) and resumed.content["status"] == "refunded"  # type: ignore[index,call-overload]
    assert (
        isinstance(refunds.entries[-1], ResumeEntry)
        and refunds.entries[-1].payload.approver == "ops"
    )
    answered = json.loads(
        cli("pending", "show", suspended.action.action_id, "--store", str(db)).stdout
    )  # the action says it was submitted, and its call what became of it
    assert answered["state"] == "submitted" and answered["call"]["state"] == "settled"
    assert answered["call"]["result"]["status"] == "success"

    cancelled = cli(
        "pending", "cancel", client.action.action_id, "--store", str(db), "--reason", "stale"
    )
    assert cancelled.returncode == 0
    record = runtime.store.call(client.call.call_id)
    assert record is not None and record.result["code"] == "CANCELLED"  # type: ignore[index,call-overload]
    assert cli("pending", "list", "--store", str(tmp_path / "missing.db")).returncode == 3
    empty = cli("pending", "list", "--store", str(db))  # everything answered: nothing waits
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, "", "no pending actions\n")


def test_an_action_is_never_resumed_by_another_spec_under_its_old_name(
    example_package: Any, tmp_path: Path
) -> None:
    from blade_specs.deploy import deploy_service_v1

    path = tmp_path / "renamed.db"
    first, _ = runtime_with(example_package, SQLiteStore(path))
    waiting = pending_of(run(first.call("refund_payment", REFUND)))
    entered: list[Any] = []

    async def impostor(ctx: Any) -> Any:
        entered.append(ctx.entry)
        return deploy_service_v1.DeployServiceOutput(deployed=True, steps=1)

    later = Runtime(store=SQLiteStore(path))
    later.register(deploy_service_v1.SPEC, impostor, name="refund_payment")
    result = run(later.submit(waiting.action.action_id, {"approved": True, "approver": "ann"}))
    assert isinstance(result, ToolError) and result.code == ErrorCode.TOOL_HANDLER_NOT_FOUND
    assert entered == []
    stored = later.store.action(waiting.action.action_id)
    assert stored is not None and stored.state == "pending"  # it waits for its own spec
    # Answered outside any runtime, the call is resumable: a sweep claims it only for its spec.
    answered = cli(
        "pending",
        "submit",
        waiting.action.action_id,
        '{"approved": true, "approver": "ops"}',
        "--store",
        str(path),
    )
    assert answered.returncode == 0, answered.stderr
    assert run(later.recover()) == [] and entered == []
    record = later.store.call(waiting.call.call_id)
    assert record is not None and record.state == "resumable"
    [resumed] = run(first.recover())
    assert isinstance(resumed, ToolSuccess), resumed


def test_a_lone_surrogate_in_a_submission_is_an_invalid_submission_everywhere(
    example_package: Any, tmp_path: Path
) -> None:
    """A lone surrogate (valid JSON text, "\\ud800") cannot be validated: runtime.submit answers
    INVALID_SUBMISSION for a dict and for JSON text, the operators' CLI one line (exit 1), and
    the action stays pending."""
    path = tmp_path / "surrogate.db"
    runtime, _ = runtime_with(example_package, SQLiteStore(path))
    waiting = pending_of(run(runtime.call("refund_payment", REFUND)))
    action_id = waiting.action.action_id
    for payload in (
        {"approved": True, "approver": "a\ud800"},
        '{"approved": true, "approver": "a\\ud800"}',
    ):
        refused = run(runtime.submit(action_id, payload))
        assert isinstance(refused, ToolError), refused
        assert refused.code == ErrorCode.INVALID_SUBMISSION and "lone surrogate" in refused.message
    answered = cli(
        "pending",
        "submit",
        action_id,
        '{"approved": true, "approver": "a\\ud800"}',
        "--store",
        str(path),
    )
    assert answered.returncode == 1 and len(answered.stderr.splitlines()) == 1, answered.stderr
    assert "lone surrogate" in answered.stderr
    stored = runtime.store.action(action_id)
    assert stored is not None and stored.state == "pending"


class FailingStore(SQLiteStore):
    """A SQLite store whose methods named in ``failing`` raise StoreUnavailable."""

    failing: frozenset[str] = frozenset()

    def __getattribute__(self, name: str) -> Any:
        if name in object.__getattribute__(self, "failing"):

            def unavailable(*args: Any, **kwargs: Any) -> Any:
                from blade_runtime.core.store import StoreUnavailable

                raise StoreUnavailable(f"store down ({name})")

            return unavailable
        return super().__getattribute__(name)


def test_a_store_that_fails_around_a_pending_action_is_a_value_never_an_exception(
    example_package: Any, tmp_path: Path
) -> None:
    """Suspending, offering a client tool's action, asking for permission, submitting and
    cancelling, each with the store down: STORE_UNAVAILABLE (never an exception, never
    TOOL_ERROR "internal error"), and an action that could not be resolved stays pending."""
    from blade_runtime.core.permissions import Ask

    store = FailingStore(tmp_path / "failing.db")
    runtime, refunds = runtime_with(example_package, store)

    def down(*names: str) -> None:
        store.failing = frozenset(names)

    async def scenario() -> None:
        down("suspend")
        for name, arguments in (
            ("refund_payment", REFUND),
            ("check_page", {"url": "https://a.example"}),
        ):
            result = await runtime.call(name, arguments)
            assert (
                isinstance(result, ToolError) and result.code == ErrorCode.STORE_UNAVAILABLE
            ), result
        down()
        waiting = pending_of(await runtime.call("refund_payment", REFUND))
        action_id = waiting.action.action_id
        for failing in ("resolve", "action"):
            down(failing)
            answered = await runtime.submit(action_id, {"approved": True, "approver": "ann"})
            cancelled = await runtime.cancel(action_id)
            for result in (answered, cancelled):
                assert isinstance(result, ToolError), result
                assert result.code == ErrorCode.STORE_UNAVAILABLE and action_id in result.message
        down()
        stored = store.action(action_id)
        assert stored is not None and stored.state == "pending"

        asking = Runtime(store=store, permission=lambda request: Ask("refund?"))
        refunds.register(asking)
        entered = refunds.entries[:]
        down("suspend")
        asked = await asking.call("refund_payment", REFUND)
        assert isinstance(asked, ToolError) and asked.code == ErrorCode.STORE_UNAVAILABLE, asked
        assert "did not run" in asked.message and refunds.entries == entered
        down()
        await asking.close()
        await runtime.close()

    run(scenario())


class UnrenewableStore(SQLiteStore):
    """A SQLite store whose lease renewals all fail (the heartbeat's connection is lost)."""

    def renewer(self) -> Any:
        from blade_runtime.core.store import StoreUnavailable

        class Refusing:
            def renew(self, owner: str, lease_s: float) -> set[str]:
                raise StoreUnavailable("the renewer's connection is lost")

            def close(self) -> None:
                pass

        return Refusing()


def test_a_call_whose_lease_no_renewal_confirms_is_stopped_before_another_worker_takes_it(
    example_package: Any, tmp_path: Path
) -> None:
    """Every renewal fails: within a lease of the last confirmed one this runtime stops the call
    (CANCELLED, as recorded), so another worker's recovery never runs it beside it."""
    from blade_specs.crm import lookup_customer_v1 as lookup

    entered: list[str] = []

    def slow(who: str) -> Any:
        async def implementation(ctx: Any) -> Any:
            entered.append(who)
            await asyncio.sleep(3)
            return lookup.LookupCustomerOutput(found=True)

        return implementation

    path = tmp_path / "unrenewable.db"
    worker = Runtime(store=UnrenewableStore(path), lease_s=0.6)
    context = lambda call: lookup.LookupCustomerContext(tenant_id="t")  # noqa: E731
    worker.register(lookup.SPEC, slow("worker"), context=context)
    other = Runtime(store=SQLiteStore(path), lease_s=0.6)
    other.register(lookup.SPEC, slow("other"), context=context)

    async def scenario() -> tuple[Any, list[Any]]:
        call = asyncio.create_task(
            worker.call("lookup_customer", {"customer_id": "cus_1"}, call_id="c1")
        )
        await asyncio.sleep(1.2)
        recovered = await other.recover()
        result = await call
        await worker.close()
        await other.close()
        return result, recovered

    result, recovered = run(scenario())
    assert isinstance(result, ToolError) and result.code == ErrorCode.LEASE_LOST, result
    assert "could not renew its lease" in result.message
    assert recovered == [] and entered == ["worker"]
    stored = other.store.call("c1")
    assert stored is not None and stored.result is not None
    assert stored.result["code"] == "LEASE_LOST"  # type: ignore[call-overload,index]


@pytest.mark.parametrize("settle_by", ["client_output", "cancel", "fail"])
def test_a_call_its_action_settles_is_observed_as_settled_with_its_caller(
    example_package: Any, settle_by: str
) -> None:
    from blade_runtime import CallContext, Principal
    from blade_runtime.core.observers import Lifecycle

    runtime, _ = runtime_with(example_package, MemoryStore())
    seen: list[tuple[str, str | None, Any]] = []

    class Settled:
        async def settled(self, event: Lifecycle) -> None:
            principal = event.call.context and event.call.context.principal
            seen.append((event.call.name, principal and principal.id, event.input))

    runtime.observe(Settled())
    context = CallContext(principal=Principal("ann", "acme"))

    async def scenario() -> ToolResult[Any]:
        waiting = pending_of(
            await runtime.call("check_page", {"url": "https://example.com"}, context=context)
        )
        action_id = waiting.action.action_id
        if settle_by == "client_output":
            return await runtime.submit(action_id, {"status_code": 200})
        if settle_by == "cancel":
            return await runtime.cancel(action_id, "the user left")
        return await runtime.fail(action_id, "the browser crashed")

    result = run(scenario())
    expected = {"client_output": "success", "cancel": "CANCELLED", "fail": "TOOL_FAILED"}
    assert (result.code if isinstance(result, ToolError) else "success") == expected[settle_by]
    assert seen == [("check_page", "ann", {"url": "https://example.com"})]


def test_a_result_the_store_could_not_take_is_recorded_when_it_is_back(
    example_package: Any, tmp_path: Path
) -> None:
    """STORE_UNAVAILABLE while recording a result: the caller is told so, the call stays the
    worker's (no recovery runs it again beside it), and the result lands once the store is
    back, so a later reader gets what the tool did."""
    from blade_specs.crm import lookup_customer_v1 as lookup

    entered: list[str] = []

    async def implementation(ctx: Any) -> Any:
        entered.append(ctx.call.call_id)
        return lookup.LookupCustomerOutput(found=True)

    path = tmp_path / "back.db"
    store = FailingStore(path)
    runtime = Runtime(store=store, lease_s=0.6)
    context = lambda call: lookup.LookupCustomerContext(tenant_id="t")  # noqa: E731
    runtime.register(lookup.SPEC, implementation, context=context)
    other = Runtime(store=SQLiteStore(path), lease_s=0.6)
    other.register(lookup.SPEC, implementation, context=context)

    async def scenario() -> tuple[Any, Any, list[Any]]:
        store.failing = frozenset({"settle"})
        told = await runtime.call("lookup_customer", {"customer_id": "cus_1"}, call_id="c1")
        before = store.call("c1")
        recovered = await other.recover()  # the worker lives: its lease holds
        store.failing = frozenset()
        for _ in range(100):
            record = store.call("c1")
            if record is not None and record.state == "settled":
                break
            await asyncio.sleep(0.05)
        await runtime.close()
        await other.close()
        return told, before, recovered

    told, before, recovered = run(scenario())
    assert isinstance(told, ToolError) and told.code == ErrorCode.STORE_UNAVAILABLE, told
    assert before is not None and before.state == "running"
    assert recovered == [] and entered == ["c1"]
    record = store.call("c1")
    assert record is not None and record.state == "settled"
    assert record.result is not None and record.result["status"] == "success"  # type: ignore[call-overload,index]
