"""Adapters to Pydantic AI, the OpenAI Agents SDK and LangChain/LangGraph: no network."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from blade_runtime.core.caller import Principal
from blade_runtime.runtime import Runtime

TESTS = Path(__file__).resolve().parents[2]  # the tests folder: its helper modules
sys.path.insert(0, str(TESTS))
import agent_tools  # noqa: E402

ANN = Principal("ann", "acme")
SEND = {"to": "bob", "amount": 5}


run = agent_tools.run


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agent_tools.built_package(tmp_path_factory)


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


def test_pydantic_ai_hands_the_tools_guidance_to_the_model_as_instructions(
    runtime: Runtime,
) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.function import FunctionModel

    from blade_runtime.adapters.pydantic_ai import BladeToolset

    sent: list[str | None] = []

    def model(messages: list[Any], info: Any) -> Any:
        sent.append(messages[-1].instructions)
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), toolsets=[BladeToolset(runtime, principal=ANN)])
    run(agent.run("Who is c1?"))
    assert sent == [agent_tools.GUIDANCE]


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


def test_pydantic_ai_definitions_follow_another_tool_registered_under_the_same_name(
    runtime: Runtime,
) -> None:
    """The definitions are kept while the registrations stay as they are: another spec under a
    name the toolset listed is listed with its own schema."""
    from blade_agent_specs.bank import transfer_v1

    from blade_runtime.adapters.pydantic_ai import BladeToolset

    toolset = BladeToolset(runtime)
    assert toolset.definitions()["find"].parameters_json_schema == agent_tools.LOOKUP["inputSchema"]
    runtime.unregister("find")
    runtime.register(transfer_v1.SPEC, agent_tools.transfer, name="find")
    found = toolset.definitions()["find"].parameters_json_schema
    assert found == agent_tools.TRANSFER["inputSchema"]


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


# -- OpenAI Agents SDK ----------------------------------------------------------------------


@pytest.fixture
def agents_sdk() -> Any:
    import agents

    agents.set_tracing_disabled(True)
    return agents


def test_openai_schemas_pass_through_and_strict_only_when_compatible(
    runtime: Runtime, agents_sdk: Any
) -> None:
    from blade_runtime.adapters.openai_agents import function_tools, strict_compatible

    tools = {tool.name: tool for tool in function_tools(runtime, approve=("write", "execute"))}
    assert tools["find"].params_json_schema == agent_tools.LOOKUP["inputSchema"]
    assert tools["transfer"].params_json_schema == agent_tools.TRANSFER["inputSchema"]
    assert tools["find"].strict_json_schema is False  # an optional field: strict would require it
    assert tools["plan"].strict_json_schema is False  # additionalProperties left open
    assert tools["transfer"].strict_json_schema is True  # already strict: passed unchanged
    assert list(tools["transfer"].params_json_schema["required"]) == ["to", "amount"]
    assert [tools[n].needs_approval for n in ("find", "plan", "transfer")] == [False, True, True]
    assert not strict_compatible({"type": "object", "properties": {"a": {"type": "string"}}})


def test_openai_run_stops_on_a_pending_action_and_resumes_through_submit(
    runtime: Runtime, agents_sdk: Any, effects: Path
) -> None:
    from agents import Agent, Runner
    from agents.testing.model import ScriptedModel, assistant_message, function_call

    from blade_runtime.adapters.openai_agents import (
        PendingCalls,
        ResumeRefused,
        function_tools,
        resume,
        stop_on_pending,
    )

    model = ScriptedModel(
        [
            [function_call("find", {"customer_id": "12"}, call_id="c1")],
            [function_call("transfer", SEND, call_id="c2")],
            [assistant_message("done")],
        ]
    )
    tools = function_tools(runtime, principal=ANN)
    agent = Agent(name="bank", model=model, tools=tools, tool_use_behavior=stop_on_pending)
    result = run(Runner.run(agent, "send"))
    assert '"INVALID_INPUT"' in model.calls[1].input[-1]["output"]  # the schema refused "12"
    waiting = result.final_output
    assert isinstance(waiting, PendingCalls)
    (call,) = waiting.calls
    assert call.tool_call_id == "c2" and call.name == "transfer.confirm"
    assert [a.action_id for a in runtime.pending(principal=ANN)] == [call.action_id]

    with pytest.raises(ResumeRefused, match="must match the pattern"):
        run(resume(runtime, result, {"c2": {"approved": True, "approver": "Ann"}}))
    assert len(runtime.pending()) == 1 and not effects.exists()
    following = run(resume(runtime, result, {"c2": {"approved": True, "approver": "ann"}}))
    assert following[-1]["output"] == '{"status":"sent","by":"ann"}'
    final = run(Runner.run(agent, following))
    assert final.final_output == "done"
    assert model.calls[-1].input[-1]["output"] == '{"status":"sent","by":"ann"}'
    assert effects.read_text().count("sent") == 1


def test_openai_approval_for_execute_kinds(runtime: Runtime, agents_sdk: Any) -> None:
    from agents import Agent, Runner
    from agents.testing.model import ScriptedModel, assistant_message, function_call

    from blade_runtime.adapters.openai_agents import (
        PendingCalls,
        function_tools,
        pending_calls,
        stop_on_pending,
    )

    def agent_for(model: Any) -> Any:
        tools = function_tools(runtime, approve=("execute",))
        return Agent(name="ops", model=model, tools=tools, tool_use_behavior=stop_on_pending)

    model = ScriptedModel([[function_call("plan", {"goal": "ship"}, call_id="p1")]])
    agent = agent_for(model)
    asked = run(Runner.run(agent, "plan it"))
    (approval,) = asked.interruptions
    assert runtime.pending() == []  # nothing ran before the approval
    state = asked.to_state()
    state.approve(approval)
    approved = run(Runner.run(agent, state))
    assert isinstance(approved.final_output, PendingCalls)
    waiting = pending_calls(approved)
    assert waiting is not None and waiting.calls[0].name == "plan.review"

    model = ScriptedModel(
        [[function_call("plan", {"goal": "no"}, call_id="p2")], [assistant_message("ok")]]
    )
    agent = agent_for(model)
    asked = run(Runner.run(agent, "plan it"))
    state = asked.to_state()
    state.reject(asked.interruptions[0])
    rejected = run(Runner.run(agent, state))
    assert rejected.final_output == "ok"
    assert len(runtime.pending()) == 1  # the rejected call never reached the runtime


# -- LangChain / LangGraph ------------------------------------------------------------------


def _ai(*calls: tuple[str, dict[str, Any], str]) -> Any:
    from langchain_core.messages import AIMessage

    if not calls:
        return AIMessage(content="done")
    return AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": i} for n, a, i in calls])


def test_langchain_tools_carry_the_spec_schema(runtime: Runtime) -> None:
    from blade_runtime.adapters.langgraph import structured_tools

    tools = {tool.name: tool for tool in structured_tools(runtime)}
    assert tools["find"].args_schema == agent_tools.LOOKUP["inputSchema"]
    from langchain_core.utils.function_calling import convert_to_openai_tool

    bound = convert_to_openai_tool(tools["transfer"])  # what a chat model's bind_tools sends
    assert bound["function"]["parameters"] == agent_tools.TRANSFER["inputSchema"]


def test_langgraph_interrupt_keyed_by_tool_call_never_reruns_the_implementation(
    runtime: Runtime, effects: Path
) -> None:
    from langchain_core.messages import ToolMessage
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    from blade_runtime.adapters.langgraph import resume_model

    agent_tools.ENTRIES.clear()
    replies = [
        _ai(("find", {"customer_id": "1"}, "t0")),  # refused by the schema: "1" is a string
        _ai(("find", {"customer_id": 1}, "t1"), ("transfer", SEND, "t2")),  # one node, two calls
        _ai(),
    ]
    graph = agent_tools.build_graph(runtime, InMemorySaver(), replies)
    config: Any = {"configurable": {"thread_id": "thread-1"}}
    first = run(graph.ainvoke({"messages": [("user", "send")]}, config))
    refused = [m for m in first["messages"] if isinstance(m, ToolMessage)]
    assert refused[0].status == "error" and '"INVALID_INPUT"' in refused[0].content
    (waiting,) = first["__interrupt__"]
    assert waiting.value["tool_call_id"] == "t2"
    assert waiting.value["payload"] == {"prompt": "Send 5 to bob?"}
    assert waiting.response_schema == agent_tools.TRANSFER["suspend"]["confirm"]["resumeSchema"]
    model = resume_model(runtime, waiting.value)
    assert model is not None and model.__name__ == "TransferConfirmResume"
    assert runtime.store.call("lg/thread-1/t2") is not None  # keyed by thread and tool call

    # an invalid answer: refused by the runtime, asked again, still pending
    again = run(graph.ainvoke(Command(resume={"approved": True, "approver": "Ann"}), config))
    (asked,) = again["__interrupt__"]
    assert "must match the pattern" in asked.value["refused"]
    assert [a.action_id for a in runtime.pending()] == [waiting.value["action_id"]]

    done = run(graph.ainvoke(Command(resume=model(approved=True, approver="ann")), config))
    tool_messages = [m for m in done["messages"] if isinstance(m, ToolMessage)]
    assert [m.content for m in tool_messages[1:]] == [
        '{"id":1,"name":"customer 1"}',
        '{"status":"sent","by":"ann"}',
    ]
    # the node ran three times (first, refused answer, answer); each implementation ran once
    # per entry: find once, transfer's initial entry once and its resume once
    assert agent_tools.ENTRIES == ["find:initial", "transfer:initial", "transfer:resume"]
    assert effects.read_text().count("sent") == 1


def test_two_processes_resuming_one_interrupt_run_the_side_effect_once(
    built: Path, tmp_path: Path
) -> None:
    import multiprocessing

    from langgraph.checkpoint.memory import InMemorySaver

    from blade_runtime.stores.sqlite import SQLiteStore

    db, effects = tmp_path / "blade.db", tmp_path / "effects"
    store = SQLiteStore(db)
    runtime = agent_tools.make_runtime(store)
    saver = InMemorySaver()
    graph = agent_tools.build_graph(runtime, saver, [_ai(("transfer", SEND, "t1"))])
    first = run(
        graph.ainvoke({"messages": [("user", "send")]}, {"configurable": {"thread_id": "t"}})
    )
    assert first["__interrupt__"]
    run(runtime.close())
    store.close()
    state = agent_tools.saver_state(saver)  # the checkpoint both processes resume from

    context = multiprocessing.get_context("spawn")
    barrier, out = context.Barrier(2), context.Queue()
    answer = {"approved": True, "approver": "ann"}
    workers = [
        context.Process(
            target=agent_tools.resume_graph_worker,
            args=(str(db), str(effects), state, answer, barrier, out),
        )
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    results = [out.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0
    # both resumed the interrupt and read the same result; the implementation was re-entered
    # by exactly one of them, and the side effect ran once
    assert [r[1] for r in results] == [['{"status":"sent","by":"ann"}']] * 2
    assert sorted(len(r[2]) for r in results) == [0, 1]
    assert effects.read_text().count("sent 5 to bob") == 1


def test_pydantic_ai_tools_are_the_callers_own(runtime: Runtime) -> None:
    from blade_agent_specs.crm import find_v1
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    from blade_runtime.adapters.pydantic_ai import BladeToolset
    from blade_runtime.core.caller import CallContext
    from blade_runtime.core.context import CallInfo

    def acme_only(call: CallInfo) -> bool:
        return call.context is not None and call.context.tenant == "acme"

    runtime.register(find_v1.SPEC, agent_tools.find, name="find_acme", enabled=acme_only)
    toolset = BladeToolset(runtime, principal=ANN)
    assert "find_acme" in toolset.definitions(CallContext(principal=ANN))
    assert "find_acme" not in toolset.definitions(CallContext(principal=Principal("b", "o")))
    agent = Agent(TestModel(call_tools=["find_acme"]), toolsets=[toolset])
    assert "customer" in run(agent.run("find")).output  # listed and callable for ann


def test_langgraph_a_call_under_the_same_thread_and_tool_call_id_is_its_callers_alone(
    runtime: Runtime, effects: Path
) -> None:
    """Thread ids and tool call ids are the graph's, not credentials: another tenant's graph
    using the ones of Ann's waiting call neither sees her interrupt nor resumes her call."""
    from langchain_core.messages import ToolMessage
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    config: Any = {"configurable": {"thread_id": "thread-1"}}
    anns = agent_tools.build_graph(
        runtime, InMemorySaver(), [_ai(("transfer", SEND, "t1")), _ai()], principal=ANN
    )
    waiting = run(anns.ainvoke({"messages": [("user", "send")]}, config))
    assert waiting["__interrupt__"]
    bob = Principal("bob", "globex")
    bobs = agent_tools.build_graph(
        runtime, InMemorySaver(), [_ai(("transfer", SEND, "t1")), _ai()], principal=bob
    )
    answered = run(bobs.ainvoke({"messages": [("user", "send")]}, config))
    assert "__interrupt__" not in answered  # Ann's question is not shown to Bob
    (refused,) = [m for m in answered["messages"] if isinstance(m, ToolMessage)]
    assert refused.status == "error" and '"DUPLICATE_CALL"' in refused.content
    assert "Send 5" not in json.dumps([m.content for m in answered["messages"]])
    with contextlib.suppress(Exception):  # whatever Bob's graph does with a resume
        run(bobs.ainvoke(Command(resume={"approved": True, "approver": "bob"}), config))
    (action,) = runtime.pending(principal=ANN)  # still Ann's, still waiting
    assert action.state == "pending" and not effects.exists()


