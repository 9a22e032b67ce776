"""Pending-action benchmark: suspend-submit-resume cycles and durable data writes, per engine.

Measured in one run, per engine (SQLite; PostgreSQL on loopback), each beside its own baseline:
  - baseline: a bare INSERT of a ~1 KB JSON row and COMMIT on the same engine and settings
    (SQLite: WAL, synchronous=NORMAL; PostgreSQL: autocommit over loopback), by 1, 2 and 4
    processes at once; on SQLite in this process also with its checkpoints in a thread, as
    SQLiteStore's are (plain sqlite3 runs each inside the commit that crosses 1,000 WAL pages);
  - a full cycle: call (the start is committed before the tool runs) -> the tool suspends (the
    pending action is committed) -> submit (validated, resolved exactly once, the call claimed in
    the same transaction) -> the tool resumes and returns (the result is committed). That is 4
    commits; each cycle's cost is compared with 4 bare commits at the same number of processes.
    Cycles by 1, 2 and 4 worker processes at once (each its own runtime on the same store), and,
    on SQLite, by one runtime in this process (the measurement this benchmark started with);
  - on SQLite, the two parts of a cycle apart: the store's statements of one cycle replayed by
    sqlite3 alone, with no runtime (what any runtime pays for the same writes), the runtime's
    own work (the same cycle on a MemoryStore taken for durable) and the rest, each against the
    same 4 bare commits;
  - durable ToolData writes (each one committed with its event), against one bare commit each;
  - on PostgreSQL, 4 workers' cycles while a store listens (every event then sends a NOTIFY,
    which serializes the commits that send one: the cost of an HTTP service streaming events);
  - leases and heartbeats on a call that runs for one second: the default lease, a short lease
    (a renewal every 0.1 s) and leases effectively off (a lease no heartbeat ever renews),
    against the bare sleep.
Beside each, the CPU-seconds the whole machine was busy (workers, database server, kernel): what
bounds the throughput that more workers can reach on this machine's CPUs.
Targets: a cycle costs at most 3x its 4 bare commits on each engine; on PostgreSQL 4 workers
reach at least 2x the throughput of one; leases and heartbeats add at most 10% to a 1 s call.

PostgreSQL: ``--postgres DSN`` or ``BLADE_BENCH_POSTGRES_DSN`` (a role that may create a
database: the benchmark works in a fresh one and drops it); else a private cluster is started
like the tests' one (tests/postgres.py), with PostgreSQL's durable defaults (fsync on), and
stopped at the end. ``--engines sqlite`` leaves PostgreSQL out.

Each figure is the best of ``--rounds`` measurements (default 3), so that other work on the
machine inflates neither side of a ratio.

Usage: python bench/pending.py [--cycles N] [--rounds R] [--engines sqlite,postgres]
                               [--postgres DSN]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import itertools
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from blade_codegen.build import build
from blade_runtime import ResumeEntry, Runtime
from blade_runtime.core.permissions import Ask
from blade_runtime.core.store import Store
from blade_runtime.stores.memory import MemoryStore
from blade_runtime.stores.sqlite import (
    _BACKSTOP_PAGES,
    CHECKPOINT_EVERY,
    SQLiteStore,
    _Checkpointer,
    _Once,
)
from blade_runtime.stores.urls import open_store

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "blade_pending_bench"
MODULE = f"{PACKAGE}.bench.approve_v1"
WORKERS = (1, 2, 4)
DSN_ENV = "BLADE_BENCH_POSTGRES_DSN"

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


# -- bare commits ------------------------------------------------------------------------------


def bare_commit_s(path: Path, count: int, threaded: bool = False) -> float:
    """Seconds per INSERT + COMMIT of a 1 KB row, WAL and synchronous=NORMAL like the store;
    ``threaded``: its checkpoints in a thread as the store's are (else inside the commits, as
    plain sqlite3 does them)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body TEXT)")
    with checkpoints(db, path, threaded) as committed:
        start = time.perf_counter()
        for _ in range(count):
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO t (body) VALUES (?)", (ROW,))
            db.execute("COMMIT")
            committed()
        elapsed = time.perf_counter() - start
    db.close()
    return elapsed / count


