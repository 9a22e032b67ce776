"""A year of traffic on one store: what a call, a page and an idle stream cost as history grows.

Per store (SQLite; PostgreSQL on loopback), a small and a large volume are filled through the
public API (``Runtime.call`` of three small tools for principals of 50 tenants: a pure one that
settles at once, one that writes a ToolData item, one that waits for an approval), and each is
measured the same way; the large/small ratio of each figure is printed beside it:

  - a call (median of a pure call that settles, in this process), and a suspend-submit cycle;
  - the first and the last page of the pending actions through the HTTP API (in process, over
    ASGI; the median of 7), as an operator and as a tenant's principal, pages of 100 (a tenant has
    fewer than 100 at the small volume: its page there is shorter), and as that tenant again in
    pages of what it has at the small volume (the same size at both volumes), and the most store
    queries a page made;
  - the CPU an idle event stream costs (this process, the server, over 5 s, against the same 5 s
    without the stream), and this process's memory after paging through every action;
  - the disk a settled call costs, before and after a prune of every settled call (SQLite: the
    file and its WAL; PostgreSQL: the tables and their indexes and TOAST).

Targets (issue 39): every page <= 1.5x its small-volume figure and <= 20 ms at the large volume
on a quiet machine; queries per page constant; an idle stream under 1% of a core; a call <= 1.1x.

Defaults: small = 3,000 settled calls and 200 waiting; large = 100,000 and 10,000 (filling the
large volume takes a few minutes per store). PostgreSQL: ``--postgres DSN`` (a role that may
create a database) or ``BLADE_BENCH_POSTGRES_DSN``, else a private cluster like the tests' one.

Usage: python bench/volume.py [--small 3000,200] [--large 100000,10000] [--engines sqlite,postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# bench/http.py would stand for the standard library's http: this folder off the path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import httpx  # noqa: E402

from blade_codegen.build import build  # noqa: E402
from blade_runtime import CallContext, Principal, ResumeEntry, Retention, Runtime  # noqa: E402
from blade_runtime.core.store import Store  # noqa: E402
from blade_runtime.serving.http import create_app  # noqa: E402
from blade_runtime.stores.sql import SQLStore  # noqa: E402
from blade_runtime.stores.urls import open_store  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "blade_volume_bench"
TENANTS = 50
PAGE = 100
DSN_ENV = "BLADE_BENCH_POSTGRES_DSN"

_INPUT = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "note": {"type": "string"}},
    "required": ["n"],
}
_OUTPUT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
SPECS = {
    "echo": {"sideEffect": "pure"},
    "log": {
        "sideEffect": "idempotent",
        "dataSchemas": {"line": {"type": "object", "properties": {"text": {"type": "string"}}}},
    },
    "approve": {
        "sideEffect": "non_idempotent",
        "suspend": {
            "ok": {
                "suspendSchema": {"type": "object", "properties": {"n": {"type": "integer"}}},
                "resumeSchema": {
                    "type": "object",
                    "properties": {"approved": {"type": "boolean"}},
                    "required": ["approved"],
                },
            }
        },
    },
}


def principals() -> list[Principal]:
    return [Principal(f"user-{t}", f"tenant-{t}") for t in range(TENANTS)]


OPERATOR = Principal("ops", "ops", frozenset({"operator"}))


def tokens() -> dict[str, Principal]:
    found = {f"token-{p.id}": p for p in principals()}
    found["token-ops"] = OPERATOR
    return found


def build_package(root: Path) -> dict[str, Any]:
    for name, extra in SPECS.items():
        spec = {
            "id": f"vol.{name}.v1",
            "name": name,
            "description": f"The volume benchmark's {name} tool.",
            "inputSchema": _INPUT,
            "outputSchema": _OUTPUT,
            **extra,
        }
        (root / "specs" / "vol").mkdir(parents=True, exist_ok=True)
        (root / "specs" / "vol" / f"{name}.v1.json").write_text(json.dumps(spec))
    build(root / "specs", root / "out", PACKAGE)
    sys.path.insert(0, str(root / "out"))
    return {name: importlib.import_module(f"{PACKAGE}.vol.{name}_v1") for name in SPECS}


def runtime_of(store: Store, modules: dict[str, Any]) -> Runtime:
    runtime = Runtime(store=store)

    async def echo(ctx: Any) -> Any:
        return modules["echo"].SPEC.output_type(n=ctx.input.n)

    async def log(ctx: Any) -> Any:
        await ctx.data.write("line", modules["log"].LogLineData(text="done"))
        return modules["log"].SPEC.output_type(n=ctx.input.n)

    async def approve(ctx: Any) -> Any:
        module = modules["approve"]
        if isinstance(ctx.entry, ResumeEntry):
            return module.SPEC.output_type(n=ctx.input.n)
        ctx.suspend("ok", module.ApproveOkSuspend(n=ctx.input.n))

    runtime.register(modules["echo"].SPEC, echo)
    runtime.register(modules["log"].SPEC, log)
    runtime.register(modules["approve"].SPEC, approve)
    return runtime


async def fill(runtime: Runtime, settled: int, waiting: int, start: int) -> None:
    """``settled`` calls (echo and log, alternately) and ``waiting`` approvals, spread over the
    tenants; numbered from ``start`` so that a second fill adds to the first."""
    people = principals()

    async def one(n: int, tool: str) -> None:
        context = CallContext(people[n % TENANTS])
        await runtime.call(tool, {"n": n}, context=context, run_id=f"run-{n % 997}")

    batch: list[Any] = []
    for n in range(start, start + settled):
        batch.append(one(n, "echo" if n % 2 else "log"))
        if len(batch) == 64:
            await asyncio.gather(*batch)
            batch = []
    for n in range(start, start + waiting):
        batch.append(one(n, "approve"))
        if len(batch) == 64:
            await asyncio.gather(*batch)
            batch = []
    await asyncio.gather(*batch)


class Counted:
    """The store's reads and transactions, counted (queries a page makes)."""

    def __init__(self, store: SQLStore) -> None:
        self.count = 0
        fetch, transaction = store._fetch, store._transaction

        def counted_fetch(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return fetch(*args, **kwargs)

        def counted_transaction() -> Any:
            self.count += 1
            return transaction()

        store._fetch = counted_fetch  # type: ignore[method-assign]
        store._transaction = counted_transaction  # type: ignore[method-assign]


async def median_s(action: Any, count: int) -> float:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        await action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def pages(
    http: httpx.AsyncClient, token: str, counter: Counted, limit: int, repeats: int = 7
) -> tuple[float, float, int, int]:
    """GET /v1/actions page after page to the end (as a person paging through would), the most
    store queries any page made and how many pages there were; then the first and the last page
    again, ``repeats`` times each, for their median times."""
    headers = {"Authorization": f"Bearer {token}"}
    first = f"/v1/actions?limit={limit}"
    url: str | None = first
    last = first
    queries: list[int] = []
    while url is not None:
        before = counter.count
        answer = await http.get(url, headers=headers)
        queries.append(counter.count - before)
        assert answer.status_code == 200, answer.text
        last = url
        following = answer.json()["next"]
        url = None if following is None else f"/v1/actions?limit={limit}&cursor={following}"

    async def timed(target: str) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            answer = await http.get(target, headers=headers)
            times.append(time.perf_counter() - start)
            assert answer.status_code == 200, answer.text
        return statistics.median(times)

    return await timed(first), await timed(last), max(queries), len(queries)


async def idle_stream_cpu(app: Any, run_id: str, token: str, seconds: float) -> float:
    """The share of a core this process spends while one event stream of a quiet run is open,
    less the share it spends in the same time without it. The app is driven as a server would
    (httpx's ASGI transport reads a whole body before it answers, so it cannot hold a stream)."""

    async def quiet() -> float:
        start = time.process_time()
        await asyncio.sleep(seconds)
        return time.process_time() - start

    without = await quiet()
    gone = asyncio.Event()
    started: list[int] = []

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            started.append(message["status"])

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": f"/v1/runs/{run_id}/events",
        "raw_path": f"/v1/runs/{run_id}/events".encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {token}".encode())],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
    }
    serving = asyncio.ensure_future(app(scope, receive, send))
    used = await quiet()
    gone.set()
    try:
        await asyncio.wait_for(serving, 10)
    except (TimeoutError, asyncio.CancelledError):
        serving.cancel()
    assert started == [200], started
    return max(0.0, used - without) / seconds


