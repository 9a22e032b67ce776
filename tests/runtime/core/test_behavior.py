"""Narrowed behaviour: a registration's ``behavior`` callback narrows one call's kind and side
effect from its validated input; the policy sees it, the start stores it, recovery follows it."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import _import_package, add_spec, spec
from stalled import Stalled, taken_over

from blade_codegen.build import build
from blade_runtime import Behavior, Runtime
from blade_runtime.core.permissions import Ask, PermissionRequest
from blade_runtime.core.registry import RegistrationError
from blade_runtime.core.results import ErrorCode, ToolError, ToolSuccess
from blade_runtime.core.store import Store
from blade_runtime.stores.sqlite import SQLiteStore
from blade_runtime.stores.urls import open_store

PURGE = {
    "name": "purge_files",
    "kind": "write",
    "sideEffect": "non_idempotent",
    "inputSchema": {
        "type": "object",
        "properties": {"folder": {"type": "string"}, "dry_run": {"type": "boolean"}},
        "required": ["folder"],
    },
    "outputSchema": {"type": "object", "properties": {"removed": {"type": "integer"}}},
}


@pytest.fixture(scope="module")
def purge(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("behavior")
    add_spec(root / "specs", spec("files.purge-files.v1", **PURGE))
    build(root / "specs", root / "out", "behavior_pkg")
    _import_package(root / "out", "behavior_pkg")
    return importlib.import_module("behavior_pkg.files.purge_files_v1")


def by_dry_run(arguments: Any) -> Behavior:
    """A dry run only reads: read_only and pure; a real run stays as the spec declares."""
    return Behavior("read_only", "pure") if arguments.dry_run is True else Behavior()


def test_the_policy_sees_the_narrowed_kind_and_side_effect(purge: Any) -> None:
    seen: list[tuple[Any, str, str | None, str]] = []

    def policy(request: PermissionRequest) -> str | None:
        seen.append((request.input.get("dry_run"), request.side_effect, request.kind, request.name))
        return None if request.kind == "read_only" else "Only dry runs here."

    async def run(ctx: Any) -> Any:
        return purge.SPEC.output_type(removed=0 if ctx.input.dry_run is True else 3)

    runtime = Runtime(permission=policy)
    runtime.register(purge.SPEC, run, behavior=by_dry_run)

    async def scenario() -> tuple[Any, Any]:
        dry = await runtime.call("purge_files", {"folder": "/tmp/x", "dry_run": True})
        real = await runtime.call("purge_files", {"folder": "/tmp/x"})
        return dry, real

    dry, real = asyncio.run(scenario())
    assert isinstance(dry, ToolSuccess) and dry.output.removed == 0
    assert isinstance(real, ToolError) and real.code == ErrorCode.PERMISSION_DENIED
    assert seen == [
        (True, "pure", "read_only", "purge_files"),
        (None, "non_idempotent", "write", "purge_files"),
    ]


@pytest.mark.parametrize(
    ("answer", "names"),
    [
        (Behavior(side_effect="idempotent"), None),
        (Behavior(kind="execute"), "kind 'execute', wider than its spec files.purge-files.v1"),
        ("read_only", "returned 'read_only'; return a Behavior"),
    ],
)
def test_a_behaviour_wider_than_the_spec_is_refused_before_anything_runs(
    purge: Any, caplog: pytest.LogCaptureFixture, answer: Any, names: str | None
) -> None:
    ran: list[str] = []

    async def run(ctx: Any) -> Any:
        ran.append("ran")
        return purge.SPEC.output_type(removed=1)

    runtime = Runtime()
    runtime.register(purge.SPEC, run, behavior=lambda arguments: answer)
    with caplog.at_level(logging.ERROR, "blade_runtime"):
        result = asyncio.run(runtime.call("purge_files", {"folder": "/x"}))
    if names is None:  # narrower than non_idempotent: fine
        assert isinstance(result, ToolSuccess) and ran == ["ran"]
        return
    assert isinstance(result, ToolError) and result.code == ErrorCode.POLICY_FAILED
    assert ran == [] and names in caplog.text


def test_a_behaviour_callback_must_be_callable(purge: Any) -> None:
    async def run(ctx: Any) -> Any:
        return purge.SPEC.output_type(removed=1)

    with pytest.raises(RegistrationError, match="behavior= is not callable"):
        Runtime().register(purge.SPEC, run, behavior="pure")  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", "postgres"])
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A store that records every call's start (MemoryStore records only those that wait)."""
    if request.param == "postgres":
        made = open_store(request.getfixturevalue("postgres_url"))
    else:
        made = SQLiteStore(tmp_path / "b.db")
    yield made
    made.close()


