"""Child tools: a spec names the tools it may call by id; ``ctx.tools.call`` is typed and
allowlisted."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from conftest import _import_package, add_spec, run_mypy, spec

from blade_codegen.build import build
from blade_codegen.problems import SpecError
from blade_runtime import Child, ChildToolError, Runtime, ToolError, ToolSuccess

NUMBER = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def family(root: Path) -> Path:
    specs = root / "specs"
    add_spec(
        specs,
        spec(
            "kin.child.v1",
            name="child",
            sideEffect="pure",
            inputSchema=NUMBER,
            outputSchema={
                "type": "object",
                "properties": {"double": {"type": "integer"}},
                "required": ["double"],
            },
        ),
    )
    add_spec(specs, spec("kin.other.v1", name="other"))
    add_spec(
        specs,
        spec(
            "kin.parent.v1",
            name="parent",
            inputSchema=NUMBER,
            outputSchema={"type": "object", "properties": {"sum": {"type": "integer"}}},
            children=["kin.child.v1", "kin.other.v1"],
        ),
    )
    add_spec(
        specs,
        spec(
            "kin.asker.v1",
            name="asker",
            sideEffect="pure",
            inputSchema=NUMBER,
            outputSchema={"type": "object", "properties": {"sum": {"type": "integer"}}},
            children=["kin.child.v1"],
            suspend={
                "confirm": {
                    "suspendSchema": {"type": "object"},
                    "resumeSchema": {"type": "object"},
                }
            },
        ),
    )
    return specs


USER = """
from kin_pkg.kin import child_v1, other_v1, parent_v1


async def parent(ctx: parent_v1.ParentExecution) -> parent_v1.ParentOutput:
    out = await ctx.tools.call(child_v1.SPEC, child_v1.ChildInput(n=ctx.input.n))
    other = await ctx.tools.call(other_v1.SPEC, other_v1.OtherInput(q="x"))
    assert other is None or isinstance(other, (dict, list, str, int, float, bool))
    return parent_v1.ParentOutput(sum=out.double + 1)
"""
WRONG = """
from kin_pkg.kin import child_v1, parent_v1


async def parent(ctx: parent_v1.ParentExecution) -> parent_v1.ParentOutput:
    out = await ctx.tools.call(child_v1.SPEC, parent_v1.ParentInput(n=1))
    return parent_v1.ParentOutput(sum=out.double)


async def lonely(ctx: child_v1.ChildExecution) -> child_v1.ChildOutput:
    await ctx.tools.call(child_v1.SPEC, child_v1.ChildInput(n=1))
    return child_v1.ChildOutput(double=1)
