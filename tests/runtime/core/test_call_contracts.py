"""The seeds' smaller contracts of a call: close() fails closed and says what it left running, a
hook's signal fires at its deadline, synchronous implementations run in a worker thread, and a
policy's decision word is that decision."""

from __future__ import annotations

import asyncio
import importlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import _import_package, add_spec, spec

from blade_codegen.build import build
from blade_runtime import HookEvent, HookInput, Runtime
from blade_runtime.core.registry import RegistrationError
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolSuccess
from blade_runtime.stores.sqlite import SQLiteStore

COUNT = {
    "name": "count",
    "kind": "write",
    "sideEffect": "idempotent",
    "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    "outputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}},
}


@pytest.fixture(scope="module")
def count(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("contracts")
    add_spec(root / "specs", spec("ops.count.v1", **COUNT))
    build(root / "specs", root / "out", "contracts_pkg")
    _import_package(root / "out", "contracts_pkg")
    return importlib.import_module("contracts_pkg.ops.count_v1")


# -- close() -------------------------------------------------------------------------------------


async def ignoring_cancellation_until(release: threading.Event) -> None:
    """What a stubborn implementation or hook does: it swallows every cancellation."""
    while not release.is_set():
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            continue


def test_close_names_a_call_abandoned_after_its_grace_and_a_stuck_hook(
    count: Any, tmp_path: Path
) -> None:
    """cleanup_grace_s shorter than close's timeout: the implementation is detached (its call
    settled CANCELLED), still running, and the report names it; a hook past its budget too."""
    release = threading.Event()

    async def stubborn(ctx: Any) -> Any:
        await ignoring_cancellation_until(release)
        return count.SPEC.output_type(n=ctx.input.n)

    async def stuck_hook(event: HookInput) -> None:
        await ignoring_cancellation_until(release)

    async def scenario() -> tuple[Any, Any, Any, str]:
        store = SQLiteStore(tmp_path / "close.db")
        runtime = Runtime(store=store, lease_s=1.0, cleanup_grace_s=0.1, hook_timeout_ms=50)
        runtime.register(count.SPEC, stubborn)
        runtime.on(HookEvent.POST_TOOL_USE_FAILURE, stuck_hook)
        calling = asyncio.ensure_future(runtime.call("count", {"n": 1}, call_id="stubborn-1"))
        await asyncio.sleep(0.2)
        report = await runtime.close(timeout_s=1.0)
        result = await calling
        record = store.call("stubborn-1")
        release.set()
        await runtime.wait_closed()
        store.close()
        assert record is not None
        return report, result, record.result, record.state

    report, result, stored, state = asyncio.run(scenario())
    assert report.abandoned == ("stubborn-1",) and not report.clean
    assert report.leases_kept == ()  # its call settled when it was detached: nothing to keep
    assert report.stuck_events == ("post_tool_use_failure",) and report.stuck_callbacks == 1
    assert isinstance(result, ToolError) and result.code is ErrorCode.CANCELLED
    assert state == "settled" and stored["code"] == "CANCELLED"


def test_close_keeps_the_lease_of_a_call_still_running_until_it_ends(
    count: Any, tmp_path: Path
) -> None:
    """Within its grace, a call that ignores cancellation keeps its lease, renewed past
    several lease lengths, and its end is recorded when it comes; only then is it let go."""
    release = threading.Event()

    async def stubborn(ctx: Any) -> Any:
        await ignoring_cancellation_until(release)
        return count.SPEC.output_type(n=ctx.input.n)

    async def scenario() -> tuple[Any, float, str, Any]:
        store = SQLiteStore(tmp_path / "kept.db")
        runtime = Runtime(store=store, lease_s=0.3, cleanup_grace_s=30)
        runtime.register(count.SPEC, stubborn)
        calling = asyncio.ensure_future(runtime.call("count", {"n": 2}, call_id="kept-1"))
        await asyncio.sleep(0.1)
        report = await runtime.close(timeout_s=0.1)
        await asyncio.sleep(1.2)  # four lease lengths
        record = store.call("kept-1")
        assert record is not None and record.state == "running"
        lease_left = record.lease_until - time.time()
        release.set()
        result = await calling
        await asyncio.wait_for(runtime.wait_closed(), 10)
        settled = store.call("kept-1")
        store.close()
        assert settled is not None
        return report, lease_left, settled.state, result

    report, lease_left, state, result = asyncio.run(scenario())
    assert report.abandoned == ("kept-1",) and report.leases_kept == ("kept-1",)
    assert lease_left > 0, "the lease lapsed while the implementation still ran"
    assert state == "settled"
    assert isinstance(result, ToolError) and result.code is ErrorCode.CANCELLED


# -- hooks ---------------------------------------------------------------------------------------


def test_a_hooks_signal_fires_at_its_deadline(count: Any) -> None:
    seen: list[tuple[bool, str | None]] = []

    async def patient(event: HookInput) -> None:
        await event.signal.wait()  # a hook that honours its signal stops at the deadline
        seen.append((event.signal.cancelled, event.signal.reason))

    async def run(ctx: Any) -> Any:
        return count.SPEC.output_type(n=ctx.input.n)

    async def scenario() -> Any:
        runtime = Runtime(hook_timeout_ms=100)
        runtime.register(count.SPEC, run)
        runtime.on(HookEvent.PRE_TOOL_USE, patient)
        return await runtime.call("count", {"n": 1})

    result = asyncio.run(scenario())
    assert isinstance(result, ToolError) and result.code is ErrorCode.HOOK_TIMEOUT
    assert len(seen) == 1 and seen[0][0] is True
    assert "budget" in (seen[0][1] or "")


# -- synchronous implementations -----------------------------------------------------------------


def test_a_synchronous_implementation_runs_in_a_worker_thread(count: Any) -> None:
    threads: list[int] = []

    def blocking(ctx: Any) -> Any:
        threads.append(threading.get_ident())
        ctx.progress("half way", completed=1, total=2)
        time.sleep(0.05)  # blocks its thread, not the loop
        return count.SPEC.output_type(n=ctx.input.n + 1)

    async def scenario() -> tuple[Any, int, int]:
        runtime = Runtime()
        runtime.register(count.SPEC, blocking)
        ticks = 0

        async def ticking() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        ticker = asyncio.ensure_future(ticking())
        result = await runtime.call("count", {"n": 41})
        ticker.cancel()
        return result, ticks, threading.get_ident()

    result, ticks, loop_thread = asyncio.run(scenario())
    assert isinstance(result, ToolSuccess) and result.output.n == 42
    assert threads and threads[0] != loop_thread
    assert ticks >= 2  # the loop went on while the function blocked


def test_a_synchronous_implementation_sees_its_timeout_on_the_signal(count: Any) -> None:
    stopped: list[str | None] = []

    def polite(ctx: Any) -> Any:
        while not ctx.signal.cancelled:
            time.sleep(0.01)
        stopped.append(ctx.signal.reason)
        return count.SPEC.output_type(n=0)

    async def scenario() -> Any:
        runtime = Runtime(timeout_ms=100)
        runtime.register(count.SPEC, polite)
        return await runtime.call("count", {"n": 1})

    result = asyncio.run(scenario())
    assert isinstance(result, ToolError) and result.code is ErrorCode.TIMEOUT, result
    assert stopped and "deadline" in (stopped[0] or "")


@pytest.mark.parametrize("kind", ["async generator", "generator"])
def test_a_generator_is_refused_at_registration(count: Any, kind: str) -> None:
    async def agen(ctx: Any) -> Any:
        yield count.SPEC.output_type(n=1)

    def gen(ctx: Any) -> Any:
        yield count.SPEC.output_type(n=1)

    runtime = Runtime()
    with pytest.raises(RegistrationError, match=f"the implementation is an? {kind}"):
        runtime.register(count.SPEC, agen if kind == "async generator" else gen)
    assert list(runtime.registrations()) == []


# -- the policy's words --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        ("allow", "ran"),
        ("Allow", "ran"),
        ("ask", "asked"),
        ("deny", "The tool call was not permitted."),
        ("Only on weekdays.", "Only on weekdays."),
    ],
)
def test_a_policys_decision_word_is_that_decision(count: Any, answer: str, outcome: str) -> None:
    async def run(ctx: Any) -> Any:
        return count.SPEC.output_type(n=ctx.input.n)

    async def scenario() -> Any:
        runtime = Runtime(permission=lambda request: answer)
        runtime.register(count.SPEC, run)
        return await runtime.call("count", {"n": 3})

    result = asyncio.run(scenario())
    if outcome == "ran":
        assert isinstance(result, ToolSuccess), result
    elif outcome == "asked":
        assert isinstance(result, ToolPending), result
    else:
        assert isinstance(result, ToolError) and result.code is ErrorCode.PERMISSION_DENIED
        assert result.message == outcome