def test_a_waiting_call_stores_its_narrowed_behaviour(purge: Any, store: Store) -> None:
    async def run(ctx: Any) -> Any:
        return purge.SPEC.output_type(removed=0)

    runtime = Runtime(store=store, permission=lambda request: Ask())
    runtime.register(purge.SPEC, run, behavior=by_dry_run)

    async def scenario() -> None:
        await runtime.call("purge_files", {"folder": "/x", "dry_run": True}, call_id="w1")
        await runtime.call("purge_files", {"folder": "/x"}, call_id="w2")
        await runtime.close()

    asyncio.run(scenario())
    narrowed, declared = store.call("w1"), store.call("w2")
    assert narrowed is not None and declared is not None
    assert (narrowed.state, narrowed.kind, narrowed.side_effect) == (
        "suspended",
        "read_only",
        "pure",
    )
    assert (declared.kind, declared.side_effect) == ("write", "non_idempotent")
    [request] = [a for a in store.actions() if a.call_id == "w1"]
    assert request.payload["kind"] == "read_only"  # type: ignore[index,call-overload]
    assert request.payload["side_effect"] == "pure"  # type: ignore[index,call-overload]


@pytest.mark.parametrize("dry_run", [True, False])
def test_recovery_follows_the_narrowed_side_effect(
    purge: Any, durable: Store, dry_run: bool
) -> None:
    store = durable
    entries: list[str] = []

    async def scenario() -> tuple[list[Any], Any]:
        gate = asyncio.Event()
        reaching = Stalled(store)
        stalled = Runtime(store=reaching, lease_s=0.6)  # type: ignore[arg-type]
        survivor = Runtime(store=store, lease_s=0.6)

        def implementation(who: str) -> Any:
            async def run(ctx: Any) -> Any:
                entries.append(who)
                if who == "stalled":
                    await gate.wait()
                return purge.SPEC.output_type(removed=0)

            return run

        stalled.register(purge.SPEC, implementation("stalled"), behavior=by_dry_run)
        survivor.register(purge.SPEC, implementation("survivor"), behavior=by_dry_run)
        arguments = {"folder": "/x", "dry_run": dry_run}
        first = asyncio.create_task(stalled.call("purge_files", arguments, call_id="p1"))
        while not entries:
            await asyncio.sleep(0.01)
        record = store.call("p1")
        assert record is not None
        stored = (record.kind, record.side_effect)
        taken = await taken_over(survivor, "p1")
        gate.set()
        await first
        reaching.stalled = False
        await stalled.close()
        await survivor.close()
        return taken, stored

    [recovered], stored = asyncio.run(scenario())
    if dry_run:  # narrowed to pure: run again by the survivor
        assert stored == ("read_only", "pure")
        assert isinstance(recovered, ToolSuccess) and entries == ["stalled", "survivor"]
    else:  # the spec's non_idempotent: never run again, for reconciliation
        assert stored == ("write", "non_idempotent")
        assert isinstance(recovered, ToolError) and recovered.code == ErrorCode.INTERRUPTED
        assert entries == ["stalled"]


@pytest.mark.parametrize("answered_by", ["runtime", "operators_cli"])
def test_an_input_a_person_edits_is_narrowed_again_before_it_runs(
    purge: Any, tmp_path: Path, answered_by: str
) -> None:
    """Asked as a dry run (narrowed to pure), approved with the dry run taken out: what runs is
    the spec's non_idempotent purge, and the store says so, so that recovery never runs it
    again. Outside a runtime nothing can narrow the edited input: it is stored as the widest."""
    from blade_runtime.serving import cli

    path = tmp_path / "edited.db"
    runtime = Runtime(store=SQLiteStore(path), permission=lambda request: Ask("purge?"))
    stored: list[Any] = []

    async def run(ctx: Any) -> Any:
        record = runtime.store.call(ctx.call.call_id)
        stored.append((record.side_effect, record.kind) if record else None)
        return purge.SPEC.output_type(removed=3)

    runtime.register(purge.SPEC, run, behavior=by_dry_run)
    edited = {"decision": "approve", "input": {"folder": "/data"}}

    async def scenario() -> Any:
        asked = await runtime.call("purge_files", {"folder": "/data", "dry_run": True})
        assert asked.action.input.side_effect == "pure"  # type: ignore[union-attr]
        if answered_by == "runtime":
            return await runtime.submit(asked.action.action_id, edited)  # type: ignore[union-attr]
        argv = ["pending", "submit", asked.action.action_id, json.dumps(edited)]  # type: ignore[union-attr]
        assert cli.main([*argv, "--store", str(path)]) == 0
        (done,) = await runtime.recover()
        return done

    done = asyncio.run(scenario())
    assert isinstance(done, ToolSuccess), done
    if answered_by == "runtime":
        assert stored == [("non_idempotent", "write")]  # the real purge, as its spec declares
    else:
        assert stored[0][0] == "non_idempotent"


