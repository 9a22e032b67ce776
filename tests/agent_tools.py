"""Tools for the MCP and adapter tests, importable by worker processes (``make_runtime``).

``SPECS`` are built into the package ``blade_agent_specs`` (tests build it into a temporary
folder and put it on the path, also for subprocesses). Every entry of ``transfer`` that moves
money appends a line to the file ``$BLADE_EFFECTS`` (when set): a side effect counted across
processes.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from blade_runtime import ResumeEntry
from blade_runtime.core.caller import Principal
from blade_runtime.core.store import Store
from blade_runtime.runtime import Runtime

T = TypeVar("T")

PACKAGE = "blade_agent_specs"

TRANSFER = {
    "id": "bank.transfer.v1",
    "name": "transfer",
    "description": "Move money to an account; a human confirms first.",
    "kind": "write",
    "sideEffect": "non_idempotent",
    "inputSchema": {
        "type": "object",
        "properties": {
            "to": {"type": "string", "minLength": 1},
            "amount": {"type": "integer", "minimum": 1},
        },
        "required": ["to", "amount"],
        "additionalProperties": False,
    },
    "outputSchema": {
        "type": "object",
        "properties": {"status": {"enum": ["sent", "refused"]}, "by": {"type": "string"}},
        "required": ["status", "by"],
    },
    "suspend": {
        "confirm": {
            "suspendSchema": {
                "type": "object",
                "properties": {"prompt": {"type": "string"}},
                "required": ["prompt"],
            },
            "resumeSchema": {
                "type": "object",
                "properties": {
                    "approved": {"type": "boolean"},
                    "approver": {"type": "string", "pattern": "^[a-z]+$"},
                },
                "required": ["approved", "approver"],
                "additionalProperties": False,
            },
        }
    },
}

PLAN = {
    "id": "ops.plan.v1",
    "name": "plan",
    "description": "Plan a change; a human edits the steps (a nested answer).",
    "kind": "execute",
    "sideEffect": "idempotent",
    "inputSchema": {
        "type": "object",
        "properties": {"goal": {"type": "string"}},
        "required": ["goal"],
    },
    "suspend": {
        "review": {
            "suspendSchema": {
                "type": "object",
                "properties": {"prompt": {"type": "string"}},
                "required": ["prompt"],
            },
            "resumeSchema": {
                "type": "object",
                "properties": {
                    "steps": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"title": {"type": "string"}},
                            "required": ["title"],
                        },
                    }
                },
                "required": ["steps"],
            },
        }
    },
}

LOOKUP = {
    "id": "crm.find.v1",
    "name": "find",
    "description": "Find a customer by id.",
    "kind": "read_only",
    "sideEffect": "pure",
    "inputSchema": {
        "type": "object",
        "properties": {
            "customer_id": {"type": "integer"},
            "note": {"type": "string"},
        },
        "required": ["customer_id"],
        "additionalProperties": False,
    },
    "outputSchema": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
        "required": ["id", "name"],
    },
}

SCAN = {
    "id": "device.scan.v1",
    "name": "scan",
    "description": "Scan a barcode with the user's device (the client runs it).",
    "kind": "read_only",
    "sideEffect": "pure",
    "execution": "client",
    "inputSchema": {
        "type": "object",
        "properties": {"hint": {"type": "string"}},
        "required": ["hint"],
        "additionalProperties": False,
    },
    "outputSchema": {
        "type": "object",
        "properties": {"code": {"type": "string"}},
        "required": ["code"],
    },
}
"""A client tool: built into the package, registered only by the tests that use it."""

CHARGE = {
    "id": "pay.charge.v1",
    "name": "charge",
    "description": "Charge a card; takes `seconds` to answer (a slow, non-idempotent call).",
    "kind": "write",
    "sideEffect": "non_idempotent",
    "inputSchema": {
        "type": "object",
        "properties": {
            "cents": {"type": "integer", "minimum": 1},
            "seconds": {"type": "number", "minimum": 0},
            "note": {"type": "string", "minLength": 1, "x-mcp-header": "Note"},
            "steps": {"type": "integer", "minimum": 0},
        },
        "required": ["cents"],
        "additionalProperties": False,
    },
    "outputSchema": {
        "type": "object",
        "properties": {"charged": {"type": "integer"}},
        "required": ["charged"],
    },
}
"""Registered by ``make_service_runtime`` only: every entry appends ``charge <cents> pid <pid>``
to ``$BLADE_EFFECTS`` (what ran, counted from outside), then it waits ``seconds``, reporting
``steps`` progress events and a message."""

SPECS = (TRANSFER, PLAN, LOOKUP, SCAN, CHARGE)

ENTRIES: list[str] = []
"""Every entry of an implementation in this process: ``<tool>:<initial|resume>``."""


def _effect(line: str) -> None:
    path = os.environ.get("BLADE_EFFECTS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


async def transfer(ctx: Any) -> Any:
    from blade_agent_specs.bank import transfer_v1 as spec

    ENTRIES.append("transfer:" + ("resume" if isinstance(ctx.entry, ResumeEntry) else "initial"))
    if isinstance(ctx.entry, ResumeEntry):
        answer = ctx.entry.payload
        if not answer.approved:
            return spec.TransferOutput(status="refused", by=answer.approver)
        _effect(f"sent {ctx.input.amount} to {ctx.input.to} by {answer.approver} pid {os.getpid()}")
        return spec.TransferOutput(status="sent", by=answer.approver)
    prompt = f"Send {ctx.input.amount} to {ctx.input.to}?"
    ctx.suspend("confirm", spec.TransferConfirmSuspend(prompt=prompt))


async def plan(ctx: Any) -> Any:
    from blade_agent_specs.ops import plan_v1 as spec

    if isinstance(ctx.entry, ResumeEntry):
        return {"steps": [step.title for step in ctx.entry.payload.steps]}
    ctx.suspend("review", spec.PlanReviewSuspend(prompt=f"Review the plan for {ctx.input.goal}"))


async def find(ctx: Any) -> Any:
    from blade_agent_specs.crm import find_v1 as spec

    ENTRIES.append("find:initial")
    return spec.FindOutput(id=ctx.input.customer_id, name=f"customer {ctx.input.customer_id}")


async def charge(ctx: Any) -> Any:
    from blade_agent_specs.pay import charge_v1 as spec

    _effect(f"charge {ctx.input.cents} pid {os.getpid()}")
    steps = ctx.input.steps if isinstance(ctx.input.steps, int) else 0
    seconds = ctx.input.seconds if isinstance(ctx.input.seconds, int | float) else 0
    for step in range(1, steps + 1):
        ctx.progress(f"step {step}", completed=step, total=steps)
    if steps:
        ctx.message("charged")
    await asyncio.sleep(seconds)
    return spec.ChargeOutput(charged=ctx.input.cents)


def make_service_runtime(store: Store | None = None) -> Runtime:
    """``make_runtime``'s tools and ``charge``."""
    from blade_agent_specs.pay import charge_v1

    runtime = make_runtime(store)
    runtime.register(charge_v1.SPEC, charge)
    return runtime


