"""LangChain tools from a runtime, for LangGraph (``pip install 'blade-runtime[langgraph]'``).

    tools = structured_tools(runtime, principal=Principal("ann", "acme"))
    graph = ...  # a StateGraph with ToolNode(tools), compiled with a checkpointer
    state = await graph.ainvoke({"messages": [...]}, config)       # interrupts: a call waits
    (waiting,) = state["__interrupt__"]
    resume_model(runtime, waiting.value)                            # the generated resume model
    await graph.ainvoke(Command(resume={"approved": True, "approver": "ann"}), config)

Each registration is a LangChain tool whose ``args_schema`` is the spec's input schema (a JSON
Schema dict, so LangChain validates nothing: the runtime validates the arguments exactly). A call
that waits on a pending action becomes ``interrupt(value, response_schema=...)``: the value holds
the action's id, name, payload and the tool call id; ``response_schema`` is the resume schema
stored with the action (``resume_model`` gives the generated resume model for it). The call is
keyed by the graph's thread and the tool call id (call id ``lg/<thread>/<tool call id>``), so
LangGraph's re-execution of the node from the top finds the recorded call and never runs the
implementation again: the resume value goes to ``runtime.submit``, which validates it (an invalid
one interrupts again with the refusal, the action still pending) and of concurrent resumes (two
processes resuming one interrupt) lets exactly one re-enter the implementation; the others read
the call's recorded result once it settles. Errors are ``ToolException``s whose text is the
model-facing error JSON (``status="error"`` on the ToolMessage). A result's metadata
(``ctx.metadata``) and effects (``ctx.effects``) are the ToolMessage's ``artifact``
(``{"metadata": ..., "effects": [...]}``, None when there are neither), which LangChain keeps
for the application and never sends to the model.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException
from langgraph.types import interrupt
from pydantic import BaseModel, JsonValue

from blade_runtime.adapters.functions import exported_functions
from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.effects import Effect, effects_json
from blade_runtime.core.jsonvalue import compact_json
from blade_runtime.core.outcomes import stored_effects, stored_metadata
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolResult, ToolSuccess
from blade_runtime.core.store import ActionRecord, CallRecord
from blade_runtime.runtime import Runtime

__all__ = ["BladeTool", "resume_model", "structured_tools"]

SETTLE_WAIT_S = 30.0  # how long a resume another process won waits for the call to settle


def structured_tools(
    runtime: Runtime,
    *,
    principal: Principal | None = None,
    context: Callable[[RunnableConfig], CallContext | None] | None = None,
    run_id: str = "langgraph",
    agent_id: str | None = None,
) -> list[BaseTool]:
    """A tool per registration callable by ``principal``: the ``enabled`` and ``describe``
    callbacks see ``principal``'s call context, so the list is the one this caller's calls may
    use (see the module's doc). ``context``: a function of the runnable config giving each
    call's context, else ``principal``'s. ``agent_id``: the agent every call names as the one
    executing it (``ctx.agent_id``), else the config's ``lc_agent_name`` metadata (the name
    LangChain's ``create_agent`` gives its graph); the thread is the config's ``thread_id``
    (what ``context`` gives wins over both)."""
    return [
        BladeTool(
            name=function.wire,
            description=function.description,
            args_schema=function.parameters,
            handle_tool_error=True,
            runtime=runtime,
            registration=function.registration.name,
            principal=principal,
            context_of=context,
            run_id=run_id,
            agent_id=agent_id,
        )
        for function in exported_functions(runtime, CallContext(principal=principal), run_id)
    ]


def _agent_name(config: RunnableConfig) -> str | None:
    """The running agent's name as LangChain's ``create_agent`` (or the application, in the
    config's metadata) names it: ``lc_agent_name``, the key LangGraph's streams read too."""
    name = (config.get("metadata") or {}).get("lc_agent_name")
    return name if isinstance(name, str) else None


def resume_model(runtime: Runtime, value: Any) -> type[BaseModel] | None:
    """The generated resume model of the suspend point an interrupt's ``value`` names (None: a
    client tool's output, a permission request, or a registration this runtime does not have).
    A type, read from the registration: nothing of the action's record is read here."""
    if not isinstance(value, dict) or not isinstance(value.get("action_id"), str):
        return None
    tool, point = value.get("tool"), value.get("point")
    if not isinstance(tool, str):  # an interrupt made before "tool" and "point" were in it
        tool, _, point = str(value.get("name", "")).rpartition(".")
    registration = next((r for r in runtime.registrations() if r.name == tool), None)
    points = {} if registration is None else getattr(registration.spec, "suspend", {})
    if not isinstance(point, str) or point not in points:
        return None
    found = points[point].resume_type
    return found if isinstance(found, type) and issubclass(found, BaseModel) else None


class BladeTool(BaseTool):
    """One registration as a LangChain tool (built by ``structured_tools``)."""

    runtime: Any  # Runtime (Any: pydantic would try to build a schema for it)
    registration: str
    principal: Any = None  # Principal | None
    context_of: Any = None  # Callable[[RunnableConfig], CallContext | None] | None
    run_id: str = "langgraph"
    agent_id: str | None = None
    # The ToolMessage's artifact (for the application, never sent to the model): the result's
    # metadata and effects, where the tool set or emitted any.
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # the arguments as the model sent them, and the tool call id that keys the call
        arguments = tool_input if isinstance(tool_input, dict) else json.loads(tool_input)
        return (), {"arguments": arguments, "tool_call_id": tool_call_id}

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("blade tools run asynchronously: use ainvoke")

    async def _arun(
        self, arguments: dict[str, Any], tool_call_id: str | None, config: RunnableConfig
    ) -> Answer:
        runtime: Runtime = self.runtime
        configurable = config.get("configurable") or {}
        thread = configurable.get("thread_id")
        call_id = None
        if tool_call_id is not None:
            call_id = f"lg/{'' if thread is None else thread}/{tool_call_id}"
        made = None if self.context_of is None else self.context_of(config)
        context = CallContext(principal=self.principal) if made is None else made
        context = context.placed(
            self.agent_id if self.agent_id is not None else _agent_name(config),
            thread if isinstance(thread, str) else None,
        )
        who = context.principal
        records = runtime.records
        recorded = None
        if call_id is not None:
            shown = await records.sees_call(call_id, principal=who)
            if shown is False:
                # a thread id and a tool call id are the graph's, not a credential: another
                # principal's call under them is not this caller's to see or resume
                message = f"The call {call_id} is another caller's; use a thread id of your own."
                raise ToolException(
                    compact_json({"error": ErrorCode.DUPLICATE_CALL, "message": message})
                )
            if shown:
                recorded = await records.call(call_id, principal=who)
        if recorded is None and call_id is not None:
            remembered = _memo(runtime).get(_memo_key(call_id, context))
            if remembered is not None:  # settled here, on a store that keeps no such calls
                return _replay(remembered)
        if recorded is None:
            result = await runtime.call(
                self.registration,
                arguments,
                call_id=call_id,
                run_id=self.run_id,
                context=context,
            )
            if not isinstance(result, ToolPending):
                if call_id is not None:
                    _remember(runtime, _memo_key(call_id, context), result)
                return _content(result)
            action = await records.action(result.action.action_id, principal=who)
        else:  # LangGraph re-runs the node: the call is recorded, its implementation never reruns
            settled = _recorded(recorded)
            if settled is not None:
                return settled
            action = await _waiting(runtime, recorded.call_id, who)
        note: str | None = None
        while action is not None:
            if action.state != "pending":
                return await _settled(runtime, action.call_id, who)
            value = _interrupt_value(action, tool_call_id, note)
            answer = interrupt(value, response_schema=dict(action.submit_schema))
            resumed = await runtime.submit(action.action_id, answer, principal=who)
            if isinstance(resumed, ToolError) and resumed.code == ErrorCode.INVALID_SUBMISSION:
                note = resumed.message  # the next interrupt asks again; the action still waits
                continue
            if isinstance(resumed, ToolError) and resumed.code == ErrorCode.ACTION_ALREADY_RESOLVED:
                return await _settled(runtime, action.call_id, who)  # another resume won
            if not isinstance(resumed, ToolPending):
                return _content(resumed)
            action = await records.action(resumed.action.action_id, principal=who)
            note = None
        raise ToolException(
            compact_json({"error": "UNKNOWN_ACTION", "message": "The action is gone."})
        )


Answer = tuple[str, JsonValue]
"""What the tool returns LangChain: the content the model reads, and the artifact."""
_MEMO: weakref.WeakKeyDictionary[Runtime, OrderedDict[str, tuple[bool, Answer]]] = (
    weakref.WeakKeyDictionary()
)
MEMO_SIZE = 10_000


def _memo(runtime: Runtime) -> OrderedDict[str, tuple[bool, Answer]]:
    """Results of calls that settled at once, by call id and caller (``_memo_key``): a
    MemoryStore records no call that neither waits nor writes data, so a re-executed node
    finds them here (in this process; a durable store records every call, for every
    process)."""
    found = _MEMO.get(runtime)
    if found is None:
        found = _MEMO[runtime] = OrderedDict()
    return found


def _memo_key(call_id: str, context: CallContext) -> str:
    """A remembered result is its caller's alone (the call id is the graph's, not a secret)."""
    who = context.principal
    return call_id if who is None else json.dumps([call_id, who.tenant, who.id])


def _remember(runtime: Runtime, key: str, result: ToolResult[Any]) -> None:
    memo = _memo(runtime)
    memo[key] = (isinstance(result, ToolError), (compact_json(result.content), _artifact(result)))
    while len(memo) > MEMO_SIZE:
        memo.popitem(last=False)


def _replay(remembered: tuple[bool, Answer]) -> Answer:
    failed, answer = remembered
    if failed:
        raise ToolException(answer[0])
    return answer


def _interrupt_value(action: ActionRecord, tool_call_id: str | None, note: str | None) -> Any:
    value: dict[str, JsonValue] = {
        "action_id": action.action_id,
        "name": action.name if action.point is None else f"{action.name}.{action.point}",
        "tool": action.name,
        "point": action.point,
        "payload": action.payload,
        "tool_call_id": tool_call_id,
    }
    if note is not None:
        value["refused"] = note
    return value


async def _waiting(
    runtime: Runtime, call_id: str, principal: Principal | None
) -> ActionRecord | None:
    found = await runtime.records.actions(state=None, call_id=call_id, principal=principal)
    return found[-1] if found else None


def _recorded(call: CallRecord) -> Answer | None:
    """The call's recorded result as the tool's output (None: not settled)."""
    if call.state != "settled" or not isinstance(call.result, dict):
        return None
    if call.result.get("status") == "error":
        raise ToolException(
            compact_json({"error": call.result.get("code"), "message": call.result.get("message")})
        )
    stored = call.result
    artifact = _artifact_of(stored_metadata(stored), stored_effects(stored))
    return compact_json(stored.get("content")), artifact


async def _settled(runtime: Runtime, call_id: str, principal: Principal | None) -> Answer:
    """Wait for a call another resume re-entered to settle, and read its result."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_WAIT_S
    while True:
        call = await runtime.records.call(call_id, principal=principal)
        if call is not None:
            settled = _recorded(call)
            if settled is not None:
                return settled
            if call.state == "suspended":  # it waits again, on a newer action
                newer = await _waiting(runtime, call_id, principal)
                if newer is not None and newer.state == "pending":
                    waiting: JsonValue = {"pending": newer.name, "action_id": newer.action_id}
                    return compact_json(waiting), None
        if loop.time() > deadline:
            return compact_json({"pending": "resumed elsewhere", "call_id": call_id}), None
        await asyncio.sleep(0.02)


def _content(result: ToolResult[Any]) -> Answer:
    if isinstance(result, ToolError):
        raise ToolException(compact_json(result.content))
    return compact_json(result.content), _artifact(result)


def _artifact(result: ToolResult[Any]) -> JsonValue:
    if isinstance(result, ToolSuccess | ToolError):
        return _artifact_of(result.metadata, result.effects)
    return None


def _artifact_of(metadata: JsonValue, effects: Sequence[Effect]) -> JsonValue:
    """The ToolMessage's artifact: ``{"metadata": ..., "effects": [...]}``, each where there is
    one (None: neither)."""
    found: dict[str, JsonValue] = {}
    if metadata is not None:
        found["metadata"] = metadata
    if effects:
        found["effects"] = effects_json(effects)
    return found or None