def test_observers_and_the_policy_after_a_resume_see_the_narrowed_behaviour(purge: Any) -> None:
    """Issue 40: what the call's start stored is what everyone reads: ``execution_started``
    observers, and the policy judging a second permission step after the call resumed."""
    started: list[tuple[str, str | None]] = []
    judged: list[tuple[str | None, str, str | None]] = []

    class Watch:
        async def execution_started(self, event: Any) -> None:
            started.append((event.side_effect, event.kind))

    def policy(request: PermissionRequest) -> Any:
        judged.append((request.prompt, request.side_effect, request.kind))
        return Ask() if request.prompt == "first?" else None

    async def run(ctx: Any) -> Any:
        await ctx.request_permission("first?")
        await ctx.request_permission("second?")  # judged after the resume
        return purge.SPEC.output_type(removed=0)

    runtime = Runtime(permission=policy)
    runtime.observe(Watch())
    runtime.register(purge.SPEC, run, behavior=by_dry_run)

    async def scenario() -> Any:
        asked = await runtime.call("purge_files", {"folder": "/x", "dry_run": True})
        return await runtime.submit(asked.action.action_id, {"decision": "approve"})

    done = asyncio.run(scenario())
    assert isinstance(done, ToolSuccess), done
    assert started == [("pure", "read_only"), ("pure", "read_only")]
    assert judged == [
        (None, "pure", "read_only"),  # the call as a whole, before it runs
        ("first?", "pure", "read_only"),
        ("second?", "pure", "read_only"),  # after the resume: the stored behaviour
    ]


def test_an_input_edited_on_the_cli_keeps_the_spec_s_behaviour_and_is_replayed(
    tmp_path: Path,
) -> None:
    """Issue 40: an idempotent tool, asked as a dry run (narrowed to pure) and approved on the
    operators' CLI with an edited input: nothing there narrows the edited input, so it keeps
    its spec's idempotent (the widest for any input), not non_idempotent; the worker that runs
    it stalls past its lease, and another worker runs it again."""
    from blade_runtime.serving import cli

    root = tmp_path / "idem"
    idempotent = {**PURGE, "name": "sync_files", "sideEffect": "idempotent"}
    add_spec(root / "specs", spec("files.sync-files.v1", **idempotent))
    build(root / "specs", root / "out", "behavior_idem_pkg")
    _import_package(root / "out", "behavior_idem_pkg")
    sync = importlib.import_module("behavior_idem_pkg.files.sync_files_v1")
    path = tmp_path / "edited.db"
    store = SQLiteStore(path)
    entries: list[str] = []

    async def scenario() -> tuple[Any, Any]:
        gate = asyncio.Event()
        reaching = Stalled(store)
        asker = Runtime(store=store, permission=lambda request: Ask("sync?"))
        stalled = Runtime(store=reaching, lease_s=0.6)  # type: ignore[arg-type]
        survivor = Runtime(store=store, lease_s=0.6)

        def implementation(who: str) -> Any:
            async def run(ctx: Any) -> Any:
                entries.append(who)
                if who == "stalled":
                    await gate.wait()
                return sync.SPEC.output_type(removed=1)

            return run

        for runtime, who in ((asker, "asker"), (stalled, "stalled"), (survivor, "survivor")):
            runtime.register(sync.SPEC, implementation(who), behavior=by_dry_run)
        asked = await asker.call("sync_files", {"folder": "/d", "dry_run": True}, call_id="s1")
        edited = {"decision": "approve", "input": {"folder": "/d"}}
        argv = ["pending", "submit", asked.action.action_id, json.dumps(edited)]  # type: ignore[union-attr]
        assert cli.main([*argv, "--store", str(path)]) == 0
        record = store.call("s1")
        running = asyncio.create_task(stalled.recover())
        while not entries:
            await asyncio.sleep(0.01)
        taken = await taken_over(survivor, "s1")
        gate.set()
        await running
        reaching.stalled = False
        for runtime in (asker, stalled, survivor):
            await runtime.close()
        return record, taken

    record, taken = asyncio.run(scenario())
    store.close()
    assert record is not None and (record.side_effect, record.kind) == ("idempotent", "write")
    assert [r.status for r in taken if r.call.call_id == "s1"] == ["success"]
    assert entries == ["stalled", "survivor"]  # run again: never INTERRUPTED