def test_pydantic_ai_resume_refuses_another_principals_action(
    runtime: Runtime, effects: Path
) -> None:
    """Deferred-call metadata comes back in the client's message history: naming another
    principal's action in it resumes nothing."""
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.messages import ToolCallPart

    from blade_runtime.adapters.pydantic_ai import BladeToolset, ResumeRefused

    model, _ = _scripted([ToolCallPart("transfer", SEND, tool_call_id="t1")])
    anns = BladeToolset(runtime, principal=ANN)
    requests = run(Agent(model, toolsets=[anns], output_type=[str, DeferredToolRequests]).run("s"))
    assert isinstance(requests.output, DeferredToolRequests)
    answer = {"t1": {"approved": True, "approver": "bob"}}
    for other in (Principal("bob", "globex"), Principal("carl", "acme")):
        with pytest.raises(ResumeRefused, match="no pending action"):
            run(BladeToolset(runtime, principal=other).resume(requests.output, answer))
    (action,) = runtime.pending(principal=ANN)
    assert action.state == "pending" and not effects.exists()
    done = run(anns.resume(requests.output, {"t1": {"approved": True, "approver": "ann"}}))
    assert done.calls == {"t1": {"status": "sent", "by": "ann"}}


def test_pydantic_ai_resume_by_a_toolset_whose_calls_take_their_principal_from_context(
    runtime: Runtime, effects: Path
) -> None:
    """A toolset with ``context=`` has no fixed principal: ``resume`` is told who answers
    (it refused every resume, its own caller's too, judging by the absent fixed one)."""
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.messages import ToolCallPart

    from blade_runtime.adapters.pydantic_ai import BladeToolset, ResumeRefused
    from blade_runtime.core.caller import CallContext

    model, _ = _scripted([ToolCallPart("transfer", SEND, tool_call_id="t1")])
    toolset = BladeToolset(runtime, context=lambda ctx: CallContext(principal=ctx.deps))
    agent = Agent(
        model, toolsets=[toolset], output_type=[str, DeferredToolRequests], deps_type=Principal
    )
    requests = run(agent.run("send", deps=ANN)).output
    assert isinstance(requests, DeferredToolRequests)
    answer = {"t1": {"approved": True, "approver": "ann"}}
    with pytest.raises(TypeError, match="principal="):
        run(toolset.resume(requests, answer))
    with pytest.raises(ResumeRefused):
        run(toolset.resume(requests, answer, principal=Principal("bob", "globex")))
    done = run(toolset.resume(requests, answer, principal=ANN))
    assert done.calls == {"t1": {"status": "sent", "by": "ann"}}