@contextlib.contextmanager
def checkpoints(db: sqlite3.Connection, path: Path, threaded: bool) -> Iterator[Any]:
    """What to call after each commit on ``db``: nothing, or (``threaded``) what SQLiteStore
    does, its checkpointer asked every CHECKPOINT_EVERY commits and SQLite's own as a backstop."""
    if not threaded:
        yield lambda: None
        return
    db.execute(f"PRAGMA wal_autocheckpoint={_BACKSTOP_PAGES}")
    checkpointer, commits = _Checkpointer(path, "NORMAL", _Once()), itertools.count(1)
    checkpointer.start()

    def committed() -> None:
        if next(commits) % CHECKPOINT_EVERY == 0:
            checkpointer.request()

    try:
        yield committed
    finally:
        checkpointer.stop()


def bare_sqlite(url: str, count: int) -> None:
    """One process's share of the bare SQLite commits (the table exists)."""
    path = url.removeprefix("sqlite:///")
    db = sqlite3.connect(path, isolation_level=None, timeout=60)
    db.execute("PRAGMA synchronous=NORMAL")
    for _ in range(count):
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t (body) VALUES (?)", (ROW,))
        db.execute("COMMIT")
    db.close()


def bare_postgres(url: str, count: int) -> None:
    """One process's share of the bare PostgreSQL commits: one autocommit INSERT each."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        for _ in range(count):
            db.execute("INSERT INTO bench_bare (body) VALUES (%s)", (ROW,))


def prepare_bare(url: str) -> None:
    if url.startswith("sqlite:///"):
        lite = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        lite.execute("PRAGMA journal_mode=WAL")
        lite.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body TEXT)")
        lite.close()
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        db.execute("CREATE TABLE IF NOT EXISTS bench_bare (id bigserial PRIMARY KEY, body text)")


# -- cycles and data writes in this process (the original measurements) ----------------------


def approve_impl(module: Any) -> Any:
    async def approve(ctx: Any) -> Any:
        if isinstance(ctx.entry, ResumeEntry):
            return module.ApproveOutput(approved=ctx.entry.payload.approved)
        if ctx.input.amount < 0:  # the one-second call of the lease measurement
            await asyncio.sleep(-ctx.input.amount / 1000)
            return module.ApproveOutput(approved=True)
        ctx.suspend("review", module.ApproveReviewSuspend(prompt=f"Approve {ctx.input.order_id}?"))

    return approve


async def run_cycles(
    module: Any,
    store: Store,
    count: int,
    prefix: str = "o",
    ends: list[float] | None = None,
    *,
    on_the_loop: bool = False,
) -> float:
    """Seconds for ``count`` suspend-submit-resume cycles by one runtime on ``store`` (and, into
    ``ends``, when each cycle ended). ``on_the_loop``: the store called inline on the event
    loop, as before the runtime took it off the loop (what that costs, measured beside it)."""
    runtime = Runtime(store=store)
    if on_the_loop:
        runtime.io.waits = runtime.io.inline_first = False
    runtime.register(module.SPEC, approve_impl(module))
    start = time.perf_counter()
    for i in range(count):
        waiting = await runtime.call("approve", {"order_id": f"{prefix}{i}", "amount": i})
        done = await runtime.submit(waiting.action.action_id, {"approved": True, "by": "ann"})  # type: ignore[union-attr]
        assert done.status == "success", done
        if ends is not None:
            ends.append(time.perf_counter())
    elapsed = time.perf_counter() - start
    await runtime.close()
    return elapsed


async def cycles_s(module: Any, store: SQLiteStore, count: int) -> tuple[float, float]:
    """Seconds per cycle on average, and the 99th percentile of a cycle's seconds."""
    ends: list[float] = []
    start = time.perf_counter()
    elapsed = await run_cycles(module, store, count, ends=ends)
    spans = sorted(end - begin for begin, end in itertools.pairwise([start, *ends]))
    return elapsed / count, spans[int(len(spans) * 0.99)]


