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
