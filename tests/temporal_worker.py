"""A Temporal worker process for tests/runtime/temporal (started by temporal_support.Workers).

    python tests/temporal_worker.py CONFIG_JSON

It registers process_worker's test tools on a Runtime over an ActivityStore, connects to the dev
server, writes its ready file once it polls, and runs until killed. Every entry of a tool is a
line of the shared entries file (``CALL_ID ENTRY TOOL PID``); ``hang`` tools block after it.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path

from process_worker import Tools
from temporal_support import config_of
from temporalio.client import Client

from blade_runtime import Runtime
from blade_runtime.temporal import ActivityStore, worker


async def main() -> None:
    config = config_of(sys.argv)
    runtime = Runtime(store=ActivityStore())
    Tools(config["entries"], hang=config["hang"]).register(runtime)
    client = await Client.connect(config["address"])
    # A killed worker's cached workflows move to the others after this, not Temporal's 10 s.
    sticky = timedelta(seconds=1)
    async with worker(
        client,
        runtime,
        task_queue=config["task_queue"],
        sticky_queue_schedule_to_start_timeout=sticky,
    ):
        Path(config["ready"]).write_text("ready")
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