async def ask_round_trips_s(module: Any, store: Store, count: int) -> float:
    """Seconds per permission round trip: the policy asks, a person approves, the call runs."""

    async def approve(ctx: Any) -> Any:
        return module.ApproveOutput(approved=True)

    runtime = Runtime(store=store, permission=lambda request: Ask())
    runtime.register(module.SPEC, approve)
    start = time.perf_counter()
    for i in range(count):
        asked = await runtime.call("approve", {"order_id": f"p{i}", "amount": i})
        done = await runtime.submit(asked.action.action_id, {"decision": "approve"})  # type: ignore[union-attr]
        assert done.status == "success", done
    elapsed = time.perf_counter() - start
    await runtime.close()
    return elapsed / count


async def data_writes_s(module: Any, store: Store, count: int) -> float:
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
    await runtime.close()
    return elapsed / count


async def one_second_call_s(module: Any, store: Store | None, lease_s: float, calls: int) -> float:
    """Mean seconds of a call whose implementation sleeps 1 s (``store`` None: the bare sleep)."""
    if store is None:
        start = time.perf_counter()
        for _ in range(calls):
            await asyncio.sleep(1.0)
        return (time.perf_counter() - start) / calls
    runtime = Runtime(store=store, lease_s=lease_s)
    runtime.register(module.SPEC, approve_impl(module))
    start = time.perf_counter()
    for i in range(calls):
        result = await runtime.call("approve", {"order_id": f"slow{lease_s}-{i}", "amount": -1000})
        assert result.status == "success", result
    elapsed = time.perf_counter() - start
    await runtime.close()
    return elapsed / calls


# -- the floor: the store's statements without the runtime, and the runtime without a store ----

Statement = tuple[str, Any]  # the SQL, and its parameters (a mapping: the store names them)


class _Recording(sqlite3.Connection):
    """A connection that keeps the statements it runs, with their parameters, while
    ``recorded`` is a list."""

    recorded: list[Statement] | None = None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if _Recording.recorded is not None:
            kept = dict(parameters) if isinstance(parameters, dict) else tuple(parameters)
            _Recording.recorded.append((sql, kept))
        return super().execute(sql, parameters)


class _RecordingStore(SQLiteStore):
    connection_class = _Recording


class _DurableMemory(MemoryStore):
    """MemoryStore taken for a durable store: the runtime makes every store call it makes on
    SQLite (a memory store is not told a call's start), so its own work is all that is left."""

    durable = True


async def cycle_statements(module: Any, path: Path) -> tuple[list[Statement], str, str]:
    """The statements of one suspend-submit-resume cycle on SQLite (the second one, so that
    nothing is created on the way), with the ids of its call and action."""
    store = _RecordingStore(path)
    runtime = Runtime(store=store)
    runtime.register(module.SPEC, approve_impl(module))
    for order in ("first", "recorded"):
        _Recording.recorded = [] if order == "recorded" else None
        waiting = await runtime.call("approve", {"order_id": order, "amount": 1})
        done = await runtime.submit(waiting.action.action_id, {"approved": True, "by": "ann"})  # type: ignore[union-attr]
        assert done.status == "success", done
    statements, _Recording.recorded = _Recording.recorded or [], None
    await runtime.close()
    store.close()
    return statements, waiting.call.call_id, waiting.action.action_id  # type: ignore[union-attr]


