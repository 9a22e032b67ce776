"""A Temporal worker process for tests/runtime/temporal (started by temporal_support.Workers).

    python tests/temporal_worker.py CONFIG_JSON

It registers process_worker's test tools on a Runtime over an ActivityStore, connects to the dev
server, writes its ready file once it polls, and runs until killed. Every entry of a tool is a
line of the shared entries file (``CALL_ID ENTRY TOOL PID``); ``hang`` tools block after it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from process_worker import Tools
from temporal_support import config_of
from temporalio.client import Client

from blade_runtime import FolderFiles, Runtime
from blade_runtime.temporal import ActivityStore, TemporalTools, worker


async def main() -> None:
    config = config_of(sys.argv)
    # files in a folder the workers share (and a server reading them) when the test names one
    files = FolderFiles(config["files"]) if config.get("files") else None
    runtime = Runtime(store=ActivityStore(), files=files)
    Tools(config["entries"], hang=config["hang"]).register(runtime)
    client = await Client.connect(config["address"])
    # A killed worker's cached workflows move to the others after this, not Temporal's 10 s.
    async with worker(client, runtime, task_queue=config["task_queue"], sticky_timeout_s=1.0):
        Path(config["ready"]).write_text("ready")
        if config.get("go"):
            await _submit_all(client, config)
        await asyncio.Event().wait()


async def _submit_all(client: Client, config: dict[str, Any]) -> None:
    """Once the go file exists: submit every action of the actions file at once (a JSON list),
    each answer one JSON line of this worker's out file."""
    go = Path(config["go"])
    while not go.exists():
        await asyncio.sleep(0.01)
    actions = json.loads(Path(config["actions"]).read_text())
    tools = TemporalTools(client, task_queue=config["task_queue"])  # by id: the server's index
    answers = await asyncio.gather(
        *(tools.submit(a, {"approved": True, "note": f"pid {os.getpid()}"}) for a in actions)
    )
    lines = "".join(
        json.dumps({"action_id": a, **answer}) + "\n"
        for a, answer in zip(actions, answers, strict=True)
    )
    out = Path(config["out"])
    partial = out.with_name(out.name + ".partial")
    partial.write_text(lines)
    partial.replace(out)  # whole when it appears: the test reads it as soon as it exists


if __name__ == "__main__":
    asyncio.run(main())