def register(runtime: Runtime) -> Runtime:
    from blade_agent_specs.bank import transfer_v1
    from blade_agent_specs.crm import find_v1
    from blade_agent_specs.ops import plan_v1

    runtime.register(transfer_v1.SPEC, transfer)
    runtime.register(plan_v1.SPEC, plan)
    runtime.register(find_v1.SPEC, find)
    return runtime


def make_runtime(store: Store | None = None) -> Runtime:
    """A runtime with the three tools (``blade-runtime mcp tests.agent_tools:make_runtime``)."""
    return register(Runtime(store=store))


SECRET = "customer-secret"
"""What ``find``'s projections remove from its output (an API key, say): no client sees it."""


async def find_secret(ctx: Any) -> Any:
    from blade_agent_specs.crm import find_v1 as spec

    return spec.FindOutput(id=ctx.input.customer_id, name=f"{SECRET} {ctx.input.customer_id}")


def make_projecting_runtime(store: Store | None = None) -> Runtime:
    """``find`` registered three times, each projecting its output so that its name (the
    secret) stays out of what the model reads: as JSON, as a sentence, as content blocks."""
    from blade_agent_specs.crm import find_v1

    from blade_runtime.core.content import ResourceLink, Text

    runtime = Runtime(store=store)
    runtime.register(
        find_v1.SPEC, find_secret, name="find_json", project=lambda out: {"id": out.id}
    )
    runtime.register(
        find_v1.SPEC, find_secret, name="find_line", project=lambda out: f"Customer #{out.id}."
    )
    runtime.register(
        find_v1.SPEC,
        find_secret,
        name="find_blocks",
        project=lambda out: [Text(f"Customer #{out.id}"), ResourceLink(f"crm://c/{out.id}", "c")],
    )
    runtime.register(find_v1.SPEC, find_secret, name="find_whole")  # no projection
    return runtime


