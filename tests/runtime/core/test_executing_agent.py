"""Seed 002's executing agent and an action's origin: "ctx.agentId names the agent executing
the call ... a tool shared by several agents can only learn this here", and a pending action's
origin carries the thread (``threadId``) of the call that created it.

The agent and the thread travel in the call's ``CallContext`` (stored with the call as JSON)
and on its actions (columns of their own: a listing shows an action without reading its call).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import RUNTIME_JSON

from blade_runtime import Allow, CallContext, Principal
from blade_runtime.core.results import ToolPending, ToolSuccess
from blade_runtime.runtime import Runtime
from blade_runtime.stores.sqlite import SQLiteStore

TESTS = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(TESTS))
import agent_tools  # noqa: E402

ANN = Principal("ann", "acme")
BOB = Principal("bob", "globex")
SEND = {"to": "bob", "amount": 5}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agent_tools.built_package(tmp_path_factory)


def placed(principal: Principal | None, agent: str | None, thread: str | None) -> CallContext:
    return CallContext(principal, thread_id=thread, agent_id=agent)


def test_a_tool_shared_by_several_agents_learns_here_which_one_runs_it(built: Path) -> None:
    """One registration, called by two agents: each call's ctx.agent_id is its own agent. The
    agent is where the call runs, not who asked: a spec that does not declare "caller" sees it
    (and the thread) while the principal and the client's data stay out of its ctx."""
    from blade_agent_specs.crm import find_v1

    seen: list[tuple[str | None, CallContext | None]] = []

    async def find(ctx: Any) -> Any:
        seen.append((ctx.agent_id, ctx.call.context))
        return find_v1.FindOutput(id=ctx.input.customer_id, name="c")

    async def scenario() -> None:
        runtime = Runtime()
        runtime.register(find_v1.SPEC, find)
        for agent in ("billing", "support", None):
            context = CallContext(ANN, client_data={"cart": 3}, thread_id="t-1", agent_id=agent)
            assert isinstance(
                await runtime.call("find", {"customer_id": 1}, context=context), ToolSuccess
            )
        assert isinstance(await runtime.call("find", {"customer_id": 1}), ToolSuccess)

    asyncio.run(scenario())
    assert [agent for agent, _ in seen] == ["billing", "support", None, None]
    assert seen[0][1] == CallContext(thread_id="t-1", agent_id="billing")  # no principal
    assert seen[3][1] is None


def test_policies_and_observers_see_the_executing_agent(built: Path) -> None:
    asked: list[tuple[str | None, str | None]] = []
    observed: list[tuple[str, str | None, str | None]] = []

    def policy(request: Any) -> Allow:
        asked.append((request.call.agent_id, request.call.thread_id))
        return Allow()

    class Watcher:
        async def scheduled(self, event: Any) -> None:
            observed.append((event.boundary, event.call.agent_id, event.call.thread_id))

        async def settled(self, event: Any) -> None:
            observed.append((event.boundary, event.call.agent_id, event.call.thread_id))

    async def scenario() -> None:
        runtime = agent_tools.register(Runtime(permission=policy))
        runtime.observe(Watcher())
        await runtime.call("find", {"customer_id": 2}, context=placed(ANN, "billing", "t-2"))

    asyncio.run(scenario())
    assert asked == [("billing", "t-2")]
    assert observed == [("scheduled", "billing", "t-2"), ("settled", "billing", "t-2")]


