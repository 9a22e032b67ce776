"""A worked example: a Pydantic AI agent in a Temporal workflow (Pydantic AI's own Temporal
integration, ``TemporalDurability``) calling blade tools, for tests/runtime/temporal.

The agent's model requests and tool calls are activities of Pydantic AI's; each tool call runs
``BladeToolset.call_tool`` in the worker, that is ``Runtime.call``: the arguments validated
against the spec's schema (a refusal goes back to the model as a retry), the output validated.
The model is a ``FunctionModel`` (no LLM): it calls ``fetch`` with the prompt's number and then
answers with what the tool returned.
"""

from __future__ import annotations

import json

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import TemporalDurability
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        RetryPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from blade_runtime import Runtime
    from blade_runtime.adapters.pydantic_ai import BladeToolset
    from blade_runtime.temporal import ActivityStore


SEEN: list[object] = []  # what the tool calls returned to the model, as it last saw them


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Call ``fetch`` with the number in the prompt, first as a string (which the spec's schema
    refuses: the runtime's sentence comes back), then as a number; then say what it returned."""
    prompt = str(getattr(messages[0].parts[0], "content", ""))
    number = prompt.split()[-1]
    answers = [
        part.content
        for message in messages
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart | RetryPromptPart)
    ]
    SEEN[:] = answers
    if not answers:
        return ModelResponse(parts=[ToolCallPart("fetch", {"n": number})])
    if isinstance(answers[-1], dict):
        return ModelResponse(parts=[TextPart(f"fetched {json.dumps(answers[-1])}")])
    return ModelResponse(parts=[ToolCallPart("fetch", {"n": int(number)})])


def runtime(entries: str) -> Runtime:
    from process_worker import Tools

    made = Runtime(store=ActivityStore())
    Tools(entries).register(made)
    return made


def agent(tools: Runtime) -> Agent[None, str]:
    return Agent(
        FunctionModel(model),
        name="fetcher",
        toolsets=[BladeToolset(tools, id="blade")],
        capabilities=[TemporalDurability()],
    )


AGENT: Agent[None, str] | None = None


@workflow.defn(name="FetchingAgent")
class FetchingAgent:
    @workflow.run
    async def run(self, prompt: str) -> str:
        assert AGENT is not None
        result = await AGENT.run(prompt)
        return result.output
