"""Adapters to Pydantic AI, the OpenAI Agents SDK and LangChain/LangGraph: no network."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from blade_runtime.caller import Principal
from blade_runtime.runtime import Runtime

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
import agent_tools  # noqa: E402

ANN = Principal("ann", "acme")
SEND = {"to": "bob", "amount": 5}


def run(coroutine: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coroutine

    return asyncio.run(main())


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out: Path = agent_tools.build_package(tmp_path_factory.mktemp("agent"))
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return out


@pytest.fixture
def runtime(built: Path) -> Runtime:
    return agent_tools.make_runtime()


@pytest.fixture
def effects(tmp_path: Path) -> Any:
    path = tmp_path / "effects"
    os.environ["BLADE_EFFECTS"] = str(path)
    yield path
    del os.environ["BLADE_EFFECTS"]


# -- Pydantic AI ----------------------------------------------------------------------------


def _scripted(*steps: Any) -> Any:
    """A FunctionModel playing ``steps`` (lists of parts), recording what it was sent."""
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.function import FunctionModel

    seen: list[Any] = []
    queue = list(steps)

    def model(messages: list[Any], info: Any) -> Any:
        seen.append(messages[-1].parts)
        parts = queue.pop(0) if queue else [TextPart("done")]
        return ModelResponse(parts=parts)

    return FunctionModel(model), seen


def test_pydantic_ai_tools_carry_the_spec_schema(runtime: Runtime) -> None:
    from pydantic_ai.models.test import TestModel

    from blade_runtime.adapters.pydantic_ai import BladeToolset

    toolset = BladeToolset(runtime)
    definitions = toolset.definitions()
    assert sorted(definitions) == ["find", "plan", "transfer"]
    assert definitions["find"].parameters_json_schema == agent_tools.LOOKUP["inputSchema"]
    assert definitions["find"].strict is False

    from pydantic_ai import Agent

    agent = Agent(TestModel(call_tools=["find"]), toolsets=[toolset])
    result = run(agent.run("find someone"))
    assert "customer" in result.output  # TestModel's generated arguments ran through the runtime


def test_pydantic_ai_refuses_a_coerced_integer_and_the_model_retries(runtime: Runtime) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import RetryPromptPart, ToolCallPart, ToolReturnPart

    from blade_runtime.adapters.pydantic_ai import BladeToolset

    model, seen = _scripted(
        [ToolCallPart("find", {"customer_id": "12"}, tool_call_id="c1")],
        [ToolCallPart("find", {"customer_id": 12}, tool_call_id="c2")],
    )
    agent = Agent(model, toolsets=[BladeToolset(runtime)])
    assert run(agent.run("go")).output == "done"
    (retry,) = seen[1]
    # a retry prompt: pydantic AI 2.6x records it as a tool return with outcome "retried"
    assert isinstance(retry, RetryPromptPart | ToolReturnPart)
    assert getattr(retry, "outcome", "retried") == "retried"
    assert "/customer_id: must be of type integer" in str(retry.content)
    (returned,) = seen[2]
    assert isinstance(returned, ToolReturnPart)
    assert returned.content == {"id": 12, "name": "customer 12"}


def test_pydantic_ai_pending_action_is_a_deferred_call_resumed_by_submit(
    runtime: Runtime, effects: Path
) -> None:
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.messages import ToolCallPart, ToolReturnPart

    from blade_runtime.adapters.pydantic_ai import BladeToolset, ResumeRefused

    model, seen = _scripted([ToolCallPart("transfer", SEND, tool_call_id="t1")])
    toolset = BladeToolset(runtime, principal=ANN)
    agent = Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])
    first = run(agent.run("send"))
    requests = first.output
    assert isinstance(requests, DeferredToolRequests)
    assert requests.kind("t1") == "question"
    meta = requests.metadata["t1"]
    (action,) = runtime.pending(principal=ANN)
    assert meta["action_id"] == action.action_id and meta["payload"] == {"prompt": "Send 5 to bob?"}
    assert meta["resume_schema"]["required"] == ["approved", "approver"]

    with pytest.raises(ResumeRefused, match="must match the pattern") as refused:
        run(toolset.resume(requests, {"t1": {"approved": "yes", "approver": "Ann"}}))
    assert set(refused.value.refused) == {"t1"}
    assert [a.action_id for a in runtime.pending()] == [action.action_id]  # still waiting
    assert not effects.exists()

    results = run(toolset.resume(requests, {"t1": {"approved": True, "approver": "ann"}}))
    assert results.calls == {"t1": {"status": "sent", "by": "ann"}}
    again = run(agent.run(message_history=first.all_messages(), deferred_tool_results=results))
    assert again.output == "done"
    (returned,) = seen[-1]
    assert isinstance(returned, ToolReturnPart)
    assert returned.content == {"status": "sent", "by": "ann"}
    with pytest.raises(ResumeRefused, match="submitted"):
        run(toolset.resume(requests, {"t1": {"approved": True, "approver": "ann"}}))
    assert effects.read_text().count("sent") == 1