"""


@pytest.fixture(scope="module")
def kin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("kin")
    build(family(root), root / "out", "kin_pkg")
    return root / "out", _import_package(root / "out", "kin_pkg")


def test_child_calls_are_typed_and_only_declared_children_type_check(
    kin: tuple[Path, Any], tmp_path: Path
) -> None:
    out, _ = kin
    (tmp_path / "user.py").write_text(USER, "utf-8")
    (tmp_path / "wrong.py").write_text(WRONG, "utf-8")
    good = run_mypy(tmp_path / "user.py", cwd=out)
    assert good.returncode == 0, good.stdout
    bad = run_mypy(tmp_path / "wrong.py", cwd=out)
    errors = [line for line in bad.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 2, bad.stdout
    assert 'No overload variant of "call"' in errors[0] and '"ParentInput"' in errors[0]
    assert '"ChildExecution" has no attribute "tools"' in errors[1]


def test_runtime_calls_children_in_the_same_run_and_refuses_others(kin: tuple[Path, Any]) -> None:
    from kin_pkg.kin import child_v1, other_v1, parent_v1

    seen: list[tuple[str, str]] = []

    async def child(ctx: Any) -> Any:
        seen.append((ctx.call.call_id, ctx.call.run_id))
        if ctx.input.n < 0:
            ctx.fail("n must not be negative")
        return child_v1.ChildOutput(double=ctx.input.n * 2)

    async def parent(ctx: Any) -> Any:
        if ctx.input.n == 99:  # not a declared child: refused whatever the typing says
            await ctx.tools.call(parent_v1.SPEC, parent_v1.ParentInput(n=1))
        try:
            out = await ctx.tools.call(child_v1.SPEC, child_v1.ChildInput(n=ctx.input.n))
        except ChildToolError as failed:
            ctx.fail(f"{failed.code}: {failed.message}")
        return parent_v1.ParentOutput(sum=out.double + 1)

    async def scenario() -> None:
        runtime = Runtime()
        runtime.register(parent_v1.SPEC, parent)
        unregistered = await runtime.call("parent", {"n": 1}, call_id="p0")
        assert (
            isinstance(unregistered, ToolError) and "TOOL_HANDLER_NOT_FOUND" in unregistered.message
        )
        runtime.register(child_v1.SPEC, child)
        runtime.register(other_v1.SPEC, lambda ctx: _none())
        done = await runtime.call("parent", {"n": 4}, call_id="p1", run_id="r1")
        assert isinstance(done, ToolSuccess) and done.output.sum == 9
        assert seen == [("p1/child/1", "r1")]
        failed = await runtime.call("parent", {"n": -1}, call_id="p2")
        assert isinstance(failed, ToolError)
        assert failed.message == "TOOL_FAILED: n must not be negative"
        refused = await runtime.call("parent", {"n": 99}, call_id="p3")
        assert isinstance(refused, ToolError) and refused.code == "TOOL_ERROR"

    asyncio.run(scenario())


async def _none() -> None:
    return None


@pytest.mark.parametrize(
    ("child", "message"),
    [
        ("kin.nowhere.v1", "child 'kin.nowhere.v1' is not a tool of this spec tree"),
        ("kin.waiter.v1", "child 'kin.waiter.v1' (in this spec tree) has suspend points"),
        ("kin.browser.v1", "child 'kin.browser.v1' (in this spec tree) has client execution"),
        ("kin.boss.v1", "a tool cannot be its own child"),
    ],
)
def test_children_must_be_ordinary_backend_tools(tmp_path: Path, child: str, message: str) -> None:
    specs = tmp_path / "specs"
    pair = {"type": "object"}
    add_spec(
        specs, spec("kin.waiter.v1", suspend={"ok": {"suspendSchema": pair, "resumeSchema": pair}})
    )
    add_spec(specs, spec("kin.browser.v1", execution="client", outputSchema=pair))
    add_spec(specs, spec("kin.boss.v1", children=[child]))
    with pytest.raises(SpecError) as refused:
        build(specs, tmp_path / "out", "kin_pkg")
    lines = [line for line in str(refused.value).splitlines() if "/children/0" in line]
    assert len(lines) == 1 and message in lines[0], str(refused.value)
    assert lines[0].startswith("kin/boss.v1.json:")


def test_a_parent_calls_its_child_again_after_a_resume_and_after_a_replay(
    kin: tuple[Path, Any], tmp_path: Path
) -> None:
    """Child call ids come from the parent's entry, and only the parent is a durable part: a
    resumed parent calling its child again, and a pure parent replayed by recovery, work."""
    from kin_pkg.kin import asker_v1, child_v1

    from blade_runtime import ResumeEntry, ToolPending
    from blade_runtime.stores.sqlite import SQLiteStore

    children: list[str] = []
    dead: list[str] = []  # the first entry of a7 hangs: its worker died there

    async def child(ctx: Any) -> Any:
        children.append(ctx.call.call_id)
        return child_v1.ChildOutput(double=ctx.input.n * 2)

    async def asker(ctx: Any) -> Any:
        out = await ctx.tools.call(child_v1.SPEC, child_v1.ChildInput(n=ctx.input.n))
        if ctx.input.n == 7 and not dead:
            dead.append(ctx.call.call_id)
            await asyncio.Event().wait()  # the worker dies here (its lease lapses)
        if not isinstance(ctx.entry, ResumeEntry) and ctx.input.n == 1:
            ctx.suspend("confirm", asker_v1.AskerConfirmSuspend())
        return asker_v1.AskerOutput(sum=out.double)

    def runtime(lease_s: float = 5.0) -> Runtime:
        made = Runtime(store=SQLiteStore(tmp_path / "kin.db"), lease_s=lease_s)
        made.register(child_v1.SPEC, child)
        made.register(asker_v1.SPEC, asker)
        return made

    async def scenario() -> None:
        first = runtime()
        waiting = await first.call("asker", {"n": 1}, call_id="a1")
        assert isinstance(waiting, ToolPending), waiting
        resumed = await first.submit(waiting.action.action_id, {})
        assert isinstance(resumed, ToolSuccess), resumed
        assert children == ["a1/child/1", f"a1/{waiting.action.action_id}/child/1"]

        dying = runtime(lease_s=0.3)
        task = asyncio.create_task(dying.call("asker", {"n": 7}, call_id="a7"))
        while "a7/child/1" not in children:
            await asyncio.sleep(0.01)
        dying.leases.close()  # its heartbeat stops: the lease lapses
        await asyncio.sleep(0.5)
        later = runtime()
        (replayed,) = await later.recover()
        assert isinstance(replayed, ToolSuccess) and replayed.output.sum == 14, replayed
        assert children.count("a7/child/1") == 2  # run again, under the same id
        assert later.store.call("a7/child/1") is None  # never a durable part of its own
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await first.close()
        await later.close()

    asyncio.run(scenario())


def test_a_parent_owns_its_child_registrations(kin: tuple[Path, Any]) -> None:
    """A parent's own registration of a child (002's child registrations): its implementation,
    context, ``enabled`` (decided once per parent call, read as ``ctx.tools.enabled``), policy and
    ``on_output`` are its own, apart from the direct registration of the same spec; one child
    cut short leaves its siblings; ``describe`` reads the enabled children's metadata."""
    from kin_pkg.kin import child_v1, other_v1, parent_v1

    from blade_runtime import CallContext, Child, Principal, RegistrationError

    observed: list[tuple[int, str | None]] = []
    answers: dict[str, Any] = {}
    readers = {"ann"}  # who may use the parent's child: read when each parent call starts

    async def direct(ctx: Any) -> Any:
        return child_v1.ChildOutput(double=ctx.input.n * 2)

    async def own(ctx: Any) -> Any:
        if ctx.input.n == 0:
            await asyncio.Event().wait()  # a slow child: its parent gives up on it
        return child_v1.ChildOutput(double=ctx.input.n * 10)

    async def parent(ctx: Any) -> Any:
        answers[ctx.call.call_id] = (
            ctx.tools.enabled(child_v1.SPEC),
            ctx.tools.enabled(other_v1.SPEC),  # declared, but registered nowhere
        )
        if ctx.input.n == 5:
            readers.discard("ann")  # too late for this call: it decided when it started
        try:
            async with asyncio.TaskGroup() as group:
                slow = group.create_task(_cut_short(ctx, child_v1.ChildInput(n=0)))
                fast = group.create_task(
                    ctx.tools.call(child_v1.SPEC, child_v1.ChildInput(n=ctx.input.n))
                )
        except* ChildToolError as failed:
            error = failed.exceptions[0]
            assert isinstance(error, ChildToolError)
            ctx.fail(f"{error.code}: {error.message}")
        assert slow.result() == "cut short"
        return parent_v1.ParentOutput(sum=fast.result().double)

    async def _cut_short(ctx: Any, input: Any) -> str:
        try:
            async with asyncio.timeout(0.05):
                await ctx.tools.call(child_v1.SPEC, input)
        except TimeoutError:
            return "cut short"
        return "finished"

    def only_readers(call: Any) -> bool:
        principal = call.context.principal if call.context else None
        return principal is not None and principal.id in readers

    def denies_big(request: Any) -> str | None:
        return "too big" if request.input.get("n", 0) > 100 else None

    def describe(context: Any, *, children: Any) -> str:
        return "Sums with " + (", ".join(sorted(children)) or "no children")

    def as_for(who: str) -> CallContext:
        return CallContext(principal=Principal(who, "acme"))

    async def scenario() -> None:
        runtime = Runtime()
        runtime.register(child_v1.SPEC, direct)
        with pytest.raises(RegistrationError, match="does not declare it as a child"):
            runtime.register(parent_v1.SPEC, parent, children=[Child(parent_v1.SPEC, own)])
        runtime.register(
            parent_v1.SPEC,
            parent,
            describe=describe,
            children=[
                Child(
                    child_v1.SPEC,
                    own,
                    enabled=only_readers,
                    permission=denies_big,
                    on_output=lambda output, call: observed.append((output.double, call.parent)),
                )
            ],
        )
        done = await runtime.call("parent", {"n": 4}, call_id="p1", context=as_for("ann"))
        assert isinstance(done, ToolSuccess) and done.output.sum == 40, done  # its own child
        assert answers["p1"] == (True, False)
        assert observed == [(40, "p1")]  # only the output the parent received
        direct_call = await runtime.call("child", {"n": 4})  # the direct registration stays
        assert isinstance(direct_call, ToolSuccess) and direct_call.output.double == 8

        denied = await runtime.call("parent", {"n": 101}, call_id="p2", context=as_for("ann"))
        assert isinstance(denied, ToolError) and denied.message.startswith("PERMISSION_DENIED")

        def description(who: str) -> Any:
            document: Any = runtime.export(context=as_for(who)).document
            (tool,) = [t for t in document["tools"] if t["name"] == "parent"]
            return tool["description"]

        assert description("ann") == "Sums with kin.child.v1"
        assert description("bob") == "Sums with no children"

        refused = await runtime.call("parent", {"n": 3}, call_id="p3", context=as_for("bob"))
        assert answers["p3"] == (False, False)
        assert isinstance(refused, ToolError) and refused.message.startswith("TOOL_NOT_ALLOWED")

        kept = await runtime.call("parent", {"n": 5}, call_id="p4", context=as_for("ann"))
        assert isinstance(kept, ToolSuccess) and kept.output.sum == 50  # decided at its start
        after = await runtime.call("parent", {"n": 5}, call_id="p5", context=as_for("ann"))
        assert answers["p5"] == (False, False) and isinstance(after, ToolError)

    asyncio.run(scenario())


