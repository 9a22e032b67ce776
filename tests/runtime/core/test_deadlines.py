"""Deadlines on waiting: a suspend point's ``expiresAfterMs`` and a client tool's ``timeoutMs``.

An expired action settles once, as TIMEOUT, by whichever runtime sees it first; a later submit
gets ACTION_ALREADY_RESOLVED naming the expiry. The spec side: meta-schema, generated code,
manifest and compatibility (a deadline added or shortened breaks waiting clients).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import _import_package, add_spec, spec

from blade_codegen.build import build
from blade_codegen.check import Baseline, check, released_from
from blade_codegen.problems import SpecError
from blade_codegen.resolve import resolve_specs
from blade_runtime import Runtime, ToolError
from blade_runtime.core.results import ErrorCode, ToolPending
from blade_runtime.core.store import Store
from blade_runtime.stores.sqlite import SQLiteStore

FLAT = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def _specs(root: Path, expires_ms: int | None = 150) -> Path:
    specs = root / "specs"
    point: dict[str, Any] = {"suspendSchema": FLAT, "resumeSchema": FLAT}
    if expires_ms is not None:
        point["expiresAfterMs"] = expires_ms
    add_spec(specs, spec("dl.approve.v1", name="approve", suspend={"gate": point}))
    add_spec(
        specs,
        spec(
            "dl.ask-user.v1",
            name="ask_user",
            execution="client",
            timeoutMs=150,
            outputSchema=FLAT,
        ),
    )
    return specs


@pytest.fixture(scope="module")
def deadline_package(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("deadlines")
    build(_specs(root), root / "out", "dl_pkg")
    _import_package(root / "out", "dl_pkg")
    return SimpleNamespace(
        approve_v1=importlib.import_module("dl_pkg.dl.approve_v1"),
        ask_user_v1=importlib.import_module("dl_pkg.dl.ask_user_v1"),
        manifest=root / "out" / "dl_pkg" / "manifest.json",
    )


def _runtime(package: Any, store: Store, entries: list[str]) -> Runtime:
    approve = package.approve_v1
    ask = package.ask_user_v1

    async def implementation(ctx: Any) -> None:
        entries.append(type(ctx.entry).__name__)
        if type(ctx.entry).__name__ == "InitialEntry":
            ctx.suspend("gate", {"ok": True})

    runtime = Runtime(store=store)
    runtime.register(approve.SPEC, implementation)
    runtime.register_client(ask.SPEC)
    return runtime


def test_the_spec_carries_the_deadline_into_code_and_manifest(
    deadline_package: Any, tmp_path: Path
) -> None:
    point = deadline_package.approve_v1.SPEC.suspend["gate"]
    assert point.expires_after_ms == 150
    manifest = json.loads(deadline_package.manifest.read_text("utf-8"))
    tool = next(t for t in manifest["tools"] if t["id"] == "dl.approve.v1")
    assert tool["suspend"]["gate"]["expiresAfterMs"] == 150
    with pytest.raises(SpecError) as refused:
        resolve_specs(_specs(tmp_path, expires_ms=0))
    assert "expiresAfterMs" in str(refused.value)


def test_adding_or_shortening_a_deadline_breaks_lengthening_does_not(tmp_path: Path) -> None:
    def released(ms: int | None) -> Baseline:
        (found,) = [
            s
            for s in resolve_specs(_specs(tmp_path / str(ms), ms)).specs
            if s.id == "dl.approve.v1"
        ]
        return Baseline({found.id: released_from(found)})

    def rules(old: int | None, new: int | None) -> list[str]:
        current = resolve_specs(_specs(tmp_path / f"new{new}", new)).specs
        return [f.rule for f in check(list(current), released(old)).breaking]

    assert rules(None, 150) == ["DEADLINE_SHORTENED"]
    assert rules(500, 150) == ["DEADLINE_SHORTENED"]
    assert rules(150, 500) == []
    assert rules(150, None) == []


def test_an_expired_suspension_settles_once_as_timeout_and_refuses_a_late_submit(
    deadline_package: Any, store: Store
) -> None:
    entries: list[str] = []
    runtime = _runtime(deadline_package, store, entries)

    async def scenario() -> None:
        pending = await runtime.call("approve", {"q": "x"}, call_id="c1")
        assert isinstance(pending, ToolPending)
        action_id = pending.action.action_id
        await asyncio.sleep(0.2)
        await runtime.recover()  # the sweep expires it
        late = await runtime.submit(action_id, {"ok": True})
        assert isinstance(late, ToolError) and late.code == ErrorCode.ACTION_ALREADY_RESOLVED
        assert "expired" in late.message and "TIMEOUT" in late.message
        action = store.action(action_id)
        assert action is not None and action.state == "expired"

    asyncio.run(scenario())
    assert entries == ["InitialEntry"]  # never resumed
    if store.durable:
        call = store.call("c1")
        assert call is not None and call.state == "settled"
        assert isinstance(call.result, dict) and call.result["code"] == "TIMEOUT"


def test_a_submit_after_the_deadline_expires_the_action_itself(
    deadline_package: Any, store: Store
) -> None:
    entries: list[str] = []
    runtime = _runtime(deadline_package, store, entries)

    async def scenario() -> ToolError:
        pending = await runtime.call("ask_user", {"q": "x"}, call_id="c2")
        assert isinstance(pending, ToolPending)
        await asyncio.sleep(0.2)  # no sweep runs: the submit finds the deadline passed
        late = await runtime.submit(pending.action.action_id, {"ok": True})
        assert isinstance(late, ToolError)
        return late

    late = asyncio.run(scenario())
    assert late.code == ErrorCode.ACTION_ALREADY_RESOLVED and "expired" in late.message
    assert runtime.pending() == []


def test_racing_sweeps_settle_an_expired_action_once(deadline_package: Any, tmp_path: Path) -> None:
    path = tmp_path / "race.db"
    entries: list[str] = []
    first = _runtime(deadline_package, SQLiteStore(path), entries)

    async def suspend() -> str:
        pending = await first.call("approve", {"q": "x"}, call_id="c3")
        assert isinstance(pending, ToolPending)
        return pending.action.action_id

    action_id = asyncio.run(suspend())
    time.sleep(0.2)
    outcomes: list[str] = []
    start = threading.Barrier(4)

    def sweep() -> None:
        runtime = _runtime(deadline_package, SQLiteStore(path), entries)
        action = runtime.store.action(action_id)
        assert action is not None
        start.wait()
        outcomes.append(asyncio.run(runtime.expire(action)))

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    events = SQLiteStore(path).events("default")
    results = [e for e in events if e.kind == "result"]
    assert len(results) == 1 and isinstance(results[0].payload, dict)
    assert results[0].payload["code"] == "TIMEOUT"
    assert len(outcomes) == 4 and all("expired" in o for o in outcomes)
