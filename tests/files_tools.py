"""The test tools of tests/test_files_triggers.py (and its worker processes): a tool that saves a
file, one that reads one, one that triggers and reports progress, and one that calls that one as
its child.

``build(root)`` builds their specs into the importable package ``blade_files_tests``;
``register(runtime)`` registers the implementations. ``save(url, out)`` and
``deliver(url, out, stop)`` are worker processes' work: save a file as alice, and deliver
triggers from the store to a handler that appends a line to ``out``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from blade_runtime import FileRejected, Runtime, UnknownFile
from blade_runtime.core.triggers import Trigger

PACKAGE = "blade_files_tests"

_TEXT = {"type": "string"}
SPECS: dict[str, dict[str, Any]] = {
    "export-report": {
        "id": "files.export-report.v1",
        "name": "export_report",
        "description": "Saves a CSV report of ``rows`` rows as a file; returns its id.",
        "sideEffect": "idempotent",
        "inputSchema": {
            "type": "object",
            "properties": {
                "rows": {"type": "integer", "minimum": 0},
                "name": _TEXT,
                "media_type": _TEXT,
                "tenant": _TEXT,  # a hostile input: the file's tenant never comes from here
            },
            "required": ["rows"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {
                "file_id": _TEXT,
                "size": {"type": "integer"},
                "refused": _TEXT,
            },
        },
    },
    "read-report": {
        "id": "files.read-report.v1",
        "name": "read_report",
        "description": "Reads a saved file by id: its text, or that it is unknown.",
        "sideEffect": "pure",
        "inputSchema": {
            "type": "object",
            "properties": {"file_id": _TEXT},
            "required": ["file_id"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {"text": _TEXT, "unknown": _TEXT, "media_type": _TEXT},
        },
    },
    "notify-later": {
        "id": "files.notify-later.v1",
        "name": "notify_later",
        "description": "Asks the application to continue the thread when a job is done.",
        "sideEffect": "idempotent",
        "inputSchema": {
            "type": "object",
            "properties": {"job": _TEXT, "steps": {"type": "integer", "minimum": 0}},
            "required": ["job"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {"trigger_id": _TEXT},
            "required": ["trigger_id"],
        },
    },
    "notify-batch": {
        "id": "files.notify-batch.v1",
        "name": "notify_batch",
        "description": "Reports its own progress, then runs notify_later as its child.",
        "sideEffect": "idempotent",
        "children": ["files.notify-later.v1"],
        "inputSchema": {
            "type": "object",
            "properties": {"job": _TEXT, "steps": {"type": "integer", "minimum": 0}},
            "required": ["job"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {"trigger_id": _TEXT},
            "required": ["trigger_id"],
        },
    },
}


def build(root: Path) -> Path:
    """The specs built into ``PACKAGE`` under ``root``, importable from here on."""
    from blade_codegen.build import build as build_specs

    for slug, spec in SPECS.items():
        path = root / "specs" / "files" / f"{slug}.v1.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(spec), "utf-8")
    build_specs(root / "specs", root / "out", PACKAGE)
    out = root / "out"
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return out


def csv(rows: int) -> str:
    return "n,square\n" + "".join(f"{n},{n * n}\n" for n in range(rows))


def register(runtime: Runtime) -> None:
    import importlib

    def module(name: str) -> Any:
        return importlib.import_module(f"{PACKAGE}.files.{name}_v1")

    export, read, notify = module("export_report"), module("read_report"), module("notify_later")
    batch = module("notify_batch")

    async def export_report(ctx: Any) -> Any:
        given = ctx.input.model_dump(exclude_unset=True)  # unset fields are MISSING, not None
        try:
            saved = await ctx.files.save(
                given.get("name", "report.csv"),
                csv(given["rows"]),
                given.get("media_type", "text/csv"),
            )
        except FileRejected as refused:
            return export.ExportReportOutput(refused=str(refused))
        return export.ExportReportOutput(file_id=saved.file_id, size=saved.size)

    async def read_report(ctx: Any) -> Any:
        try:
            body = await ctx.files.read(ctx.input.file_id)
        except UnknownFile as unknown:
            return read.ReadReportOutput(unknown=str(unknown))
        return read.ReadReportOutput(text=body.content.decode(), media_type=body.file.media_type)

    async def notify_later(ctx: Any) -> Any:
        given = ctx.input.model_dump(exclude_unset=True)
        steps = given.get("steps", 0)
        for step in range(1, steps + 1):
            ctx.progress(f"step {step}", completed=step, total=steps)
        if steps:
            ctx.message({"note": "almost there"})
        trigger_id = await ctx.trigger({"notification": "job done", "job": given["job"]})
        return notify.NotifyLaterOutput(trigger_id=trigger_id)

    async def notify_batch(ctx: Any) -> Any:
        given = ctx.input.model_dump(exclude_unset=True)
        ctx.progress("batch", completed=1, total=2)
        done = await ctx.tools.call(notify.SPEC, notify.NotifyLaterInput(**given))
        return batch.NotifyBatchOutput(trigger_id=done.trigger_id)

    runtime.register(export.SPEC, export_report)
    runtime.register(read.SPEC, read_report)
    runtime.register(notify.SPEC, notify_later)
    runtime.register(batch.SPEC, notify_batch)


def save(url: str, out: str) -> None:
    """A worker process: alice's call saves a report; its file id is written to ``out``."""
    from blade_runtime import CallContext, Principal
    from blade_runtime.stores.urls import open_store

    store = open_store(url)

    async def main() -> None:
        runtime = Runtime(store=store)
        register(runtime)
        context = CallContext(principal=Principal("alice", "acme"), thread_id="thread-w")
        result = await runtime.call("export_report", {"rows": 7}, context=context)
        Path(out).write_text(json.dumps(result.content), "utf-8")
        await runtime.close()

    try:
        asyncio.run(main())
    finally:
        store.close()


def deliver(url: str, out: str, stop: str) -> None:
    """A worker process: deliver triggers (each one appends ``TRIGGER_ID PID``) until the stop
    file exists."""
    from blade_runtime.stores.urls import open_store

    store = open_store(url)

    def handled(trigger: Trigger) -> None:
        fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{trigger.trigger_id} {os.getpid()}\n".encode())
        finally:
            os.close(fd)

    async def main() -> None:
        runtime = Runtime(store=store, on_trigger=handled)
        deadline = time.monotonic() + 60
        while not os.path.exists(stop) and time.monotonic() < deadline:
            await runtime.deliver_triggers(limit=3)
            await asyncio.sleep(0.01)
        await runtime.close()

    try:
        asyncio.run(main())
    finally:
        store.close()
