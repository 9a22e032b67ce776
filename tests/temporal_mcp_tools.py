"""The registrations an MCP server on Temporal lists in tests/runtime/temporal: process_worker's
test tools, as the worker processes (tests/temporal_worker.py) run them.

    blade-runtime mcp temporal_mcp_tools:make_runtime --temporal HOST:PORT --task-queue Q
"""

from __future__ import annotations

import os
from pathlib import Path

from process_worker import Tools

from blade_runtime import FolderFiles, Runtime
from blade_runtime.temporal import ActivityStore


def make_runtime(files: Path | None = None) -> Runtime:
    """The workers' registrations (a server only lists them: their implementations run on the
    workers, which record their entries in ``$BLADE_ENTRIES``); ``files``: the folder the
    workers save files in, for the server to read them."""
    runtime = Runtime(store=ActivityStore(), files=None if files is None else FolderFiles(files))
    Tools(os.environ.get("BLADE_ENTRIES", os.devnull)).register(runtime)
    return runtime
