"""A Pydantic AI toolset from a runtime (``pip install 'blade-runtime[pydantic-ai]'``).

    toolset = BladeToolset(runtime, principal=Principal("ann", "acme"))
    agent = Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])
    result = await agent.run("Refund pay_1")
    if isinstance(result.output, DeferredToolRequests):            # a call waits on an action
        answers = {call.tool_call_id: {"approved": True, "approver": "ann"}
                   for call in result.output.calls}
        results = await toolset.resume(result.output, answers)     # ResumeRefused if invalid
        result = await agent.run(message_history=result.all_messages(),
                                 deferred_tool_results=results)

Each registration is a tool whose parameters are the spec's input schema, unchanged. Pydantic AI
validates nothing (its argument validator accepts any JSON object); the runtime validates the
arguments against the schema (``"12"`` for an integer is refused, as the schema says) and the
model is asked to retry with the runtime's sentence (``ModelRetry``). A suspension is a deferred
call (``CallDeferred``, kind ``question``) whose metadata holds the action's id, payload and resume
schema. ``resume`` validates every answer against the schema stored with its action before
anything is submitted (one invalid answer: ``ResumeRefused``, nothing submitted, every action still
pending), then resumes each through ``runtime.submit``; the values Pydantic AI hands back to the
model are the runtime's results. Errors other than invalid input are the model-facing error JSON.
A result whose tool set ``ctx.metadata`` reaches Pydantic AI as a ``ToolReturn`` carrying it as
``metadata`` (kept in the message history for the application, not sent to the model), with the
effects the tool emitted (``ctx.effects``) under ``blade_effects``; the messages it posted are
the ``ToolReturn``'s ``content``, which Pydantic AI sends the model as a message of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import JsonValue
from pydantic_ai import (
    CallDeferred,
    DeferredToolRequests,
    DeferredToolResults,
    ModelRetry,
    RunContext,
    ToolReturn,
)
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from blade_runtime.adapters.functions import exported_functions
from blade_runtime.core import actions
from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.effects import effects_json
from blade_runtime.core.jsonvalue import compact_json
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolResult, ToolSuccess
from blade_runtime.runtime import Runtime

__all__ = ["BladeToolset", "ResumeRefused", "pending_metadata"]

_ANY = SchemaValidator(core_schema.any_schema())  # the runtime validates, never pydantic AI


class ResumeRefused(Exception):
    """Answers the actions' resume schemas refuse, by tool call id; nothing was submitted."""

    def __init__(self, refused: Mapping[str, str]) -> None:
        self.refused = dict(refused)
        super().__init__("; ".join(f"{call}: {why}" for call, why in self.refused.items()))


async def pending_metadata(
    result: ToolPending, runtime: Runtime, principal: Principal | None = None
) -> dict[str, Any]:
    """What a deferred call carries: the action's id and name, its payload, its resume schema
    (read as ``principal``, whose call it is, may see it)."""
    action = await runtime.records.action(result.action.action_id, principal=principal)
    return {
        "action_id": result.action.action_id,
        "name": result.action.name,
        "payload": result.action.payload,
        "resume_schema": None if action is None else action.submit_schema,
    }