def _acme_only(runtime: Runtime) -> None:
    """``find_acme``: enabled only for acme's principals, described for the caller."""
    from blade_agent_specs.crm import find_v1

    from blade_runtime.core.caller import CallContext
    from blade_runtime.core.context import CallInfo

    def acme_only(call: CallInfo) -> bool:
        principal = None if call.context is None else call.context.principal
        return principal is not None and principal.tenant == "acme"

    def described(context: CallContext | None) -> str:
        principal = None if context is None else context.principal
        return f"Find a customer of {principal.tenant if principal else 'nobody'}."

    runtime.register(
        find_v1.SPEC, agent_tools.find, name="find_acme", enabled=acme_only, describe=described
    )


def test_openai_function_tools_are_the_principals_own(runtime: Runtime, agents_sdk: Any) -> None:
    """Issue 29.9: the tool list is exported for the principal's context: a tool enabled only
    for it is there, described for it; for another principal it is not there."""
    from agents import Agent, Runner
    from agents.testing.model import ScriptedModel, assistant_message, function_call

    from blade_runtime.adapters.openai_agents import function_tools

    _acme_only(runtime)
    tools = {tool.name: tool for tool in function_tools(runtime, principal=ANN)}
    assert tools["find_acme"].description == "Find a customer of acme."
    others = {tool.name for tool in function_tools(runtime, principal=Principal("b", "globex"))}
    assert "find_acme" not in others and "find" in others
    model = ScriptedModel(
        [
            [function_call("find_acme", {"customer_id": 3}, call_id="c1")],
            [assistant_message("done")],
        ]
    )
    agent = Agent(name="crm", model=model, tools=list(tools.values()))
    assert run(Runner.run(agent, "find")).final_output == "done"
    assert model.calls[-1].input[-1]["output"] == '{"id":3,"name":"customer 3"}'


