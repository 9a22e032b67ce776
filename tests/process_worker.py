"""A worker process for tests/test_workers.py (and the tools it runs, shared with the tests).

    python tests/process_worker.py CONFIG_JSON

The worker opens the store from its URL, registers the three test tools of ``SPECS`` (one per
side effect, each with a suspend point) and the client tool ``ask``, then, in this order: tells
it is ready (a file), waits for the start file (a barrier shared by every worker of a test),
and runs what the config asks, concurrently: a recovery loop, calls, submits, one ``recover()``,
or repeated sweeps. It prints one JSON line per result it got, and exits when it is done (or,
with ``stop``, once the stop file exists).

Every entry of an implementation appends one line, ``CALL_ID ENTRY TOOL PID``, to the shared
entries file with O_APPEND (one ``write``, so lines of concurrent processes never interleave):
the tests count entries there, whichever process ran them (the fenced tool ``post`` also
records its write, ``CALL_ID write-TOKEN post PID``). ``hang``: tools whose entries block
forever after recording themselves (the test kills the process while it holds their lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import json
import os
import sys
import time
from collections.abc import Collection
from functools import partial
from pathlib import Path
from typing import Any

from blade_runtime import ResumeEntry, Runtime
from blade_runtime.core.results import ToolError, ToolResult
from blade_runtime.stores.urls import open_store

SIDE_EFFECTS = {"charge": "non_idempotent", "sync": "idempotent", "fetch": "pure"}
EXPIRING = "remind"  # idempotent, its approval declared with expiresAfterMs
FENCED = "post"  # idempotent, with lease fencing: its write is recorded with its fencing token
# idempotent: after its sleep it writes ToolData, saves a file and triggers, each saying who ran
# it (the store keeps none of them from an entry that lost its claim)
AUDIT = "audit"
EXPIRES_AFTER_MS = 500
PACKAGE = "blade_workers"
WAIT_S = 60.0  # the longest a worker waits for its start or stop file


def _spec(name: str, side_effect: str, expires_after_ms: int | None = None) -> dict[str, Any]:
    deadline = {} if expires_after_ms is None else {"expiresAfterMs": expires_after_ms}
    return {
        "id": f"work.{name}.v1",
        "name": name,
        "description": f"A {side_effect} test tool: records each entry, may suspend or block.",
        "sideEffect": side_effect,
        "inputSchema": {
            "type": "object",
            "properties": {
                "n": {"type": "integer"},
                "suspend": {"type": "boolean"},
                "sleep_ms": {"type": "integer", "minimum": 0},
            },
            "required": ["n"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {
                "n": {"type": "integer"},
                "entry": {"type": "string"},
                "note": {"type": "string"},
            },
            "required": ["n", "entry"],
        },
        "suspend": {
            "approval": {
                "suspendSchema": {
                    "type": "object",
                    "properties": {"prompt": {"type": "string"}},
                    "required": ["prompt"],
                },
                "resumeSchema": {
                    "type": "object",
                    "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
                    "required": ["approved"],
                },
                **deadline,
            }
        },
    }


SPECS: dict[str, dict[str, Any]] = (
    {name: _spec(name, side) for name, side in SIDE_EFFECTS.items()}
    | {EXPIRING: _spec(EXPIRING, "idempotent", EXPIRES_AFTER_MS)}
    | {FENCED: {**_spec(FENCED, "idempotent"), "lease": True}}
    | {
        AUDIT: {
            **_spec(AUDIT, "idempotent"),
            "dataSchemas": {
                "log": {
                    "type": "object",
                    "properties": {"who": {"type": "string"}, "pid": {"type": "integer"}},
                    "required": ["who", "pid"],
                }
            },
        }
    }
    | {
        "ask": {
            "id": "work.ask.v1",
            "name": "ask",
            "description": "A client tool: the client answers a question.",
            "execution": "client",
            "sideEffect": "pure",
            "inputSchema": {
                "type": "object",
                "properties": {"question": {"type": "string"}},
                "required": ["question"],
            },
            "outputSchema": {
                "type": "object",
                "properties": {"answer": {"type": "string"}},
                "required": ["answer"],
            },
        }
    }
)


def record(path: str | Path, line: str) -> None:
    """Append one line to the shared entries file in one O_APPEND write."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class Tools:
    """The implementations of the test tools: each entry is recorded, then the tool suspends
    (initial entry, ``suspend`` true), blocks (``hang``), sleeps (``sleep_ms``) or returns."""

    def __init__(
        self,
        entries: str | Path,
        *,
        hang: Collection[str] = (),
        stubborn: Collection[str] = (),
        note: str = "ok",
    ) -> None:
        self.entries = entries
        self.hang = frozenset(hang)
        self.stubborn = frozenset(stubborn)  # they block and ignore cancellation
        self.note = note
        self.modules = {
            name: importlib.import_module(f"{PACKAGE}.work.{name}_v1") for name in SPECS
        }

    def register(
        self,
        runtime: Runtime,
        *,
        expires_after_ms: int | None = None,
        client_timeout_ms: int | None = None,
    ) -> None:
        for name in [*SIDE_EFFECTS, EXPIRING, FENCED, AUDIT]:
            spec = self.modules[name].SPEC
            if expires_after_ms is not None:
                points = {
                    key: dataclasses.replace(point, expires_after_ms=expires_after_ms)
                    for key, point in spec.suspend.items()
                }
                spec = dataclasses.replace(spec, suspend=points)
            runtime.register(spec, partial(self.run, name))
        runtime.register_client(self.modules["ask"].SPEC, timeout_ms=client_timeout_ms)

    async def run(self, name: str, ctx: Any) -> Any:
        module = self.modules[name]
        title = name.capitalize()
        resumed = isinstance(ctx.entry, ResumeEntry)
        entry = "resume" if resumed else "initial"
        record(self.entries, f"{ctx.call.call_id} {entry} {name} {os.getpid()}")
        arguments = ctx.input.model_dump(exclude_unset=True)
        if not resumed and arguments.get("suspend") is True:
            suspend = getattr(module, f"{title}ApprovalSuspend")
            ctx.suspend("approval", suspend(prompt=f"{name} {arguments['n']}?"))
        if name in self.hang:
            await asyncio.sleep(3600)
        while name in self.stubborn:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue
        if arguments.get("sleep_ms"):
            await asyncio.sleep(arguments["sleep_ms"] / 1000)
        if name == AUDIT:  # what it reports: refused by the store once another worker holds it
            who = {"who": self.note, "pid": os.getpid()}
            await ctx.data.write("log", module.AuditLogData(**who), id="log")
            await ctx.files.save("audit.txt", json.dumps(who), "application/json")
            await ctx.trigger(who)
        if name == FENCED:  # the write to another system, fenced: only while the claim holds
            await ctx.lease.assert_held()
            token = ctx.lease.fencing_token
            record(self.entries, f"{ctx.call.call_id} write-{token} {name} {os.getpid()}")
        note = self.note
        if resumed:
            resume = ctx.entry.payload.model_dump(exclude_unset=True)
            note = resume.get("note", note)
        output = getattr(module, f"{title}Output")
        return output(n=arguments["n"], entry=entry, note=note)


