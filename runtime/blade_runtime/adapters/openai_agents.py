"""OpenAI Agents SDK tools from a runtime (``pip install 'blade-runtime[openai-agents]'``).

    tools = function_tools(runtime, principal=Principal("ann", "acme"), approve=("write",))
    agent = Agent(name="ops", tools=tools, tool_use_behavior=stop_on_pending)
    result = await Runner.run(agent, "Refund pay_1")
    if isinstance(result.final_output, PendingCalls):              # the run stopped: it waits
        answers = {call.tool_call_id: {"approved": True, "approver": "ann"}
                   for call in result.final_output.calls}
        following = await resume(runtime, result, answers)          # through runtime.submit
        result = await Runner.run(agent, following)

Each registration is a ``FunctionTool`` whose ``params_json_schema`` is the spec's input schema,
unchanged: ``strict_json_schema`` is on only when the SDK's strict rewrite would leave the schema
as it is (the rewrite makes optional fields required; a probe saw it). The tool receives the
model's JSON text and hands it to ``runtime.call``, which validates it against the schema; the
model reads the runtime's content (an error is ``{"error": CODE, "message": ...}``). ``approve``:
the kinds (``write``, ``execute``) whose calls need the SDK's human approval first (the run is
interrupted; ``RunState.approve`` / ``reject``). A call that waits on a pending action returns a
``PendingOutput`` (the model-facing JSON text, carrying the action); with
``tool_use_behavior=stop_on_pending`` the run stops there and its final output is the
``PendingCalls``. ``resume`` submits answers through ``runtime.submit`` (an invalid one is
refused, ``ResumeRefused``, before anything is submitted) and returns the run's input list with
each waiting call's output replaced by its result, for the next ``Runner.run``.

The tool list is ``principal``'s: a registration enabled only for some callers (``enabled=``)
is there for them, and its description is the one ``describe=`` gives for that caller. A client
tool (``execution: client``) is a FunctionTool too: its call waits on the client's output like a
suspension (a ``PendingOutput``), and ``resume`` submits that output (validated against the
tool's output schema); without ``stop_on_pending`` the model reads the pending action and no one
runs the tool, so an agent with client tools wants ``stop_on_pending``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents import FunctionTool, RunContextWrapper, RunResult
from agents.agent import ToolsToFinalOutputResult
from agents.items import ToolCallOutputItem
from agents.strict_schema import ensure_strict_json_schema
from agents.tool import FunctionToolResult
from agents.tool_context import ToolContext
from pydantic import JsonValue

from blade_runtime.adapters.functions import exported_functions
from blade_runtime.core import actions
from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.jsonvalue import compact_json
from blade_runtime.core.results import ToolPending
from blade_runtime.runtime import Runtime

__all__ = [
    "PendingCall",
    "PendingCalls",
    "PendingOutput",
    "ResumeRefused",
    "function_tools",
    "pending_calls",
    "resume",
    "stop_on_pending",
    "strict_compatible",
]


@dataclass(frozen=True, slots=True)
class PendingCall:
    """One tool call that waits on a pending action."""

    tool_call_id: str
    tool_name: str
    action_id: str
    name: str  # <registration>.<point>, or the registration of a client tool
    payload: JsonValue
    resume_schema: JsonValue


class PendingCalls(str):
    """The final output of a run ``stop_on_pending`` stopped: ``calls``, the calls that wait.

    A ``str`` (the pending actions as JSON text), because an agent whose output type is ``str``
    has its final output passed through ``str()``; that keeps this object."""

    calls: tuple[PendingCall, ...]

    def __new__(cls, calls: Sequence[PendingCall]) -> PendingCalls:
        text = compact_json(
            [
                {"pending": c.name, "action_id": c.action_id, "tool_call_id": c.tool_call_id}
                for c in calls
            ]
        )
        made = super().__new__(cls, text)
        made.calls = tuple(calls)
        return made

    def __str__(self) -> str:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (PendingCalls, (self.calls,))


class PendingOutput(str):
    """A tool's output while its call waits: the model-facing JSON text, and the action."""

    pending: PendingCall

    def __new__(cls, text: str, pending: PendingCall) -> PendingOutput:
        made = super().__new__(cls, text)
        made.pending = pending
        return made

    def __reduce__(self) -> tuple[Any, ...]:  # the SDK deep-copies tool outputs
        return (PendingOutput, (str(self), self.pending))


class ResumeRefused(Exception):
    """Answers the actions' schemas refuse, by tool call id; nothing was submitted."""

    def __init__(self, refused: Mapping[str, str]) -> None:
        self.refused = dict(refused)
        super().__init__("; ".join(f"{call}: {why}" for call, why in self.refused.items()))


def strict_compatible(schema: Mapping[str, Any]) -> bool:
    """Whether the SDK's strict mode would take ``schema`` as it is (its rewrite changes
    nothing)."""
    try:
        rewritten = ensure_strict_json_schema(copy.deepcopy(dict(schema)))
    except Exception:  # the SDK refuses what it cannot make strict (UserError and others)
        return False
    return bool(_canonical(rewritten) == _canonical(schema))


