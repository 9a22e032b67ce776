"""Blade tools used by agents that run in Temporal workflows through the frameworks' own
Temporal integrations, without an LLM (their function and test models)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from temporal_support import DevServer
from temporalio.client import Client
from temporalio.worker import Worker

from blade_runtime.temporal import sandbox


def test_a_pydantic_ai_agent_in_a_workflow_calls_blade_tools(
    temporal_package: Path, temporal_server: DevServer, tmp_path: Path
) -> None:
    import temporal_pydantic_ai as example
    from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin

    entries = tmp_path / "entries"
    agent = example.AGENT = example.agent(example.runtime(str(entries)))
    queue = f"agents-{uuid.uuid4().hex[:8]}"

    async def main() -> str:
        client = await Client.connect(temporal_server.address, plugins=[PydanticAIPlugin()])
        restrictions = sandbox().restrictions.with_passthrough_modules("temporal_pydantic_ai")
        async with Worker(
            client,
            task_queue=queue,
            workflows=[example.FetchingAgent],
            plugins=[AgentPlugin(agent)],
            workflow_runner=type(sandbox())(restrictions=restrictions),
        ):
            answer: str = await client.execute_workflow(
                example.FetchingAgent.run,
                "fetch 7",
                id=f"agent-{uuid.uuid4().hex}",
                task_queue=queue,
            )
            return answer

    answer = asyncio.run(main())
    # the first call's "7" (a string) was refused by the schema, the second ran; the tool ran once
    assert answer == 'fetched {"n": 7, "entry": "initial", "note": "ok"}'
    refused, output = example.SEEN
    assert isinstance(refused, str) and "at /n: must be of type integer" in refused
    assert output == {"n": 7, "entry": "initial", "note": "ok"}
    assert [line.split()[1:3] for line in entries.read_text().splitlines()] == [
        ["initial", "fetch"]
    ]