def replayed_cycle_s(path: Path, recorded: tuple[list[Statement], str, str], count: int) -> float:
    """Seconds per cycle of the recorded statements run by sqlite3 alone on a new store file
    (each cycle with ids of its own, in the order the runtime makes them, checkpointed as the
    store does): what any runtime pays for these writes, with no Python of its own."""
    statements, call_id, action_id = recorded
    SQLiteStore(path).close()  # the schema, and WAL (which the file keeps)

    def renamed(value: Any, i: int) -> Any:
        if not isinstance(value, str):
            return value
        return value.replace(call_id, f"{call_id}r{i:07d}").replace(
            action_id, f"{action_id}r{i:07d}"
        )

    def values_of(values: Any, i: int) -> Any:
        if isinstance(values, dict):
            return {key: renamed(value, i) for key, value in values.items()}
        return tuple(renamed(value, i) for value in values)

    cycles = [[(sql, values_of(values, i)) for sql, values in statements] for i in range(count)]
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA synchronous=NORMAL")
    with checkpoints(db, path, threaded=True) as committed:
        start = time.perf_counter()
        for cycle in cycles:
            for sql, values in cycle:
                db.execute(sql, values).fetchall()
                if sql == "COMMIT":
                    committed()
        elapsed = time.perf_counter() - start
    db.close()
    return elapsed / count


# -- worker processes --------------------------------------------------------------------------


def worker(config: dict[str, Any]) -> None:
    """A benchmark worker: wait for the start file, do its share, print its start and end."""
    sys.path.insert(0, config["out"])
    module = importlib.import_module(MODULE)
    kind, url, count = config["kind"], config["url"], int(config["count"])
    store = None if kind == "bare" else open_store(url)
    Path(config["ready"], str(os.getpid())).touch()
    if not _appears(Path(config["go"]), 120):
        raise SystemExit("never started")
    start = time.time()
    if kind == "bare":
        (bare_sqlite if url.startswith("sqlite:///") else bare_postgres)(url, count)
    else:
        assert store is not None
        asyncio.run(run_cycles(module, store, count, prefix=f"w{os.getpid()}-"))
    end = time.time()
    print(json.dumps({"start": start, "end": end}), flush=True)
    # Done: the machine's CPU is read now, before closing and exiting (which are not cycles).
    Path(config["done"], str(os.getpid())).touch()
    _appears(Path(config["quit"]), 120)
    if store is not None:
        store.close()


def _appears(path: Path, limit_s: float) -> bool:
    """Whether ``path`` exists within ``limit_s`` (looked for every millisecond)."""
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def _all_report(folder: Path, procs: list[subprocess.Popen[str]], limit_s: float) -> bool:
    """Whether every worker of ``procs`` put its file in ``folder`` within ``limit_s``, none
    having exited first."""
    deadline = time.monotonic() + limit_s
    while len(list(folder.iterdir())) < len(procs):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            return False
        time.sleep(0.001)
    return True


def busy_cpu_s() -> float:
    """CPU-seconds this machine's CPUs have been busy since boot, every process (the database
    server's too) and the kernel: /proc/stat's user, nice, system, irq and softirq (not idle,
    waiting for I/O or stolen by the hypervisor)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class Span(NamedTuple):
    wall_s: float  # from the first worker's start to the last one's end
    busy_s: float  # CPU-seconds the machine was busy from the start to the last end (busy_cpu_s)


def in_processes(out: Path, kind: str, url: str, processes: int, count: int) -> Span:
    """``processes`` workers doing ``count`` each: their span, and the machine's CPU meanwhile."""
    with tempfile.TemporaryDirectory() as folder:
        ready, go, done = Path(folder, "ready"), Path(folder, "go"), Path(folder, "done")
        ready.mkdir()
        done.mkdir()
        quit_file = Path(folder, "quit")
        config = {"out": str(out), "kind": kind, "url": url, "count": count}
        config |= {"ready": str(ready), "go": str(go), "done": str(done), "quit": str(quit_file)}
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", json.dumps(config)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(processes)
        ]
        if not _all_report(ready, procs, 120):
            raise SystemExit("a benchmark worker did not start")
        busy = busy_cpu_s()
        go.touch()
        if not _all_report(done, procs, 600):
            raise SystemExit("a benchmark worker failed or never finished")
        busy = busy_cpu_s() - busy
        quit_file.touch()
        spans = []
        for proc in procs:
            out_text, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"a benchmark worker failed ({proc.returncode})")
            spans.append(json.loads(out_text.strip().splitlines()[-1]))
    return Span(float(max(s["end"] for s in spans) - min(s["start"] for s in spans)), busy)