def test_langgraph_structured_tools_are_the_principals_own(runtime: Runtime) -> None:
    from blade_runtime.adapters.langgraph import structured_tools

    _acme_only(runtime)
    tools = {tool.name: tool for tool in structured_tools(runtime, principal=ANN)}
    assert tools["find_acme"].description == "Find a customer of acme."
    others = {tool.name for tool in structured_tools(runtime, principal=Principal("b", "globex"))}
    assert "find_acme" not in others and "find" in others
    call = {"name": "find_acme", "args": {"customer_id": 4}, "id": "t1", "type": "tool_call"}
    answer = run(tools["find_acme"].ainvoke(call, {"configurable": {"thread_id": "th"}}))
    assert answer.content == '{"id":4,"name":"customer 4"}'


def test_openai_a_client_tool_is_a_function_tool_that_waits_for_the_clients_output(
    runtime: Runtime, agents_sdk: Any
) -> None:
    """A client tool is exported (not left out): its call waits for the client's output, the
    run stops on it with stop_on_pending, and resume submits the output, validated first."""
    from agents import Agent, Runner
    from agents.testing.model import ScriptedModel, assistant_message, function_call
    from blade_agent_specs.device import scan_v1

    from blade_runtime.adapters.openai_agents import (
        PendingCalls,
        ResumeRefused,
        function_tools,
        resume,
        stop_on_pending,
    )

    runtime.register_client(scan_v1.SPEC)
    tools = {tool.name: tool for tool in function_tools(runtime, principal=ANN)}
    assert tools["scan"].params_json_schema == agent_tools.SCAN["inputSchema"]
    model = ScriptedModel(
        [[function_call("scan", {"hint": "box"}, call_id="c1")], [assistant_message("done")]]
    )
    agent = Agent(
        name="s", model=model, tools=list(tools.values()), tool_use_behavior=stop_on_pending
    )
    result = run(Runner.run(agent, "scan it"))
    assert isinstance(result.final_output, PendingCalls)
    (waiting,) = result.final_output.calls
    assert waiting.name == "scan" and waiting.payload == {"hint": "box"}
    assert waiting.resume_schema == agent_tools.SCAN["outputSchema"]
    with pytest.raises(ResumeRefused):
        run(resume(runtime, result, {"c1": {"code": 7}}, principal=ANN))
    with pytest.raises(ResumeRefused):  # another tenant's action does not exist for it
        run(resume(runtime, result, {"c1": {"code": "x"}}, principal=Principal("b", "globex")))
    following = run(resume(runtime, result, {"c1": {"code": "4006381333931"}}, principal=ANN))
    assert following[-1]["output"] == '{"code":"4006381333931"}'
    assert run(Runner.run(agent, following)).final_output == "done"


