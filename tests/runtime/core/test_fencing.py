"""Lease fencing: ``ctx.lease`` for a tool whose spec asks for it, on every store.

A worker that stalls past its lease (here: its heartbeat cannot reach the store) has its call
taken over by recovery on another runtime. The fencing token of the new entry is larger; the
stalled worker's ``assert_held()`` fails, its call ends as LEASE_LOST, and an external system that
keeps the largest token it has seen never takes the stale write.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import _import_package, add_spec, run_cli, run_mypy, spec
from records import ev, submitted
from stalled import Stalled, taken_over

from blade_codegen.build import build
from blade_codegen.problems import SpecError
from blade_codegen.resolve import resolve_specs
from blade_runtime import Runtime
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolSuccess
from blade_runtime.core.store import Claim, Store, clock
from blade_runtime.stores.sqlite import SQLiteStore
from blade_runtime.stores.urls import open_store

OUTPUT = {"type": "object", "properties": {"token": {"type": "integer"}}, "required": ["token"]}
INPUT = {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]}
LEDGER = {
    "name": "post_entry",
    "kind": "write",
    "sideEffect": "idempotent",
    "lease": True,
    "inputSchema": INPUT,
    "outputSchema": OUTPUT,
    "suspend": {
        "confirm": {
            "suspendSchema": {"type": "object"},
            "resumeSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
        }
    },
}
CHARGE = {**LEDGER, "name": "charge_card", "sideEffect": "non_idempotent", "suspend": None}
PLAIN = {**LEDGER, "name": "plain_entry", "lease": None, "suspend": None}
BATCH = {**PLAIN, "name": "charge_batch", "children": ["fence.charge-card.v1"]}


def _specs(root: Path) -> Path:
    specs = root / "specs"
    add_spec(specs, spec("fence.post-entry.v1", **LEDGER))
    add_spec(specs, spec("fence.charge-card.v1", **CHARGE))
    add_spec(specs, spec("fence.plain-entry.v1", **PLAIN))
    add_spec(specs, spec("fence.charge-batch.v1", **BATCH))
    return specs


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    root = tmp_path_factory.mktemp("fence")
    build(_specs(root), root / "out", "fence_pkg")
    _import_package(root / "out", "fence_pkg")
    return (
        root / "out",
        importlib.import_module("fence_pkg.fence.post_entry_v1"),
        importlib.import_module("fence_pkg.fence.charge_card_v1"),
    )


class Ledger:
    """An external system that refuses a write with a fencing token below one it has seen."""

    def __init__(self) -> None:
        self.highest = 0
        self.writes: list[tuple[str, int]] = []

    def write(self, who: str, token: int) -> None:
        if token < self.highest:
            raise RuntimeError(f"stale fencing token {token} < {self.highest}")
        self.highest = token
        self.writes.append((who, token))


def _implementation(module: Any, who: str, ledger: Ledger, gate: asyncio.Event | None) -> Any:
    entered: list[int] = []

    async def post(ctx: Any) -> Any:
        entered.append(ctx.lease.fencing_token)
        if gate is not None:
            await gate.wait()  # the stall: another worker takes the call over meanwhile
        await ctx.lease.assert_held()
        ledger.write(who, ctx.lease.fencing_token)
        return _output(module, ctx.lease.fencing_token)

    post.entered = entered  # type: ignore[attr-defined]
    return post


def _output(module: Any, token: int) -> Any:
    return module.SPEC.output_type(token=token)


@pytest.mark.parametrize("tool", ["post_entry", "charge_card"])
def test_a_worker_stalled_past_its_lease_fails_assert_held_and_never_writes(
    built: tuple[Path, Any, Any], store: Store, tool: str
) -> None:
    _, ledger_module, charge_module = built
    module = ledger_module if tool == "post_entry" else charge_module
    ledger = Ledger()
    reaching = Stalled(store)

    async def scenario() -> tuple[Any, list[Any], list[int], list[int]]:
        gate = asyncio.Event()
        stalled = Runtime(store=reaching, lease_s=0.6)  # type: ignore[arg-type]
        survivor = Runtime(store=store, lease_s=0.6)
        first = _implementation(module, "stalled", ledger, gate)
        second = _implementation(module, "survivor", ledger, None)
        stalled.register(module.SPEC, first)
        survivor.register(module.SPEC, second)
        call = asyncio.create_task(stalled.call(tool, {"amount": 5}, call_id="c1"))
        while not first.entered:
            await asyncio.sleep(0.01)
        taken = await taken_over(survivor, "c1")
        gate.set()
        late = await call
        reaching.stalled = False
        await stalled.close()
        await survivor.close()
        return late, taken, first.entered, second.entered

    late, taken, stalled_tokens, survivor_tokens = asyncio.run(scenario())
    assert isinstance(late, ToolError) and late.code == ErrorCode.LEASE_LOST, late
    assert "another worker" in late.message.lower()
    assert stalled_tokens == [1]
    [recovered] = taken
    record = store.call("c1")
    assert record is not None and record.state == "settled"
    if tool == "post_entry":  # idempotent: replayed by the survivor, under a larger token
        assert isinstance(recovered, ToolSuccess) and recovered.output.token == 2
        assert survivor_tokens == [2]
        assert ledger.writes == [("survivor", 2)]
        assert record.result["status"] == "success"  # type: ignore[index,call-overload]
    else:  # non_idempotent: never run again, and the stalled entry never wrote either
        assert isinstance(recovered, ToolError) and recovered.code == ErrorCode.INTERRUPTED
        assert survivor_tokens == [] and ledger.writes == []
    assert record.fence == 2


def test_the_fencing_token_grows_with_a_resume_and_survives_a_restart(
    built: tuple[Path, Any, Any], store: Store, request: pytest.FixtureRequest
) -> None:
    _, module, _ = built
    seen: list[tuple[int, bool]] = []

    async def post(ctx: Any) -> Any:
        seen.append((ctx.lease.fencing_token, await ctx.lease.held()))
        if ctx.entry.__class__.__name__ == "InitialEntry":
            ctx.suspend("confirm", {})
        await ctx.lease.assert_held()
        return _output(module, ctx.lease.fencing_token)

    async def scenario() -> Any:
        runtime = Runtime(store=store)
        runtime.register(module.SPEC, post)
        pending = await runtime.call("post_entry", {"amount": 1}, call_id="r1")
        assert isinstance(pending, ToolPending)
        done = await runtime.submit(pending.action.action_id, {"ok": True})
        await runtime.close()
        return done

    done = asyncio.run(scenario())
    assert isinstance(done, ToolSuccess) and done.output.token == 2
    assert seen == [(1, True), (2, True)]
    if store.durable:  # another process opening the store later reads the same token
        postgres = store.url.startswith("postgres")
        again = open_store(request.getfixturevalue("postgres_url") if postgres else store.url)
        try:
            record = again.call("r1")
            assert record is not None and record.fence == 2
        finally:
            again.close()


def test_held_checks_owner_claim_and_lease_in_the_store(store: Store) -> None:
    from records import a_call, an_action

    call = replace(a_call("h1", owner="w1", lease_s=30.0), fence=1)
    store.begin(call, ev(call, "started"), lease_s=30.0)
    assert store.held(Claim("h1", "w1", 1))
    assert not store.held(Claim("h1", "w2", 1))  # another owner
    assert not store.held(Claim("h1", "w1", 2))  # another claim's token
    assert not store.held(Claim("nope", "w1", 1))
    [claimed] = store.claim("w2", 30.0, dead=["w1"], call_id="h1")
    assert claimed.call.fence == 2 and store.call("h1").fence == 2  # type: ignore[union-attr]
    assert store.held(Claim("h1", "w2", 2)) and not store.held(Claim("h1", "w1", 1))
    action = an_action(claimed.call)
    suspended = replace(claimed.call, state="suspended")
    store.suspend(suspended, action, ev(suspended, "suspended"), claim=claimed.call.claim)
    assert not store.held(Claim("h1", "w2", 2))  # not running: nothing holds it
    won = store.resolve(
        action.action_id,
        submitted(call_state="running", call_owner="w3", lease_s=30.0),
        ev(suspended, "resumed"),
    )
    assert won.call_fence == 3 and store.held(Claim("h1", "w3", 3))
    expiring = replace(a_call("h2", owner="w1"), fence=1)
    store.begin(expiring, ev(expiring, "started"), lease_s=0.0)
    while store.call("h2").lease_until >= clock():  # type: ignore[union-attr]
        pass
    assert not store.held(Claim("h2", "w1", 1))  # its lease expired: a claim may take it any moment


def test_the_spec_field_reaches_spec_manifest_and_typed_ctx(
    built: tuple[Path, Any, Any], tmp_path: Path
) -> None:
    out, module, _ = built
    assert module.SPEC.lease is True
    plain = importlib.import_module("fence_pkg.fence.plain_entry_v1")
    assert plain.SPEC.lease is False
    manifest = json.loads((out / "fence_pkg" / "manifest.json").read_text("utf-8"))
    leases = {tool["name"]: tool.get("lease") for tool in manifest["tools"]}
    assert leases == {
        "post_entry": True,
        "charge_card": True,
        "plain_entry": None,
        "charge_batch": None,
    }
    good = tmp_path / "good.py"
    good.write_text(
        "from fence_pkg.fence import post_entry_v1 as m\n\n\n"
        "async def run(ctx: m.PostEntryExecution) -> int:\n"
        "    await ctx.lease.assert_held()\n"
        "    return ctx.lease.fencing_token\n"
    )
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from fence_pkg.fence import plain_entry_v1 as m\n\n\n"
        "async def run(ctx: m.PlainEntryExecution) -> int:\n"
        "    return ctx.lease.fencing_token\n"
    )
    checked = run_mypy(good, cwd=out)
    assert checked.returncode == 0, checked.stdout
    refused = run_mypy(bad, cwd=out)
    assert refused.returncode == 1 and '"lease"' in refused.stdout, refused.stdout


def test_a_client_tool_cannot_ask_for_a_lease(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    add_spec(
        specs,
        spec("fence.ask-user.v1", execution="client", outputSchema=OUTPUT, lease=True),
    )
    with pytest.raises(SpecError) as raised:
        resolve_specs(specs)
    text = str(raised.value)
    assert "/lease" in text and "client tool cannot have lease" in text


def test_turning_lease_fencing_on_is_not_a_breaking_change(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    path = add_spec(specs, spec("fence.post-entry.v1", **{**PLAIN, "name": "post_entry"}))
    locked = run_cli("lock", str(specs))
    assert locked.returncode == 0, locked.stderr
    data = json.loads(path.read_text("utf-8"))
    data["lease"] = True
    path.write_text(json.dumps(data), "utf-8")
    checked = run_cli("check", str(specs))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_fenced_child_tool_runs_under_its_parent_entry_s_claim(
    built: tuple[Path, Any, Any], tmp_path: Path
) -> None:
    _, _, charge = built
    batch = importlib.import_module("fence_pkg.fence.charge_batch_v1")
    store = SQLiteStore(tmp_path / "children.db")  # records the parent's start: it holds a claim
    seen: list[tuple[str, int, bool]] = []

    async def charge_card(ctx: Any) -> Any:
        seen.append((ctx.call.call_id, ctx.lease.fencing_token, await ctx.lease.held()))
        return _output(charge, ctx.lease.fencing_token)

    async def charge_batch(ctx: Any) -> Any:
        assert ctx.lease is None  # not fenced itself
        done = await ctx.tools.call(charge.SPEC, charge.SPEC.input_type(amount=1))
        return _output(batch, done.token)

    async def scenario() -> Any:
        runtime = Runtime(store=store)
        runtime.register(charge.SPEC, charge_card)
        runtime.register(batch.SPEC, charge_batch)
        result = await runtime.call("charge_batch", {"amount": 2}, call_id="b1")
        await runtime.close()
        return result

    try:
        result = asyncio.run(scenario())
    finally:
        store.close()
    assert isinstance(result, ToolSuccess) and result.output.token == 1
    assert seen == [("b1/charge_card/1", 1, True)]  # the parent's claim, held