# -- engines -----------------------------------------------------------------------------------


@contextlib.contextmanager
def postgres_server(dsn: str | None) -> Iterator[str]:
    """The server URL to work on: ``dsn``, else a private durable cluster (tests/postgres.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from postgres import server  # type: ignore[import-not-found]

    with server(dsn) as url:
        yield url


@contextlib.contextmanager
def fresh_database(server: str) -> Iterator[str]:
    """A new database on ``server`` for one measurement, dropped afterwards."""
    sys.path.insert(0, str(ROOT / "tests"))
    from postgres import temporary_database

    with temporary_database(server, f"blade_bench_{os.getpid()}_{time.time_ns()}") as url:
        yield str(url)


def measure_engine(
    out: Path,
    module: Any,
    urls: Iterator[str],
    cycles: int,
    rounds: int,
    *,
    notifies: bool = False,
) -> dict[str, Any]:
    """Bare commits and cycles by 1, 2 and 4 processes (each the best of ``rounds``, bare and
    cycles alternating, so that a busy moment of the machine hits both alike), data writes and
    the lease overhead; with ``notifies``, also 4 workers' cycles while a store listens (so
    that every event sends a NOTIFY, as when an HTTP service streams events)."""
    per = max(50, cycles // 4)  # cycles per worker process at every concurrency
    figures: dict[str, Any] = {"bare": {}, "bare_busy": {}, "cycles": {}, "busy": {}}
    for processes in WORKERS:
        bare, cycle = [], []
        for _ in range(rounds):
            url = next(urls)
            prepare_bare(url)
            total = per * 4 * processes
            span = in_processes(out, "bare", url, processes, per * 4)
            bare.append((span.wall_s / total, span.busy_s / total))
            url = next(urls)
            open_store(url).close()  # migrated before the workers open it
            span = in_processes(out, "cycles", url, processes, per)
            cycle.append((span.wall_s / (per * processes), span.busy_s / (per * processes)))
        figures["bare"][processes], figures["bare_busy"][processes] = min(bare)
        figures["cycles"][processes], figures["busy"][processes] = min(cycle)
    if notifies:
        listened = []
        for _ in range(rounds):
            url = next(urls)
            listener = open_store(url)
            listener.head()  # it listens from its first read of events on
            span = in_processes(out, "cycles", url, 4, per)
            listener.close()
            listened.append(span.wall_s / (per * 4))
        figures["listened"] = min(listened)
    off_loop: list[float] = []
    on_loop: list[float] = []
    for _ in range(rounds):  # alternating, so that a busy moment hits both alike
        for on_the_loop, into in ((False, off_loop), (True, on_loop)):
            store = open_store(next(urls))
            elapsed = asyncio.run(
                run_cycles(module, store, per, prefix="l", on_the_loop=on_the_loop)
            )
            store.close()
            into.append(elapsed / per)
    figures["off_loop"], figures["on_loop"] = min(off_loop), min(on_loop)
    store = open_store(next(urls))
    figures["data"] = asyncio.run(data_writes_s(module, store, cycles))
    store.close()
    store = open_store(next(urls))
    calls = 3
    figures["sleep"] = asyncio.run(one_second_call_s(module, None, 0, calls))
    for label, lease_s in (("off", 1e9), ("default", 5.0), ("short", 0.3)):
        figures[label] = asyncio.run(one_second_call_s(module, store, lease_s, calls))
    store.close()
    return figures


def report(engine: str, figures: dict[str, Any]) -> None:
    bare, cycles = figures["bare"], figures["cycles"]
    print(f"\n{engine}")
    for processes in WORKERS:
        b, c = bare[processes], cycles[processes]
        print(
            f"  {processes} process{'es' if processes > 1 else '  '}: bare INSERT+COMMIT "
            f"{b * 1e6:7.1f} us ({1 / b:7.0f}/s); cycle {c * 1e6:7.1f} us ({1 / c:6.0f} cycles/s)"
            f" = {c / (4 * b):.2f}x its 4 bare commits (target <= 3x)"
        )
    scale = cycles[1] / cycles[4]
    target = " (target >= 2x)" if engine.startswith("PostgreSQL") else ""
    print(f"  4 workers / 1 worker cycle throughput: {scale:.2f}x{target}")
    if "listened" in figures:
        listened = figures["listened"]
        print(
            f"  4 workers while a store listens (every event sends NOTIFY): {1 / listened:.0f} "
            f"cycles/s = {cycles[4] / listened:.2f}x of 4 workers' without, "
            f"{cycles[1] / listened:.2f}x one worker's"
        )
    # What the CPUs allow: one worker's cycle needs busy[1] CPU-seconds (the worker's, the
    # server's, the kernel's). If a cycle needs as much at any concurrency, no number of workers
    # passes CPUS / busy[1] cycles a second: an estimate (group commits may save a little, and
    # lock waits cost more); the CPU per cycle at each concurrency is printed beside it.
    cpus, busy, bare_busy = len(os.sched_getaffinity(0)), figures["busy"], figures["bare_busy"]
    print(
        f"  CPUs busy (of {cpus}) with {', '.join(map(str, WORKERS))} workers: cycles "
        f"{', '.join(f'{busy[p] / cycles[p]:.2f}' for p in WORKERS)}; bare commits "
        f"{', '.join(f'{bare_busy[p] / bare[p]:.2f}' for p in WORKERS)}"
    )
    print(
        f"  CPU per cycle (workers, server, kernel): "
        f"{', '.join(f'{busy[p] * 1e6:.0f}' for p in WORKERS)} us with "
        f"{', '.join(map(str, WORKERS))} workers; at one worker's, {cpus} CPUs allow at most "
        f"{cpus * cycles[1] / busy[1]:.2f}x one worker's throughput (bare commits: "
        f"{cpus * bare[1] / bare_busy[1]:.2f}x)"
    )
    off_loop, on_loop = figures["off_loop"], figures["on_loop"]
    print(
        f"  a cycle in this process, the store off the event loop: {off_loop * 1e6:.1f} us; "
        f"called on the loop: {on_loop * 1e6:.1f} us; off the loop costs "
        f"{(off_loop - on_loop) * 1e6:+.1f} us a cycle ({(off_loop / on_loop - 1) * 100:+.1f}%)"
    )
    print(
        f"  durable ToolData write: {figures['data'] * 1e6:7.1f} us = "
        f"{1 / figures['data']:6.0f} writes/s; {figures['data'] / bare[1]:.2f}x a bare commit"
    )
    off, default, short, sleep = (figures[k] for k in ("off", "default", "short", "sleep"))
    print(
        f"  a 1 s call: bare sleep {sleep:.4f} s; leases off {off:.4f} s; default lease (5 s) "
        f"{default:.4f} s = {(default / off - 1) * 100:+.2f}% vs off, "
        f"{(default / sleep - 1) * 100:+.2f}% vs the bare sleep (target <= 10%)"
    )
    print(
        f"  a 1 s call with a 0.3 s lease (a renewal every 0.1 s): {short:.4f} s = "
        f"{(short / off - 1) * 100:+.2f}% vs leases off"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="each figure: the best of these")
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--postgres", default=os.environ.get(DSN_ENV), help="a server DSN")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    engines = args.engines.split(",")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "specs" / "bench").mkdir(parents=True)
        (root / "specs" / "bench" / "approve.v1.json").write_text(json.dumps(SPEC))
        out = root / "out"
        build(root / "specs", out, PACKAGE)
        sys.path.insert(0, str(out))
        module = importlib.import_module(MODULE)
        bare = threaded = cycle = slowest = write = ask = replayed = own = float("inf")
        recorded = asyncio.run(cycle_statements(module, root / "recorded.db"))
        for r in range(args.rounds):  # the best of each, alternating
            bare = min(bare, bare_commit_s(root / f"bare{r}.db", args.cycles))
            threaded = min(threaded, bare_commit_s(root / f"t{r}.db", args.cycles, True))
            replayed = min(
                replayed, replayed_cycle_s(root / f"replay{r}.db", recorded, args.cycles)
            )
            own = min(
                own, asyncio.run(run_cycles(module, _DurableMemory(), args.cycles)) / args.cycles
            )
            store = SQLiteStore(root / f"cycles{r}.db")
            mean, p99 = asyncio.run(cycles_s(module, store, args.cycles))
            cycle, slowest = min(cycle, mean), min(slowest, p99)
            store.close()
            store = SQLiteStore(root / f"ask{r}.db")
            ask = min(ask, asyncio.run(ask_round_trips_s(module, store, args.cycles)))
            store.close()
            store = SQLiteStore(root / f"data{r}.db")
            write = min(write, asyncio.run(data_writes_s(module, store, args.cycles)))
            store.close()
        print("SQLite, in this process")
        print(f"  bare INSERT+COMMIT (WAL, NORMAL): {bare * 1e6:8.1f} us")
        print(
            f"  the same, checkpointed in a thread: {threaded * 1e6:6.1f} us (as SQLiteStore "
            "checkpoints)"
        )
        print(
            f"  suspend-submit-resume cycle:      {cycle * 1e6:8.1f} us = {1 / cycle:7.0f} "
            f"cycles/s (target > 1000); {cycle / (4 * bare):.2f}x its 4 bare commits "
            f"(target <= 3x); {cycle / (4 * threaded):.2f}x 4 checkpointed in a thread"
        )
        print(f"  the 99th percentile of a cycle:   {slowest * 1e6:8.1f} us")
        print(
            f"  of which no runtime can save:     {replayed * 1e6:8.1f} us = "
            f"{replayed / (4 * bare):.2f}x 4 bare commits (its {len(recorded[0])} statements, "
            "replayed by sqlite3 alone)"
        )
        print(
            f"  the runtime's own work:           {own * 1e6:8.1f} us = {own / (4 * bare):.2f}x "
            "4 bare commits (the same cycle on MemoryStore, taken for durable)"
        )
        rest = cycle - replayed - own
        print(
            f"  the rest:                         {rest * 1e6:8.1f} us = {rest / (4 * bare):.2f}x "
            "4 bare commits (SQLiteStore's Python, and its statements slower amid the runtime's)"
        )
        print(
            f"  durable ToolData write:           {write * 1e6:8.1f} us = {1 / write:7.0f} "
            f"writes/s; {write / bare:.2f}x a bare commit"
        )
        print(
            f"  ask round trip (ask, approve, run): {ask * 1e6:6.1f} us = "
            f"{ask / (cycle + bare):.2f}x a cycle plus one commit (target <= 1x)"
        )
        if "sqlite" in engines:
            files = (f"sqlite:///{root / f'm{i}.db'}" for i in itertools.count())
            figures = measure_engine(out, module, files, args.cycles, args.rounds)
            report("SQLite (WAL, synchronous=NORMAL)", figures)
        if "postgres" in engines:
            with postgres_server(args.postgres) as server, contextlib.ExitStack() as stack:

                def databases() -> Iterator[str]:
                    while True:
                        yield stack.enter_context(fresh_database(server))

                where = "given server" if args.postgres else "private cluster, fsync on"
                figures = measure_engine(
                    out, module, databases(), args.cycles, args.rounds, notifies=True
                )
                report(f"PostgreSQL (loopback, {where})", figures)


if __name__ == "__main__":
    main()