def test_a_failing_child_output_observer_ends_the_parent(kin: tuple[Path, Any]) -> None:
    """An ``on_output`` that raises is an observer's failure: fatal to the parent even though
    the parent catches the child's error."""
    from kin_pkg.kin import child_v1, parent_v1

    from blade_runtime import Child

    async def own(ctx: Any) -> Any:
        return child_v1.ChildOutput(double=1)

    async def parent(ctx: Any) -> Any:
        with contextlib.suppress(BaseException):  # the runtime ends the parent anyway
            await ctx.tools.call(child_v1.SPEC, child_v1.ChildInput(n=1))
        return parent_v1.ParentOutput(sum=0)

    def broken(output: Any, call: Any) -> None:
        raise RuntimeError("observer bug")

    async def scenario() -> None:
        runtime = Runtime()
        runtime.register(
            parent_v1.SPEC, parent, children=[Child(child_v1.SPEC, own, on_output=broken)]
        )
        result = await runtime.call("parent", {"n": 1})
        assert isinstance(result, ToolError) and result.code == "OBSERVER_FAILED", result

    asyncio.run(scenario())


def test_a_child_the_runtime_refuses_by_name_is_not_enabled_and_its_own_timeout_is_quoted(
    kin: tuple[Path, Any],
) -> None:
    """``ctx.tools.enabled`` and ``describe(children=)`` agree with the runtime's disallowed
    list; a parent's own child times out on its own limit and says that limit."""
    from kin_pkg.kin import child_v1, parent_v1

    from blade_runtime import Child

    seen: dict[str, Any] = {}

    async def child(ctx: Any) -> Any:
        if ctx.input.n == 0:
            await asyncio.sleep(5)
        return child_v1.ChildOutput(double=2)

    async def parent(ctx: Any) -> Any:
        seen["enabled"] = ctx.tools.enabled(child_v1.SPEC)
        try:
            await ctx.tools.call(child_v1.SPEC, child_v1.ChildInput(n=ctx.input.n))
        except ChildToolError as failed:
            seen["error"] = f"{failed.code}: {failed.message}"
        return parent_v1.ParentOutput(sum=0)

    def describe(context: Any, *, children: Any) -> str:
        return "can use: " + (", ".join(children) or "nothing")

    async def scenario() -> None:
        refusing = Runtime(disallowed={"child"})
        refusing.register(child_v1.SPEC, child)
        refusing.register(parent_v1.SPEC, parent, describe=describe)
        await refusing.call("parent", {"n": 1})
        assert seen == {
            "enabled": False,
            "error": "TOOL_NOT_ALLOWED: The tool 'child' is not enabled.",
        }
        document: Any = refusing.export().document
        assert [t["description"] for t in document["tools"] if t["name"] == "parent"] == [
            "can use: nothing"
        ]
        seen.clear()
        own = Runtime()
        own.register(parent_v1.SPEC, parent, children=[Child(child_v1.SPEC, child, timeout_ms=100)])
        await own.call("parent", {"n": 0})
        assert seen["enabled"] is True
        assert seen["error"] == "TIMEOUT: The tool did not finish within 0.1 s.", seen

    asyncio.run(scenario())