def test_pydantic_ai_instrumented_tool_span_holds_the_runtimes_span(runtime: Runtime) -> None:
    """Pydantic AI's own OpenTelemetry instrumentation and blade_runtime.otel on one tracer
    provider: the call's execute_tool span nests under the framework's tool span."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from pydantic_ai import Agent, InstrumentationSettings
    from pydantic_ai.capabilities import Instrumentation
    from pydantic_ai.models.test import TestModel

    from blade_runtime.adapters.pydantic_ai import BladeToolset
    from blade_runtime.otel import Telemetry

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    runtime.observe(Telemetry(tracer_provider=provider))
    agent = Agent(
        TestModel(call_tools=["find"]),
        toolsets=[BladeToolset(runtime)],
        capabilities=[Instrumentation(InstrumentationSettings(tracer_provider=provider))],
    )
    run(agent.run("find someone"))
    finished = spans.get_finished_spans()
    by_id = {s.context.span_id: s for s in finished}
    [ours] = [s for s in finished if s.attributes and s.attributes.get("blade.spec_id")]
    assert ours.parent is not None
    framework = by_id[ours.parent.span_id]
    # Pydantic AI's tool span (the conventions name both alike), and not one of ours.
    assert framework.name == "execute_tool find" and framework.attributes is not None
    assert "blade.spec_id" not in framework.attributes
    assert framework.context.trace_id == ours.context.trace_id


# -- the executing agent (seed 002: ctx.agentId) ----------------------------------------------


def _origin(runtime: Runtime) -> tuple[str | None, str | None]:
    """The one pending action's origin: its call's agent and thread."""
    (action,) = runtime.pending(principal=ANN)
    return action.origin.agent_id, action.origin.thread_id


def test_pydantic_ai_names_the_running_agent_and_its_conversation_on_every_call(
    built: Path,
) -> None:
    """The agent's own name, unless the toolset is given ``agent_id``; the thread is the run's
    conversation id. Stored with the call and on its pending action's origin."""
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.messages import ToolCallPart

    from blade_runtime.adapters.pydantic_ai import BladeToolset

    for given, expected in ((None, "teller"), ("payments-desk", "payments-desk")):
        runtime = agent_tools.make_runtime()
        model, _ = _scripted([ToolCallPart("transfer", SEND, tool_call_id="t1")])
        toolset = BladeToolset(runtime, principal=ANN, agent_id=given)
        agent = Agent(
            model, name="teller", toolsets=[toolset], output_type=[str, DeferredToolRequests]
        )
        run(agent.run("send", conversation_id="conv-7"))
        assert _origin(runtime) == (expected, "conv-7")
        (action,) = runtime.pending(principal=ANN)
        stored = runtime.store.call(action.origin.call_id)
        assert stored is not None and isinstance(stored.context, dict)
        assert (stored.context["agent_id"], stored.context["thread_id"]) == (expected, "conv-7")