class BladeToolset(AbstractToolset[Any]):
    """The runtime's callable registrations as Pydantic AI tools (see the module's doc)."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        principal: Principal | None = None,
        context: Callable[[RunContext[Any]], CallContext | None] | None = None,
        run_id: str = "pydantic-ai",
        max_retries: int = 1,
        id: str | None = "blade",
        agent_id: str | None = None,
    ) -> None:
        """``principal``: who every call is for; ``context``: or a function of the run context
        (its ``deps``, say) giving the call context. ``max_retries``: how often the model may
        correct arguments the schema refused. ``agent_id``: the agent its calls name as the
        one executing them (``ctx.agent_id``), else the running agent's ``name``; the thread
        is the run's ``conversation_id`` (what ``context`` gives wins over both)."""
        self.runtime = runtime
        self.agent_id = agent_id
        self.principal = principal
        self.context = context
        self.run_id = run_id
        self.max_retries = max_retries
        self._id = id
        # kept while the registrations are those they were made of (Tools.generation)
        self._tools: tuple[int, dict[str, ToolDefinition]] | None = None
        # immutable: one for every call
        self._fixed = CallContext(principal=principal, agent_id=agent_id)

    @property
    def id(self) -> str | None:
        return self._id

    def definitions(self, context: CallContext | None = None) -> dict[str, ToolDefinition]:
        """The tool definitions for ``context`` (registrations' ``enabled`` and ``describe`` may
        depend on the caller); cached while none does."""
        generation = self.runtime.tools.generation
        if self._tools is not None and self._tools[0] == generation:
            return self._tools[1]
        if self.runtime.tools.caller_dependent():
            return self._build(context)  # the caller's own: never kept
        self._tools = (generation, self._build(None))
        return self._tools[1]

    def _build(self, context: CallContext | None) -> dict[str, ToolDefinition]:
        return {
            function.wire: ToolDefinition(
                name=function.wire,
                description=function.description,
                parameters_json_schema=function.parameters,
                strict=False,  # the schema as written: no provider rewrite of it
                metadata={
                    "blade_name": function.registration.name,
                    "spec_id": function.registration.spec.id,
                },
            )
            for function in exported_functions(self.runtime, context, self.run_id)
        }

    async def get_instructions(self, ctx: RunContext[Any]) -> str | None:
        """The runtime's guidance for its tools (``Runtime.guidance``): Pydantic AI adds it to
        the model's instructions on every request, beside this toolset's tools."""
        return self.runtime.guidance

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            name: ToolsetTool(
                toolset=self,
                tool_def=definition,
                max_retries=self.max_retries,
                args_validator=_ANY,
            )
            for name, definition in self.definitions(self._call_context(ctx)).items()
        }

    def _call_context(self, ctx: RunContext[Any]) -> CallContext:
        made = None if self.context is None else self.context(ctx)
        agent = self.agent_id
        if agent is None and ctx.agent is not None:
            agent = ctx.agent.name
        return (self._fixed if made is None else made).placed(agent, ctx.conversation_id)

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        metadata = tool.tool_def.metadata or {}
        registered = str(metadata.get("blade_name", name))
        call_id = None
        if ctx.run_id is not None and ctx.tool_call_id is not None:
            call_id = f"{ctx.run_id}/{ctx.tool_call_id}"  # a replayed tool call is a duplicate
        context = self._call_context(ctx)
        result = await self.runtime.call(
            registered, tool_args, call_id=call_id, run_id=self.run_id, context=context
        )
        if isinstance(result, ToolPending):
            metadata = await pending_metadata(result, self.runtime, context.principal)
            raise CallDeferred(metadata, kind="question")
        return self._value(result)

    def _value(self, result: ToolResult[Any]) -> JsonValue | ToolReturn:
        if isinstance(result, ToolError) and result.code == ErrorCode.INVALID_INPUT:
            raise ModelRetry(result.message)
        return _returned(result)

    async def resume(
        self,
        requests: DeferredToolRequests,
        answers: Mapping[str, JsonValue],
        *,
        principal: Principal | None = None,
    ) -> DeferredToolResults:
        """Resume the deferred calls answered in ``answers`` (by tool call id) through
        ``runtime.submit``; every answer is validated against its action's stored schema first,
        and one refused answer refuses them all (``ResumeRefused``), before anything is submitted
        or Pydantic AI sees a value. A call this runtime did not defer, or another principal's,
        is refused too. ``principal``: who answers (default: the toolset's ``principal``; a
        toolset whose calls take theirs from ``context=`` must say who answers here)."""
        who = self.principal if principal is None else principal
        if who is None and self.context is not None:
            raise TypeError("resume(principal=...): this toolset's calls take it from context=")
        targets: dict[str, str] = {}
        refused: dict[str, str] = {}
        for call_id, answer in answers.items():
            meta = requests.metadata.get(call_id) or {}
            action_id = meta.get("action_id")
            records = self.runtime.records
            action = (
                None
                if not isinstance(action_id, str)
                else await records.action(action_id, principal=who)
            )
            if (
                action is None or await records.sees_call(action.call_id, principal=who) is False
            ):  # metadata comes back from the client's message history: never a credential
                refused[call_id] = "no pending action of this runtime for this tool call"
                continue
            if action.state != "pending":
                refused[call_id] = actions.already_resolved(action)
                continue
            invalid = actions.invalid_submission(action, answer)
            if invalid is not None:
                refused[call_id] = invalid
            targets[call_id] = action.action_id
        if refused:
            raise ResumeRefused(refused)
        results = DeferredToolResults()
        for call_id, action_id in targets.items():
            settled = await self.runtime.submit(action_id, answers[call_id], principal=who)
            results.calls[call_id] = _returned(settled)
        return results


def _returned(result: ToolResult[Any]) -> JsonValue | ToolReturn:
    """What Pydantic AI gets of a result: the content the model reads, in a ``ToolReturn``
    whose ``metadata`` (the application's, never sent to the model) is the tool's
    ``ctx.metadata`` when it set some, with the effects it emitted under ``blade_effects``;
    the messages it posted (``ctx.effects.post_message``) are the ``ToolReturn``'s
    ``content``, which Pydantic AI sends the model as a message of its own."""
    if not isinstance(result, ToolSuccess | ToolError):
        return result.content
    metadata, effects = result.metadata, result.effects
    if metadata is None and not effects:
        return result.content
    messages = [_text(e.value) for e in effects if e.type == "message"]
    if effects:
        listed: JsonValue = effects_json(effects)
        metadata = {**(metadata or {}), "blade_effects": listed}
    return ToolReturn(result.content, content=messages or None, metadata=metadata)


def _text(value: JsonValue) -> str:
    return value if isinstance(value, str) else compact_json(value)