def disk_bytes(store: Store) -> int:
    url = store.url
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    assert isinstance(store, SQLStore)
    rows = store._fetch(
        "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
        "WHERE c.relname LIKE 'blade_%' AND c.relkind = 'r'"
    )
    return int(rows[0][0])


async def measure(
    store: Store, modules: dict[str, Any], settled: int, tenant_page: int
) -> dict[str, float]:
    """The figures of one volume; ``tenant_page``: the page size of a tenant's listing (what a
    tenant has at the small volume, so that both volumes read pages of the same size)."""
    runtime = runtime_of(store, modules)
    app = create_app(runtime, authenticate=lambda request: _token(request))
    assert isinstance(store, SQLStore)
    counter = Counted(store)
    found: dict[str, float] = {}
    alice = principals()[7]
    context = CallContext(alice)
    counter_n = iter(range(10**9, 2 * 10**9))

    async def call() -> None:
        await runtime.call("echo", {"n": next(counter_n)}, context=context, run_id="measure")

    async def cycle() -> None:
        asked = await runtime.call(
            "approve", {"n": next(counter_n)}, context=context, run_id="measure"
        )
        await runtime.submit(asked.action.action_id, {"approved": True})  # type: ignore[union-attr]

    await call()
    found["call"] = await median_s(call, 300)
    found["cycle"] = await median_s(cycle, 100)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        for who, token, size in (
            ("tenant", f"token-{alice.id}", PAGE),
            (f"tenant, {tenant_page} a page", f"token-{alice.id}", tenant_page),
            ("operator", "token-ops", PAGE),
        ):
            first, last, queries, count = await pages(http, token, counter, size)
            found[f"{who} first page"], found[f"{who} last page"] = first, last
            found[f"{who} queries per page"], found[f"{who} pages"] = queries, count
    found["memory after paging (MB)"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    found["idle stream (share of a core)"] = await idle_stream_cpu(
        app, "run-7", f"token-{alice.id}", 5.0
    )
    calls = settled + len(store.calls(["suspended"]))
    found["disk per call (bytes)"] = disk_bytes(store) / calls
    await runtime.prune(Retention(older_than_s=0), dry_run=False)
    if isinstance(store, SQLStore) and store.url.startswith("postgresql"):
        with store._transaction() as tx:  # VACUUM cannot run in a transaction block: ANALYZE
            tx.run("ANALYZE")
    waiting = len(store.calls(["suspended"]))
    found["disk per waiting call after prune (bytes)"] = disk_bytes(store) / max(waiting, 1)
    await runtime.close()
    return found


def _token(request: Any) -> Principal | None:
    header = request.headers.get("authorization", "")
    return TOKENS.get(header.removeprefix("Bearer "))


TOKENS = tokens()


@contextlib.contextmanager
def postgres_server(dsn: str | None) -> Iterator[str]:
    """The server URL to work on: ``dsn``, else a private durable cluster (tests/postgres.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from postgres import server  # type: ignore[import-not-found]

    with server(dsn) as url:
        yield url


@contextlib.contextmanager
def fresh_store(engine: str, root: Path, server: str | None, name: str) -> Iterator[Store]:
    if engine == "sqlite":
        store = open_store(root / f"{name}.db")
        try:
            yield store
        finally:
            store.close()
        return
    assert server is not None
    sys.path.insert(0, str(ROOT / "tests"))
    from postgres import temporary_database

    with temporary_database(server, f"blade_volume_{name}_{os.getpid()}") as url:
        store = open_store(str(url))
        try:
            yield store
        finally:
            store.close()


def report(engine: str, small: dict[str, float], large: dict[str, float]) -> None:
    print(f"\n{engine}")
    for key in small:
        a, b = small[key], large[key]
        ratio = f"{b / a:5.2f}x" if a else "  -  "
        if key in ("call", "cycle") or (
            "page" in key and "pages" not in key and "queries" not in key
        ):
            print(f"  {key:44} small {a * 1000:8.2f} ms   large {b * 1000:8.2f} ms   {ratio}")
        else:
            print(f"  {key:44} small {a:10.3f}   large {b:10.3f}   {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", default="3000,200", help="settled,waiting")
    parser.add_argument("--large", default="100000,10000", help="settled,waiting")
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--postgres", default=os.environ.get(DSN_ENV), help="a server DSN")
    args = parser.parse_args()
    small = tuple(int(n) for n in args.small.split(","))
    large = tuple(int(n) for n in args.large.split(","))
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        modules = build_package(root)
        for engine in args.engines.split(","):
            server_context = (
                postgres_server(args.postgres) if engine == "postgres" else contextlib.nullcontext()
            )
            with server_context as server:
                figures = []
                for name, (settled, waiting) in (("small", small), ("large", large)):
                    with fresh_store(engine, root, server, name) as store:
                        started = time.monotonic()
                        asyncio.run(fill(runtime_of(store, modules), settled, waiting, 0))
                        filled = time.monotonic() - started
                        if engine == "postgres":  # autovacuum's statistics, as a year has them
                            assert isinstance(store, SQLStore)
                            with store._transaction() as tx:
                                tx.run("ANALYZE")
                        print(f"{engine} {name}: {settled} settled, {waiting} waiting, "
                              f"filled in {filled:.0f} s", flush=True)  # fmt: skip
                        tenant_page = max(1, small[1] // TENANTS)
                        figures.append(asyncio.run(measure(store, modules, settled, tenant_page)))
                report(engine, *figures)


if __name__ == "__main__":
    main()