def test_a_child_whose_enabled_raises_stops_its_parent_before_it_runs(
    kin: tuple[Path, Any],
) -> None:
    """PAI: a failure resolving the parent's children prevents the parent from starting."""
    from kin_pkg.kin import child_v1, parent_v1

    entered: list[str] = []

    async def child(ctx: Any) -> Any:
        entered.append("child")
        return child_v1.ChildOutput(double=2)

    async def parent(ctx: Any) -> Any:
        entered.append("parent")
        return parent_v1.ParentOutput(sum=0)

    def broken(call: Any) -> bool:
        raise RuntimeError("the directory is down")

    async def scenario() -> Any:
        runtime = Runtime()
        runtime.register(
            parent_v1.SPEC, parent, children=[Child(child_v1.SPEC, child, enabled=broken)]
        )
        return await runtime.call("parent", {"n": 1})

    result = asyncio.run(scenario())
    assert isinstance(result, ToolError) and result.code.value == "POLICY_FAILED", result
    assert entered == []


def test_a_childs_projection_never_runs_and_its_parent_gets_the_whole_output(
    kin: tuple[Path, Any],
) -> None:
    """PAI: a child's toModelOutput does not run (its output goes to the parent, not a model);
    called directly, the same registration's projection does."""
    from kin_pkg.kin import child_v1, parent_v1

    projected: list[int] = []

    async def child(ctx: Any) -> Any:
        return child_v1.ChildOutput(double=ctx.input.n * 2)

    def project(output: Any) -> str:
        projected.append(output.double)
        raise ValueError("a projection for models only")

    async def parent(ctx: Any) -> Any:
        out = await ctx.tools.call(child_v1.SPEC, child_v1.ChildInput(n=ctx.input.n))
        return parent_v1.ParentOutput(sum=out.double)

    async def scenario() -> tuple[Any, Any]:
        runtime = Runtime()
        runtime.register(child_v1.SPEC, child, project=project)
        runtime.register(parent_v1.SPEC, parent)
        through_parent = await runtime.call("parent", {"n": 4})
        direct = await runtime.call("child", {"n": 1})
        return through_parent, direct

    through_parent, direct = asyncio.run(scenario())
    assert isinstance(through_parent, ToolSuccess) and through_parent.output.sum == 8
    assert isinstance(direct, ToolError)  # the raising projection ran for the direct call only
    assert projected == [2]


