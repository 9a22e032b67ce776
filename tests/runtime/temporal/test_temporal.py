"""Tools on Temporal, against a real dev server: activities running the runtime's pipeline, the
side effect as retry policy, pending actions held by workflows and answered with updates."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from process_worker import Tools
from temporal_support import DevServer, Workers
from temporalio.client import Client

from blade_runtime import Runtime
from blade_runtime.temporal import ActivityStore, TemporalTools, worker

HEARTBEAT_S = 1.5  # a killed worker is taken for dead this long after its last heartbeat


def run(coroutine: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coroutine

    return asyncio.run(main())


@dataclass
class Place:
    server: DevServer
    package: Path
    folder: Path
    task_queue: str

    @property
    def entries_file(self) -> Path:
        return self.folder / "entries"

    def entries(self) -> list[list[str]]:
        if not self.entries_file.exists():
            return []
        return [line.split() for line in self.entries_file.read_text().splitlines()]

    def runtime(self) -> Runtime:
        runtime = Runtime(store=ActivityStore())
        Tools(self.entries_file).register(runtime)
        return runtime

    async def tools(self, runtime: Runtime | None = None) -> tuple[Client, TemporalTools]:
        client = await Client.connect(self.server.address)
        tools = TemporalTools(
            client,
            task_queue=self.task_queue,
            runtime=runtime or self.runtime(),
            heartbeat_s=HEARTBEAT_S,
        )
        return client, tools

    def workers(self) -> Workers:
        return Workers(self.server.address, self.task_queue, self.folder, self.package)


@pytest.fixture
def place(temporal_package: Path, temporal_server: DevServer, tmp_path: Path) -> Place:
    return Place(temporal_server, temporal_package, tmp_path, f"q-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def workers(place: Place) -> Iterator[Workers]:
    started = place.workers()
    try:
        yield started
    finally:
        started.kill_all()


def test_a_call_runs_the_runtime_pipeline_as_an_activity(place: Place) -> None:
    async def main() -> None:
        runtime = place.runtime()
        client, tools = await place.tools(runtime)
        async with worker(client, runtime, task_queue=place.task_queue):
            done = await tools.call("fetch", {"n": 3})
            assert done["status"] == "success"
            assert done["content"] == {"n": 3, "entry": "initial", "note": "ok"}
            invalid = await tools.call("fetch", {"n": "three"})
            assert invalid["status"] == "error" and invalid["code"] == "INVALID_INPUT"
            assert "n" in invalid["message"]
        assert [e[1:3] for e in place.entries()] == [["initial", "fetch"]]  # the invalid never ran

    run(main())