GUIDANCE = "Find a customer before you plan or send a transfer to them."
"""The agent tools' package guidance (its specs/guidance.md): the seed's skills guidance."""


def build_package(root: Any) -> Any:
    """Write ``SPECS`` under ``root/specs``, build them into ``root/out`` and return ``root/out``
    (put it on ``sys.path``, and on ``PYTHONPATH`` for workers)."""
    import json
    from pathlib import Path

    from blade_codegen.build import build

    base = Path(root)
    for data in SPECS:
        path = base / "specs" / (str(data["id"]).replace(".", "/", 1) + ".json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data), "utf-8")
    (base / "specs" / "guidance.md").write_text(GUIDANCE + "\n", "utf-8")
    build(base / "specs", base / "out", PACKAGE)
    return base / "out"


def build_graph(
    runtime: Runtime,
    saver: Any,
    replies: list[Any],
    principal: Principal | None = None,
    agent_id: str | None = None,
) -> Any:
    """A LangGraph agent loop: a fake chat model playing ``replies`` (AIMessages), a ToolNode
    with the runtime's tools (for ``principal``, naming ``agent_id``), compiled with ``saver``."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from blade_runtime.adapters.langgraph import structured_tools

    model = GenericFakeChatModel(messages=iter(replies))

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    tools = structured_tools(runtime, principal=principal, agent_id=agent_id)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


def saver_state(saver: Any) -> bytes:
    """An InMemorySaver's checkpoints as bytes: what a shared checkpointer would hold."""
    import pickle

    storage = {t: {ns: dict(c) for ns, c in n.items()} for t, n in saver.storage.items()}
    return pickle.dumps((storage, dict(saver.writes), dict(saver.blobs)))


def load_saver(data: bytes) -> Any:
    import pickle

    from langgraph.checkpoint.memory import InMemorySaver

    storage, writes, blobs = pickle.loads(data)
    saver = InMemorySaver()
    for thread, namespaces in storage.items():
        for ns, checkpoints in namespaces.items():
            saver.storage[thread][ns].update(checkpoints)
    saver.writes.update(writes)
    saver.blobs.update(blobs)
    return saver


def resume_graph_worker(
    db: str, effects: str, state: bytes, answer: Any, barrier: Any, out: Any
) -> None:
    """One process resuming the graph's interrupt (the same checkpoint as another process)."""
    import asyncio

    from langchain_core.messages import AIMessage
    from langgraph.types import Command

    from blade_runtime.stores.sqlite import SQLiteStore

    os.environ["BLADE_EFFECTS"] = effects
    store = SQLiteStore(db)
    runtime = make_runtime(store)
    graph = build_graph(runtime, load_saver(state), [AIMessage(content="done")])

    async def main() -> Any:
        barrier.wait(timeout=60)
        final = await graph.ainvoke(Command(resume=answer), {"configurable": {"thread_id": "t"}})
        await runtime.close()
        return [m.content for m in final["messages"] if m.type == "tool"]

    try:
        out.put((os.getpid(), asyncio.run(main()), list(ENTRIES)))
    finally:
        store.close()


def built_package(factory: Any) -> Path:
    """The agent tools' package built under ``factory`` (pytest's tmp_path_factory) and put on
    the import path: the module fixture of the adapter and MCP tests."""
    out: Path = build_package(factory.mktemp("agent"))
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return out


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine

    return asyncio.run(main())