def summary(result: ToolResult[Any]) -> dict[str, Any]:
    code = result.code.value if isinstance(result, ToolError) else None
    return {"call_id": result.call.call_id, "status": result.status, "code": code}


async def _wait_for(path: str, limit_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"worker {os.getpid()}: {path} never appeared")
        await asyncio.sleep(0.01)


async def main(config: dict[str, Any]) -> None:
    store = open_store(config["store"])
    runtime = Runtime(
        store=store, lease_s=float(config.get("lease_s", 5.0)), host=config.get("host")
    )
    tools = Tools(
        config["entries"],
        hang=config.get("hang", ()),
        stubborn=config.get("stubborn", ()),
        note=config.get("note", "ok"),
    )
    tools.register(runtime, client_timeout_ms=config.get("client_timeout_ms"))
    results: list[ToolResult[Any]] = []
    if config.get("ready"):
        record(config["ready"], f"{os.getpid()} {runtime.owner}")
    if config.get("go"):
        await _wait_for(config["go"])
    jobs = []
    loop: asyncio.Task[None] | None = None
    if config.get("loop"):
        loop = asyncio.create_task(runtime.run_recovery(interval_s=float(config["loop"])))
    limit = asyncio.Semaphore(int(config.get("concurrency", 8)))

    async def call(call_id: str, name: str, arguments: dict[str, Any]) -> None:
        async with limit:
            if config.get("skip_known") and store.call(call_id) is not None:
                return  # a restarted worker: this call was recorded before the kill
            results.append(await runtime.call(name, arguments, call_id=call_id, run_id=run_id))

    run_id = config.get("run_id", "default")
    for call_id, name, arguments in config.get("calls", ()):
        jobs.append(call(call_id, name, arguments))

    async def submits() -> None:
        for action_id, payload in config.get("submits", ()):
            results.append(await runtime.submit(action_id, payload))

    async def sweeps() -> None:
        if config.get("recover_once"):
            results.extend(await runtime.recover())
        if config.get("sweep"):
            while not os.path.exists(config["stop"]):
                results.extend(await runtime.recover(limit=int(config.get("limit", 100))))
                await asyncio.sleep(0.005)

    async def close_after(entries: int) -> None:
        """Close the runtime (its calls still running) once ``entries`` entries ran, and exit."""
        path = Path(config["entries"])
        while not path.exists() or len(path.read_text().splitlines()) < entries:
            await asyncio.sleep(0.01)
        report = await runtime.close(timeout_s=float(config.get("close_timeout_s", 5.0)))
        print(
            json.dumps({"abandoned": list(report.abandoned), "kept": list(report.leases_kept)}),
            flush=True,
        )
        if config.get("linger_s"):  # the process lives on, the abandoned call still running
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(runtime.wait_closed(), float(config["linger_s"]))
        store.close()
        os._exit(0)

    if config.get("close_after"):
        jobs.append(close_after(int(config["close_after"])))
    await asyncio.gather(*jobs, submits(), sweeps())
    for result in results:
        print(json.dumps(summary(result)), flush=True)
    if config.get("stop"):
        await _wait_for(config["stop"], float(config.get("max_s", WAIT_S)))
    if loop is not None:
        loop.cancel()
    await runtime.close()
    store.close()


def run(config: dict[str, Any]) -> None:
    """The worker's whole life (what tests/forked.py starts)."""
    asyncio.run(main(config))


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