def test_openai_names_the_running_agent_and_the_runs_group_on_every_call(
    built: Path, agents_sdk: Any
) -> None:
    from agents import Agent, RunConfig, Runner
    from agents.testing.model import ScriptedModel, assistant_message, function_call

    from blade_runtime.adapters.openai_agents import function_tools, stop_on_pending

    for given, expected in ((None, "bank"), ("payments-desk", "payments-desk")):
        runtime = agent_tools.make_runtime()
        model = ScriptedModel(
            [[function_call("transfer", SEND, call_id="c2")], [assistant_message("done")]]
        )
        tools = function_tools(runtime, principal=ANN, agent_id=given)
        agent = Agent(name="bank", model=model, tools=tools, tool_use_behavior=stop_on_pending)
        run(Runner.run(agent, "send", run_config=RunConfig(group_id="chat-9")))
        assert _origin(runtime) == (expected, "chat-9")


def test_langgraph_names_the_agent_from_its_metadata_and_the_graphs_thread(
    built: Path,
) -> None:
    """``lc_agent_name`` (what LangChain's create_agent sets) names the agent unless the tools
    were given ``agent_id``; the thread is the graph's ``thread_id``."""
    from langgraph.checkpoint.memory import InMemorySaver

    for given, expected in ((None, "teller"), ("payments-desk", "payments-desk")):
        runtime = agent_tools.make_runtime()
        graph = agent_tools.build_graph(
            runtime, InMemorySaver(), [_ai(("transfer", SEND, "t2")), _ai()], ANN, given
        )
        config: Any = {
            "configurable": {"thread_id": "thread-3"},
            "metadata": {"lc_agent_name": "teller"},
        }
        first = run(graph.ainvoke({"messages": [("user", "send")]}, config))
        assert first["__interrupt__"]
        assert _origin(runtime) == (expected, "thread-3")


def test_an_adapters_context_function_names_the_agent_before_the_framework_does(
    runtime: Runtime,
) -> None:
    """What the application's ``context=`` gives wins over the framework's agent name."""
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.messages import ToolCallPart

    from blade_runtime.adapters.pydantic_ai import BladeToolset
    from blade_runtime.core.caller import CallContext

    model, _ = _scripted([ToolCallPart("transfer", SEND, tool_call_id="t1")])
    toolset = BladeToolset(
        runtime,
        context=lambda ctx: CallContext(ANN, agent_id="router/billing", thread_id="th-1"),
    )
    agent = Agent(model, name="teller", toolsets=[toolset], output_type=[str, DeferredToolRequests])
    run(agent.run("send", conversation_id="conv-7"))
    assert _origin(runtime) == ("router/billing", "th-1")