# -- the public API ------------------------------------------------------------------------------


def test_the_runtimes_api_is_its_methods_and_pending_has_an_async_twin(
    count: Any, tmp_path: Path
) -> None:
    """help(Runtime), pydoc and editors read the class: every public call is a method of it."""
    for name in ("call", "submit", "cancel", "fail", "pending", "apending", "recover"):
        assert callable(getattr(Runtime, name, None)), name
        assert (getattr(Runtime, name).__doc__ or "").strip(), name
    for name in ("grants", "revoke_grant", "run_recovery", "export", "on", "observe"):
        assert callable(getattr(Runtime, name, None)), name

    async def asks(ctx: Any) -> Any:
        return count.SPEC.output_type(n=ctx.input.n)

    async def scenario() -> tuple[list[Any], list[Any]]:
        store = SQLiteStore(tmp_path / "pending.db")
        runtime = Runtime(store=store, permission=lambda request: "ask")
        runtime.register(count.SPEC, asks)
        await runtime.call("count", {"n": 5}, run_id="r-1")
        listed = await runtime.apending(run_id="r-1")
        blocking = runtime.pending(run_id="r-1")
        await runtime.close()
        store.close()
        return listed, blocking

    listed, blocking = asyncio.run(scenario())
    assert [a.action_id for a in listed] == [a.action_id for a in blocking]
    assert len(listed) == 1 and listed[0].name == "count.@permission"


