"""The test tools of tests/runtime/core/test_slots.py, and a worker process that runs them.

    python tests/slot_tools.py STORE_URL LOG_FILE CONCURRENCY HOLD_S N [LEASE_S]

The worker registers ``work`` (at most CONCURRENCY at once, locking ``/path``) on the store
at STORE_URL and makes N calls of it at once, each holding its slot for HOLD_S seconds. Every
entry appends ``start PID CALL_ID TIME`` and ``end PID CALL_ID TIME`` to LOG_FILE (O_APPEND:
lines of concurrent processes never interleave), so a test can check, across processes, that
no more than the limit ever ran at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import time
import uuid
from collections.abc import Collection
from typing import Any

from pydantic import BaseModel

from blade_runtime import Runtime
from blade_runtime.core.spec import BackendToolSpec, SuspendPoint

INPUT = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "path": {"type": "string"},
        "hold_s": {"type": "number", "minimum": 0},
    },
    "required": ["n"],
    "additionalProperties": False,
}
OUTPUT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


class Work(BaseModel):
    n: int
    path: str | None = None
    hold_s: float = 0.0


class Done(BaseModel):
    n: int


class Ok(BaseModel):
    ok: bool


OK = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
GATE = SuspendPoint("gate", OK, OK, Ok, Ok)


def work_spec(
    *,
    concurrency: int | None = None,
    locks: Collection[str] = (),
    timeout_ms: int = 60_000,
    suspends: bool = True,
) -> BackendToolSpec[Any, Any, Any, Any, Any]:
    """``work``: holds its slot for ``hold_s`` seconds, then returns its ``n``."""
    return BackendToolSpec(
        id="slots.work.v1",
        name="work",
        description="Holds a slot for a while.",
        kind=None,
        side_effect="idempotent",
        timeout_ms=timeout_ms,
        fingerprint=hashlib.sha256(b"slots.work").hexdigest()[:16],
        source="slot_tools.py",
        input_schema=INPUT,
        input_type=Work,
        output_schema=OUTPUT,
        output_type=Done,
        context_schema=None,
        context_type=None,
        suspend={"gate": GATE} if suspends else {},
        concurrency=concurrency,
        locks=tuple(locks),
    )


def parent_spec(*, locks: Collection[str] = ()) -> BackendToolSpec[Any, Any, Any, Any, Any]:
    """``edit``: calls ``work`` (slots.work.v1) as its child tool, on the same input."""
    return BackendToolSpec(
        id="slots.edit.v1",
        name="edit",
        description="Calls work as a child tool.",
        kind=None,
        side_effect="idempotent",
        timeout_ms=60_000,
        fingerprint=hashlib.sha256(b"slots.edit").hexdigest()[:16],
        source="slot_tools.py",
        input_schema=INPUT,
        input_type=Work,
        output_schema=OUTPUT,
        output_type=Done,
        context_schema=None,
        context_type=None,
        children=("slots.work.v1",),
        locks=tuple(locks),
    )


def logged(log_file: str) -> Any:
    """An implementation of ``work`` that appends its start and end to ``log_file``."""

    def line(text: str) -> None:
        fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{text}\n".encode())
        finally:
            os.close(fd)

    async def work(ctx: Any) -> Done:
        me = f"{os.getpid()} {ctx.call.call_id}"
        line(f"start {me} {time.time():.6f}")
        await asyncio.sleep(ctx.input.hold_s)
        line(f"end {me} {time.time():.6f}")
        return Done(n=ctx.input.n)

    return work


def most_at_once(log_file: str) -> tuple[int, int]:
    """(the most calls that ran at once, how many ended) by the log's start and end times."""
    marks: list[tuple[float, int]] = []
    ended = 0
    with open(log_file) as lines:
        for text in lines:
            kind, _, _, at = text.split()
            marks.append((float(at), 1 if kind == "start" else -1))
            ended += kind == "end"
    running = most = 0
    for _, step in sorted(marks, key=lambda m: (m[0], m[1])):  # an end before a start at a tie
        running += step
        most = max(most, running)
    return most, ended


async def _main(
    url: str, log_file: str, concurrency: int, hold_s: float, n: int, lease_s: float
) -> None:
    from blade_runtime.stores.urls import open_store

    runtime = Runtime(store=open_store(url), lease_s=lease_s)
    runtime.register(work_spec(concurrency=concurrency), logged(log_file))
    tag = uuid.uuid4().hex[:8]
    results = await asyncio.gather(
        *(runtime.call("work", {"n": i, "hold_s": hold_s}, call_id=f"w{tag}-{i}") for i in range(n))
    )
    for result in results:
        print(result.status, flush=True)
    await runtime.close()


if __name__ == "__main__":
    url, log_file, concurrency, hold_s, n, *lease = sys.argv[1:]
    asyncio.run(
        _main(
            url,
            log_file,
            int(concurrency),
            float(hold_s),
            int(n),
            float(lease[0]) if lease else 5.0,
        )
    )
