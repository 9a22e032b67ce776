"""Pending-action benchmark on SQLite: durable suspend-submit-resume cycles, durable data writes.

Measured in one run, on a fresh SQLiteStore file (WAL, synchronous=NORMAL):
  - baseline: a bare sqlite3 INSERT of a ~1 KB JSON row and COMMIT, same settings;
  - a full cycle: call (the start is committed before the tool runs) -> the tool suspends (the
    pending action is committed) -> submit (validated, resolved exactly once) -> the tool resumes
    and returns (the result is committed). That is 4 commits; the ratio compares the cycle with 4
    bare commits;
  - durable ToolData writes (each one committed with its event), against one bare commit each.
Targets: a cycle costs at most 3x the bare commits it needs; more than 1,000 cycles per second.

Usage: python bench/pending.py [--cycles N]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from blade_codegen.build import build
from blade_runtime import ResumeEntry, Runtime
from blade_runtime.sqlite import SQLiteStore

SPEC = {
    "id": "bench.approve.v1",
    "name": "approve",
    "description": "Waits for an approval, then reports it.",
    "sideEffect": "idempotent",
    "inputSchema": {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}},
        "required": ["order_id", "amount"],
    },
    "outputSchema": {
        "type": "object",
        "properties": {"approved": {"type": "boolean"}},
        "required": ["approved"],
    },
    "dataSchemas": {
        "progress": {
            "type": "object",
            "properties": {"step": {"type": "string"}, "percent": {"type": "integer"}},
            "required": ["step"],
        }
    },
    "suspend": {
        "review": {
            "suspendSchema": {
                "type": "object",
                "properties": {"prompt": {"type": "string"}},
                "required": ["prompt"],
            },
            "resumeSchema": {
                "type": "object",
                "properties": {"approved": {"type": "boolean"}, "by": {"type": "string"}},
                "required": ["approved", "by"],
            },
        }
    },
}
ROW = json.dumps({"payload": "x" * 1000})


def bare_commit_s(path: Path, count: int) -> float:
    """Seconds per INSERT + COMMIT of a 1 KB row, WAL and synchronous=NORMAL like the store."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
    start = time.perf_counter()
    for _ in range(count):
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t (body) VALUES (?)", (ROW,))
        db.execute("COMMIT")
    elapsed = time.perf_counter() - start
    db.close()
    return elapsed / count


async def cycles_s(module: Any, store: SQLiteStore, count: int) -> float:
    async def approve(ctx: Any) -> Any:
        if isinstance(ctx.entry, ResumeEntry):
            return module.ApproveOutput(approved=ctx.entry.payload.approved)
        ctx.suspend("review", module.ApproveReviewSuspend(prompt=f"Approve {ctx.input.order_id}?"))

    runtime = Runtime(store=store)
    runtime.register(module.SPEC, approve)
    start = time.perf_counter()
    for i in range(count):
        waiting = await runtime.call("approve", {"order_id": f"o{i}", "amount": i})
        done = await runtime.submit(waiting.action.action_id, {"approved": True, "by": "ann"})  # type: ignore[union-attr]
        assert done.status == "success", done
    return (time.perf_counter() - start) / count


async def data_writes_s(module: Any, store: SQLiteStore, count: int) -> float:
    elapsed = 0.0

    async def writer(ctx: Any) -> Any:
        nonlocal elapsed
        start = time.perf_counter()
        for i in range(count):
            await ctx.data.write("progress", module.ApproveProgressData(step=f"s{i}", percent=i))
        elapsed = time.perf_counter() - start
        return module.ApproveOutput(approved=True)

    runtime = Runtime(store=store)
    runtime.register(module.SPEC, writer)
    result = await runtime.call("approve", {"order_id": "o", "amount": 1})
    assert result.status == "success", result
    return elapsed / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "specs" / "bench").mkdir(parents=True)
        (root / "specs" / "bench" / "approve.v1.json").write_text(json.dumps(SPEC))
        build(root / "specs", root / "out", "blade_pending_bench")
        sys.path.insert(0, str(root / "out"))
        module = importlib.import_module("blade_pending_bench.bench.approve_v1")
        bare = bare_commit_s(root / "bare.db", args.cycles)
        cycle = asyncio.run(cycles_s(module, SQLiteStore(root / "cycles.db"), args.cycles))
        write = asyncio.run(data_writes_s(module, SQLiteStore(root / "data.db"), args.cycles))
    print(f"bare INSERT+COMMIT (WAL, NORMAL): {bare * 1e6:8.1f} us")
    print(
        f"suspend-submit-resume cycle:      {cycle * 1e6:8.1f} us = {1 / cycle:7.0f} cycles/s "
        f"(target > 1000); {cycle / (4 * bare):.2f}x its 4 bare commits (target <= 3x)"
    )
    print(
        f"durable ToolData write:           {write * 1e6:8.1f} us = {1 / write:7.0f} writes/s; "
        f"{write / bare:.2f}x a bare commit"
    )


if __name__ == "__main__":
    main()