def test_children_a_parent_started_and_did_not_await_are_cancelled_when_it_ends(
    kin: tuple[Path, Any],
) -> None:
    from kin_pkg.kin import child_v1, parent_v1

    child_ended: list[str] = []
    started = asyncio.Event

    async def child(ctx: Any) -> Any:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            child_ended.append("cancelled")
            raise
        child_ended.append("finished")
        return child_v1.ChildOutput(double=0)

    async def scenario() -> tuple[Any, list[Any], Any]:
        began = started()
        tasks: list[asyncio.Task[Any]] = []

        async def parent(ctx: Any) -> Any:
            call = ctx.tools.call(child_v1.SPEC, child_v1.ChildInput(n=1))
            tasks.append(asyncio.create_task(call))  # started, never awaited
            await asyncio.sleep(0.05)  # it runs meanwhile
            late = ctx.tools.call(child_v1.SPEC, child_v1.ChildInput(n=2))
            tasks.append(asyncio.create_task(late))  # not even begun when the parent returns
            began.set()
            return parent_v1.ParentOutput(sum=1)

        runtime = Runtime()
        runtime.register(child_v1.SPEC, child)
        runtime.register(parent_v1.SPEC, parent)
        result = await runtime.call("parent", {"n": 1})
        await asyncio.wait(tasks, timeout=10)
        outcomes = []
        for task in tasks:
            error = task.exception() if not task.cancelled() else asyncio.CancelledError()
            outcomes.append(error)
        return result, outcomes, began.is_set()

    result, outcomes, began = asyncio.run(scenario())
    assert isinstance(result, ToolSuccess) and began
    assert child_ended == ["cancelled"]  # the running child: cancelled, not left to finish
    running, late = outcomes
    assert isinstance(running, asyncio.CancelledError), running  # its task, cancelled
    assert isinstance(late, ChildToolError) and late.code == "CANCELLED", late