def test_a_pending_actions_origin_names_its_thread_and_agent_in_every_store(
    built: Path, store: Any
) -> None:
    """Stored with the action: the runtime's listing, the client's and a reopened store's
    (where the store is durable) show the thread and the agent of the call that asks; a tenant
    never sees another's."""
    from blade_runtime.client import RuntimeTransport

    async def scenario() -> None:
        runtime = agent_tools.make_runtime(store)
        mine = await runtime.call("transfer", SEND, context=placed(ANN, "teller", "thread-1"))
        theirs = await runtime.call("transfer", SEND, context=placed(BOB, "clerk", "thread-1"))
        assert isinstance(mine, ToolPending) and isinstance(theirs, ToolPending)
        assert (mine.action.origin.agent_id, mine.action.origin.thread_id) == (
            "teller",
            "thread-1",
        )
        (listed,) = runtime.pending(principal=ANN)
        assert listed.action_id == mine.action.action_id
        assert (listed.origin.agent_id, listed.origin.thread_id) == ("teller", "thread-1")
        record = await runtime.records.action(mine.action.action_id, principal=ANN)
        assert record is not None and (record.agent_id, record.thread_id) == (
            "teller",
            "thread-1",
        )
        assert await runtime.records.action(mine.action.action_id, principal=BOB) is None
        (shown,) = RuntimeTransport(runtime, BOB).pending(None)  # the typed client's data
        assert (shown["agent_id"], shown["thread_id"]) == ("clerk", "thread-1")
        assert shown["action_id"] == theirs.action.action_id

    asyncio.run(scenario())


def test_a_call_without_agent_or_thread_has_an_origin_that_says_so(built: Path, store: Any) -> None:
    async def scenario() -> None:
        runtime = agent_tools.make_runtime(store)
        result = await runtime.call("transfer", SEND, context=CallContext(ANN))
        assert isinstance(result, ToolPending)
        (listed,) = runtime.pending(principal=ANN)
        assert (listed.origin.agent_id, listed.origin.thread_id) == (None, None)

    asyncio.run(scenario())


def test_the_origin_outlives_the_process_that_made_it(built: Path, tmp_path: Path) -> None:
    path = tmp_path / "store.db"

    async def ask() -> str:
        runtime = agent_tools.make_runtime(SQLiteStore(path))
        result = await runtime.call("transfer", SEND, context=placed(ANN, "teller", "th-9"))
        assert isinstance(result, ToolPending)
        await runtime.close()
        runtime.store.close()
        return result.action.action_id

    action_id = asyncio.run(ask())
    store = SQLiteStore(path)
    try:
        (listed,) = Runtime(store=store).pending(principal=ANN)
        assert listed.action_id == action_id
        assert (listed.origin.agent_id, listed.origin.thread_id) == ("teller", "th-9")
    finally:
        store.close()


def test_a_sqlite_store_of_the_schema_before_names_its_waiting_actions_origin(
    built: Path, tmp_path: Path
) -> None:
    """Migration: the actions recorded before their origin had columns get them from their
    call's stored context."""
    path = tmp_path / "old.db"

    async def ask() -> None:
        runtime = agent_tools.make_runtime(SQLiteStore(path))
        await runtime.call("transfer", SEND, context=placed(ANN, "teller", "th-1"))
        await runtime.call("transfer", SEND, context=placed(ANN, None, None))
        await runtime.close()
        runtime.store.close()

    asyncio.run(ask())
    with sqlite3.connect(path) as db:  # the schema before: no origin columns
        db.execute("ALTER TABLE blade_actions DROP COLUMN thread_id")
        db.execute("ALTER TABLE blade_actions DROP COLUMN agent_id")
        db.execute("DROP TABLE blade_effects")  # and what later migrations made
        db.execute("PRAGMA user_version = 7")  # the migration before the origin's (8)
    db.close()
    store = SQLiteStore(path)
    try:
        origins = sorted(
            ((a.origin.agent_id or ""), (a.origin.thread_id or ""))
            for a in Runtime(store=store).pending(principal=ANN)
        )
        assert origins == [("", ""), ("teller", "th-1")]
    finally:
        store.close()


def test_a_postgres_store_of_the_schema_before_names_its_waiting_actions_origin(
    built: Path, postgres_url: str
) -> None:
    import psycopg

    from blade_runtime.stores.urls import open_store

    async def ask() -> None:
        runtime = agent_tools.make_runtime(open_store(postgres_url))
        await runtime.call("transfer", SEND, context=placed(ANN, "teller", "th-1"))
        await runtime.call("transfer", SEND, context=placed(ANN, None, None))
        await runtime.close()
        runtime.store.close()

    asyncio.run(ask())
    with psycopg.connect(postgres_url, autocommit=True) as db, db.transaction():
        db.execute("ALTER TABLE blade_actions DROP COLUMN thread_id, DROP COLUMN agent_id")
        db.execute("DROP TABLE blade_effects")  # and what later migrations made
        db.execute("UPDATE blade_schema_version SET version = 6")  # before the origin's (7)
    store = open_store(postgres_url)
    try:
        origins = sorted(
            ((a.origin.agent_id or ""), (a.origin.thread_id or ""))
            for a in Runtime(store=store).pending(principal=ANN)
        )
        assert origins == [("", ""), ("teller", "th-1")]
    finally:
        store.close()