def test_progress_carries_data_and_a_resume_token_to_a_subscriber(count: Any) -> None:
    """Seed 000's progress yield: message, data, completed, total, resumeToken."""

    async def uploading(ctx: Any) -> Any:
        ctx.progress(completed=1, total=3, data={"part": 1, "etag": "a1"}, resume_token="up-1")
        ctx.progress("almost", completed=2, total=3)
        ctx.progress(data={"odd": {1, 2}})  # not JSON: its text, never a failed tool
        return count.SPEC.output_type(n=ctx.input.n)

    async def scenario() -> tuple[Any, list[Any]]:
        runtime = Runtime()
        runtime.register(count.SPEC, uploading)
        subscription = runtime.subscribe("uploads")
        result = await runtime.call("count", {"n": 1}, run_id="uploads")
        seen = []
        async for event in subscription:
            if event.kind == "progress":
                seen.append(event.payload)
            if event.kind == "result":
                break
        subscription.close()
        return result, seen

    result, seen = asyncio.run(scenario())
    assert isinstance(result, ToolSuccess)
    first, second, third = seen
    assert first == {
        "message": "",
        "completed": 1,
        "total": 3,
        "data": {"part": 1, "etag": "a1"},
        "resume_token": "up-1",
    }
    assert second == {"message": "almost", "completed": 2, "total": 3}  # nothing more given
    assert third["data"] == "{'odd': {1, 2}}"


def test_an_implementation_learns_who_called_only_when_its_spec_declares_caller(
    tmp_path: Path,
) -> None:
    """Seed 002: a tool gets only the context it declared. Without "caller": true its ctx.call
    keeps the thread and nothing of the principal or the client's data; the registration's
    context provider (application code) still reads the whole call."""
    from blade_runtime import CallContext, Principal

    root = tmp_path / "caller"
    context_schema = {"type": "object", "properties": {"tenant": {"type": "string"}}}
    add_spec(root / "specs", spec("ops.count.v1", **COUNT, contextSchema=context_schema))
    add_spec(root / "specs", spec("ops.whoami.v1", **{**COUNT, "name": "whoami"}, caller=True))
    build(root / "specs", root / "out", "caller_pkg")
    _import_package(root / "out", "caller_pkg")
    plain = importlib.import_module("caller_pkg.ops.count_v1")
    told = importlib.import_module("caller_pkg.ops.whoami_v1")
    assert told.SPEC.caller is True and plain.SPEC.caller is False
    seen: list[Any] = []

    def recording(module: Any) -> Any:
        async def run(ctx: Any) -> Any:
            seen.append((ctx.call.call_id, ctx.call.context, getattr(ctx, "context", None)))
            return module.SPEC.output_type(n=ctx.input.n)

        return run

    def provider(call: Any) -> Any:  # application code: the whole call
        return plain.CountContext(tenant=call.context.principal.tenant)

    caller = CallContext(
        principal=Principal("ann", "acme"), client_data={"cart": 3}, thread_id="t-1"
    )

    async def scenario() -> None:
        runtime = Runtime()
        runtime.register(plain.SPEC, recording(plain), context=provider)
        runtime.register(told.SPEC, recording(told))
        await runtime.call("count", {"n": 1}, call_id="c-plain", context=caller)
        await runtime.call("whoami", {"n": 1}, call_id="c-told", context=caller)

    asyncio.run(scenario())
    (plain_id, plain_seen, declared), (told_id, told_seen, _) = seen
    assert plain_id == "c-plain" and told_id == "c-told"
    assert plain_seen == CallContext(thread_id="t-1")  # no principal, no client data
    assert declared.tenant == "acme"  # what it declared, from the provider
    assert told_seen is caller or told_seen == caller