def _canonical(value: Any) -> Any:
    """``value`` with every ``required`` list sorted (the rewrite reorders them)."""
    if isinstance(value, Mapping):
        return {
            key: sorted(item) if key == "required" and isinstance(item, list) else _canonical(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    return value


def function_tools(
    runtime: Runtime,
    *,
    principal: Principal | None = None,
    context: Callable[[ToolContext[Any]], CallContext | None] | None = None,
    approve: Collection[str] = (),
    run_id: str = "openai-agents",
    agent_id: str | None = None,
) -> list[FunctionTool]:
    """A FunctionTool per registration callable by ``principal`` (see the module's doc): the
    ``enabled`` and ``describe`` callbacks see ``principal``'s call context, so the list is the
    one this caller's calls may use. ``context``: a function of the SDK's tool context (its
    ``context``, say) giving each call's context, else ``principal``'s (a tool left out or
    described for ``principal`` is decided again for that context when it is called). Client
    tools are included: their calls wait for the client's output (see the module's doc).
    ``agent_id``: the agent every call names as the one executing it (``ctx.agent_id``), else
    the SDK's running agent's ``name``; the thread is the run config's ``group_id`` (what
    ``context`` gives wins over both)."""
    tools: list[FunctionTool] = []
    for function in exported_functions(runtime, CallContext(principal=principal), run_id):
        schema, name = function.parameters, function.registration.name
        tool = FunctionTool(
            name=function.wire,
            description=function.description,
            params_json_schema=dict(schema),
            on_invoke_tool=_invoker(
                runtime, name, function.wire, principal, context, run_id, agent_id
            ),
            strict_json_schema=strict_compatible(schema),
            needs_approval=function.registration.spec.kind in approve,
        )
        tool.params_json_schema = dict(schema)  # strict or not, the schema as the spec has it
        tools.append(tool)
    return tools


def _invoker(
    runtime: Runtime,
    name: str,
    wire: str,
    principal: Principal | None,
    context: Callable[[ToolContext[Any]], CallContext | None] | None,
    run_id: str,
    agent_id: str | None,
) -> Callable[[ToolContext[Any], str], Any]:
    fixed = CallContext(principal=principal, agent_id=agent_id)

    async def invoke(ctx: ToolContext[Any], arguments: str) -> str:
        made = None if context is None else context(ctx)
        running, config = ctx.agent, ctx.run_config
        who = (fixed if made is None else made).placed(
            agent_id if agent_id is not None or running is None else running.name,
            None if config is None else config.group_id,  # the SDK's conversation (thread) id
        )
        result = await runtime.call(name, arguments, run_id=run_id, context=who)
        text = compact_json(result.content)
        if not isinstance(result, ToolPending):
            return text
        action = await runtime.records.action(result.action.action_id, principal=who.principal)
        pending = PendingCall(
            ctx.tool_call_id,
            wire,
            result.action.action_id,
            result.action.name,
            result.action.payload,
            None if action is None else dict(action.submit_schema),
        )
        return PendingOutput(text, pending)

    return invoke


def stop_on_pending(
    context: RunContextWrapper[Any], results: list[FunctionToolResult]
) -> ToolsToFinalOutputResult:
    """``Agent(tool_use_behavior=stop_on_pending)``: the run stops when a call waits."""
    waiting = tuple(r.output.pending for r in results if isinstance(r.output, PendingOutput))
    if waiting:
        return ToolsToFinalOutputResult(is_final_output=True, final_output=PendingCalls(waiting))
    return ToolsToFinalOutputResult(is_final_output=False)


def pending_calls(result: RunResult) -> PendingCalls | None:
    """The calls of ``result``'s last turn that wait on a pending action (None: none), whatever
    the agent's ``tool_use_behavior`` and output type."""
    if isinstance(result.final_output, PendingCalls):
        return result.final_output
    waiting = [
        item.output.pending
        for item in result.new_items
        if isinstance(item, ToolCallOutputItem) and isinstance(item.output, PendingOutput)
    ]
    return PendingCalls(waiting) if waiting else None


async def resume(
    runtime: Runtime,
    result: RunResult,
    answers: Mapping[str, JsonValue],
    *,
    principal: Principal | None = None,
) -> list[Any]:
    """Submit ``answers`` (by tool call id) to the actions the run stopped on, each validated
    against its action's stored schema before any is submitted; returns the run's input list with
    those calls' outputs replaced by their results (the next run's input). ``principal``: who
    answers (an action another tenant's is refused; None: the application itself)."""
    waiting = pending_calls(result)
    calls = {c.tool_call_id: c for c in waiting.calls} if waiting is not None else {}
    refused: dict[str, str] = {}
    for call_id, answer in answers.items():
        call = calls.get(call_id)
        action = (
            None
            if call is None
            else await runtime.records.action(call.action_id, principal=principal)
        )
        if action is None:
            refused[call_id] = "no pending action of this run for this tool call"
        elif action.state != "pending":
            refused[call_id] = actions.already_resolved(action)
        else:
            invalid = actions.invalid_submission(action, answer)
            if invalid is not None:
                refused[call_id] = invalid
    if refused:
        raise ResumeRefused(refused)
    outputs: dict[str, str] = {}
    for call_id, answer in answers.items():
        settled = await runtime.submit(calls[call_id].action_id, answer, principal=principal)
        outputs[call_id] = compact_json(settled.content)
    return _replace_outputs(result.to_input_list(), outputs)


def _replace_outputs(items: Sequence[Any], outputs: Mapping[str, str]) -> list[Any]:
    replaced: list[Any] = []
    for item in items:
        if (
            isinstance(item, dict)
            and item.get("type") == "function_call_output"
            and item.get("call_id") in outputs
        ):
            item = {**item, "output": outputs[item["call_id"]]}
        replaced.append(item)
    return replaced