def test_operators_list_the_actions_of_one_agent_or_thread(built: Path, tmp_path: Path) -> None:
    """``blade-runtime pending list --agent/--thread``: the line and the JSON name them."""
    path = tmp_path / "ops.db"

    async def ask() -> None:
        runtime = agent_tools.make_runtime(SQLiteStore(path))
        await runtime.call("transfer", SEND, context=placed(ANN, "teller", "th-1"))
        await runtime.call("transfer", SEND, context=placed(ANN, "clerk", "th-2"))
        await runtime.close()
        runtime.store.close()

    asyncio.run(ask())
    cli = [str(Path(sys.executable).parent / "blade-runtime"), "pending", "list", "--store"]
    shown = subprocess.run(
        [*cli, str(path), "--agent", "teller"], capture_output=True, text=True, check=True
    ).stdout
    (line,) = shown.splitlines()
    assert "agent=teller  thread=th-1" in line
    as_json = subprocess.run(
        [*cli, str(path), "--thread", "th-2", "--json"], capture_output=True, text=True, check=True
    ).stdout
    (action,) = json.loads(as_json)
    assert (action["origin"]["agent_id"], action["origin"]["thread_id"]) == ("clerk", "th-2")
    none = subprocess.run(
        [*cli, str(path), "--agent", "teller", "--thread", "th-2"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert (none.stdout, none.stderr) == ("", "no pending actions\n")


@settings(max_examples=200, deadline=None)
@given(
    thread=st.none() | st.text(max_size=40),
    agent=st.none() | st.text(max_size=40),
    client_data=RUNTIME_JSON,
)
def test_a_context_keeps_its_thread_and_agent_through_json_as_stored(
    thread: str | None, agent: str | None, client_data: Any
) -> None:
    """Whatever text the caller named them with, a context read back from its stored JSON (as
    recovery and every other process read it) names the same thread and agent."""
    context = CallContext(ANN, client_data, thread_id=thread, agent_id=agent)
    stored = json.loads(json.dumps(context.to_json()))
    assert CallContext.from_json(stored) == context
    assert context.placed("framework", "conversation") == CallContext(
        ANN,
        client_data,
        thread_id="conversation" if thread is None else thread,
        agent_id="framework" if agent is None else agent,
    )


def test_a_resumed_call_is_run_by_the_agent_that_began_it_in_any_process(
    built: Path, store: Any
) -> None:
    """The entry after an answer (resumed by another runtime over the same store, as another
    worker would) reads the agent and thread the call began with, from the stored call."""
    from blade_agent_specs.bank import transfer_v1

    from blade_runtime import ResumeEntry

    entries: list[tuple[str, str | None, str | None]] = []

    async def transfer(ctx: Any) -> Any:
        kind = "resume" if isinstance(ctx.entry, ResumeEntry) else "initial"
        entries.append((kind, ctx.agent_id, ctx.call.thread_id))
        if kind == "resume":
            return transfer_v1.TransferOutput(status="sent", by="ann")
        ctx.suspend("confirm", transfer_v1.TransferConfirmSuspend(prompt="send?"))

    async def scenario() -> None:
        first = Runtime(store=store)
        first.register(transfer_v1.SPEC, transfer)
        asked = await first.call("transfer", SEND, context=placed(ANN, "teller", "th-5"))
        assert isinstance(asked, ToolPending)
        other = Runtime(store=store)
        other.register(transfer_v1.SPEC, transfer)
        answer = {"approved": True, "approver": "ann"}
        done = await other.submit(asked.action.action_id, answer, principal=ANN)
        assert isinstance(done, ToolSuccess)  # resumed here, by the other runtime

    asyncio.run(scenario())
    assert entries == [("initial", "teller", "th-5"), ("resume", "teller", "th-5")]
