"""HTTP benchmark: a trivial tool call through the API beside Starlette's own bare JSON echo
route on the same server, the latency of an event from its commit in a worker process to
an SSE client of the server, a call's latency on a kept-alive connection beside a fresh one's,
and the server's memory after keyed refusals.

Measured in one run:
  - calls: a uvicorn server (its own process, one core) serves ``create_app(runtime)`` with a
    bare Starlette JSON echo route added beside it. 4 concurrent clients on keep-alive
    connections (a minimal HTTP/1.1 client, so that client cost stays small and equal) send
    either ``POST /v1/tools/echo/calls`` (authenticated; the tool validates and returns its
    input) or ``POST /echo`` with the same body. Reported: requests per second of each, and the
    server's CPU time per request (from /proc), whose ratio is the API's cost against the
    framework's own. Also with an ``Idempotency-Key`` per call. Target: at most 1.5x
    (issue 32).
  - events: a worker process (its own runtime on the store) runs calls that suspend and are
    cancelled (3 committed events each); the server streams the run's events over SSE to a
    client here. Latency: arrival at the client minus the event's commit timestamp (set just
    before its transaction), median and p99, on SQLite and on PostgreSQL (``--postgres DSN`` or
    ``BLADE_BENCH_POSTGRES_DSN``, else a private cluster like the tests', when its binaries are
    installed; ``--engines sqlite`` leaves it out).

  - keep-alive: ``blade-runtime serve`` (as users run it) answers ``POST
    /v1/tools/echo/calls`` 50 times on one kept-alive httpx client, and 50 times each on a
    fresh connection. Reported: the median and p90 of each, and their ratio (issue 50.5: each
    kept-alive request once waited ~42 ms, Nagle meeting the client's delayed ACK; target: no
    worse than a fresh connection).
  - memory: ``blade-runtime serve`` over ``memory:`` receives 400 calls, each a 1 MB body the
    schema refuses, each with its own ``Idempotency-Key``; its resident memory (VmRSS) before
    and after, beside a fresh server given the same requests without a key (issue 48: +390 MB
    against +4 MB; target: the same as without keys).

Each call figure is the best of ``--rounds`` (default 3), routes alternating.

Usage: python bench/http.py [--seconds S] [--rounds R] [--events N] [--engines sqlite,postgres]
                            [--parts calls,events,keepalive,memory]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

# This file is bench/http.py: keep its folder off the import path, so that ``import http``
# (uvicorn, httpx, the standard library's own modules) finds the standard library's package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "blade_http_bench"
TOKEN = "bench-token"
DSN_ENV = "BLADE_BENCH_POSTGRES_DSN"
CLIENTS = 4
KEYS = itertools.count()  # every keyed request a new call
BODY = json.dumps({"text": "hello", "count": 3}).encode()

SPECS: dict[str, dict[str, Any]] = {
    "bench/echo.v1.json": {
        "id": "bench.echo.v1",
        "name": "echo",
        "description": "Return the input.",
        "sideEffect": "pure",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}, "count": {"type": "integer"}},
            "required": ["text"],
        },
        "outputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}, "count": {"type": "integer"}},
            "required": ["text"],
        },
    },
    "bench/wait.v1.json": {
        "id": "bench.wait.v1",
        "name": "wait",
        "description": "Suspend until answered.",
        "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "outputSchema": {"type": "object"},
        "suspend": {
            "answer": {
                "suspendSchema": {"type": "object"},
                "resumeSchema": {"type": "object"},
            }
        },
    },
}


# -- the package, the runtime, the server ------------------------------------------------------


def build_package(out: Path) -> None:
    from blade_codegen.build import build

    specs = out / "specs"
    for rel, spec in SPECS.items():
        (specs / rel).parent.mkdir(parents=True, exist_ok=True)
        (specs / rel).write_text(json.dumps(spec))
    build(specs, out / "pkg", PACKAGE)


def make_runtime(store_url: str) -> Any:
    from blade_runtime import Runtime
    from blade_runtime.stores.urls import open_store

    echo = __import__(f"{PACKAGE}.bench.echo_v1", fromlist=["x"])
    wait = __import__(f"{PACKAGE}.bench.wait_v1", fromlist=["x"])
    runtime = Runtime(store=open_store(store_url))

    async def echo_impl(ctx: Any) -> Any:
        return echo.EchoOutput.model_validate(ctx.input.model_dump(exclude_unset=True))

    async def wait_impl(ctx: Any) -> Any:
        ctx.suspend("answer", wait.WaitAnswerSuspend())

    runtime.register(echo.SPEC, echo_impl)
    runtime.register(wait.SPEC, wait_impl)
    return runtime


def serve(port: int, store_url: str) -> None:
    """The server process: the API with a bare echo route beside it."""
    import uvicorn
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from blade_runtime.core.caller import Principal
    from blade_runtime.serving.http import create_app

    principal = Principal("bench", "bench")

    # async: a dict lookup that never blocks runs on the loop (a plain function would run in a
    # worker thread: about 85 us more server CPU per request here, 1.84x the echo route)
    async def authenticate(request: Request) -> Principal | None:
        return principal if request.headers.get("authorization") == f"Bearer {TOKEN}" else None

    async def echo(request: Request) -> Response:
        return JSONResponse(await request.json())

    app = create_app(make_runtime(store_url), authenticate=authenticate, inbox=False)
    app.router.routes.append(Route("/echo", echo, methods=["POST"]))
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off"
    )
    uvicorn.Server(config).run()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def server_process(pkg: Path, store_url: str) -> Iterator[tuple[int, int]]:
    """(port, pid) of a server process over ``store_url``."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(pkg)}
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--store", store_url],
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the benchmark server did not start") from None
                time.sleep(0.05)
        yield port, process.pid
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- a minimal keep-alive HTTP/1.1 client ------------------------------------------------------


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return status, await reader.readexactly(length)


async def hammer(port: int, path: str, seconds: float, keyed: bool) -> int:
    """Requests completed by CLIENTS keep-alive connections in ``seconds``."""
    done = 0
    stop = time.monotonic() + seconds

    async def one_client() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.monotonic() < stop:
                key = f"Idempotency-Key: k{next(KEYS)}\r\n" if keyed else ""
                head = (
                    f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
                    f"Content-Type: application/json\r\n{key}Content-Length: {len(BODY)}\r\n\r\n"
                )
                writer.write(head.encode() + BODY)
                status, _ = await read_response(reader)
                if status != 200:
                    raise RuntimeError(f"{path} answered {status}")
                done += 1
        finally:
            writer.close()

    await asyncio.gather(*(one_client() for _ in range(CLIENTS)))
    return done


def measure_calls(pkg: Path, seconds: float, rounds: int) -> dict[str, Any]:
    routes = {"echo route": ("/echo", False), "tool call": ("/v1/tools/echo/calls", False)}
    routes["tool call + key"] = ("/v1/tools/echo/calls", True)
    best: dict[str, dict[str, float]] = {}
    with server_process(pkg, "memory:") as (port, pid):
        for path, keyed in routes.values():  # warm up every route
            asyncio.run(hammer(port, path, 0.5, keyed))
        for _ in range(rounds):
            for label, (path, keyed) in routes.items():
                before = cpu_seconds(pid)
                started = time.perf_counter()
                count = asyncio.run(hammer(port, path, seconds, keyed))
                wall = time.perf_counter() - started
                cpu = cpu_seconds(pid) - before
                kept = best.setdefault(label, {"rps": 0.0, "cpu_us": float("inf")})
                kept["rps"] = max(kept["rps"], count / wall)
                kept["cpu_us"] = min(kept["cpu_us"], cpu / count * 1e6)
    return best


# -- event latency -----------------------------------------------------------------------------


def worker(store_url: str, count: int, gap_s: float) -> None:
    """The worker process: calls that suspend and are cancelled, one every ``gap_s``."""

    from blade_runtime.core.caller import CallContext, Principal

    context = CallContext(principal=Principal("bench", "bench"))  # the stream's tenant

    async def main() -> None:
        runtime = make_runtime(store_url)
        for index in range(count):
            result = await runtime.call("wait", {"n": index}, run_id="latency", context=context)
            await runtime.cancel(result.action.action_id, "done")
            await asyncio.sleep(gap_s)
        await runtime.close()

    asyncio.run(main())


async def listen(port: int, expected: int, ready: asyncio.Event) -> list[float]:
    """Latencies (s) of ``expected`` events of the run, read from the SSE stream."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET /v1/runs/latency/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await reader.readuntil(b"\r\n\r\n")
    ready.set()
    latencies: list[float] = []
    try:
        while len(latencies) < expected:
            line = await asyncio.wait_for(reader.readline(), 30)
            text = line.split(b"data: ", 1)
            if len(text) == 2 and text[1].startswith(b"{"):
                arrived = time.time()
                at = json.loads(text[1])["at"]
                latencies.append(arrived - datetime.fromisoformat(at).timestamp())
    finally:
        writer.close()
    return latencies


def measure_events(pkg: Path, store_url: str, count: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(pkg)}
    with server_process(pkg, store_url) as (port, _):

        async def main() -> list[float]:
            await seed(port)  # the stream is a tenant's: the run holds one of its calls
            ready = asyncio.Event()
            listener = asyncio.ensure_future(listen(port, count * 3, ready))
            await ready.wait()
            process = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--worker", store_url, "--events", str(count), env=env
            )
            await process.wait()
            return await listener

        latencies = asyncio.run(main())
    latencies.sort()
    return {
        "events": len(latencies),
        "median_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[max(0, int(len(latencies) * 0.99) - 1)] * 1000,
    }


async def seed(port: int) -> None:
    """One call of the bench principal in the run, so that its stream exists for it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"n": -1}'
    writer.write(
        f"POST /v1/tools/wait/calls?run_id=latency HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    )
    status, _ = await read_response(reader)
    writer.close()
    if status != 202:
        raise RuntimeError(f"seeding the run answered {status}")


@contextlib.contextmanager
def postgres_database(dsn: str | None) -> Iterator[str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from postgres import server, temporary_database  # type: ignore[import-not-found]

    with server(dsn) as url, temporary_database(url, f"blade_http_bench_{os.getpid()}") as db:
        yield str(db)


# -- blade-runtime serve: keep-alive latency, memory after refusals ----------------------------

SERVED = f"""
import importlib.util

from blade_runtime.core.caller import Principal

_spec = importlib.util.spec_from_file_location("http_bench", {str(Path(__file__).resolve())!r})
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
PRINCIPAL = Principal("bench", "bench")


def factory(store):
    return _bench.make_runtime(store.url)


def authenticate(request):
    return PRINCIPAL if request.headers.get("authorization") == "Bearer {TOKEN}" else None
"""


@contextlib.contextmanager
def blade_serve(pkg: Path, folder: Path) -> Iterator[tuple[str, int]]:
    """(base URL, pid) of ``blade-runtime serve`` over ``memory:``, as users run it."""
    (folder / "http_bench_served.py").write_text(SERVED)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pkg), str(folder)])}
    command = [str(Path(sys.executable).parent / "blade-runtime"), "serve"]
    process = subprocess.Popen(
        [
            *command,
            *("http_bench_served:factory", "--auth", "http_bench_served:authenticate"),
            *("--store", "memory:", "--port", str(port)),
        ],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,  # uvicorn's access log
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/v1/tools", headers={"Authorization": f"Bearer {TOKEN}"})
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("blade-runtime serve did not start") from None
                time.sleep(0.1)
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(20)


def measure_keepalive(pkg: Path, folder: Path, count: int = 50) -> dict[str, list[float]]:
    import httpx

    headers = {"Authorization": f"Bearer {TOKEN}"}
    times: dict[str, list[float]] = {"kept alive": [], "fresh": []}

    def timed(http: httpx.Client) -> float:
        started = time.perf_counter()
        answer = http.post("/v1/tools/echo/calls", content=BODY, headers=headers | JSON)
        if answer.status_code != 200:
            raise RuntimeError(f"the call answered {answer.status_code}: {answer.text}")
        return (time.perf_counter() - started) * 1000

    with blade_serve(pkg, folder) as (url, _), httpx.Client(base_url=url) as alive:
        timed(alive)
        for _ in range(count):
            times["kept alive"].append(timed(alive))
            with httpx.Client(base_url=url) as once:
                times["fresh"].append(timed(once))
    return times


JSON = {"Content-Type": "application/json"}
REFUSED = json.dumps({"text": "x" * 999_000, "count": "not a number"}).encode()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def measure_memory(pkg: Path, folder: Path, count: int = 400) -> dict[str, tuple[float, float]]:
    """(before, after) resident MB of a fresh server per kind of request."""
    import httpx

    def send(http: httpx.Client, n: int, keyed: bool) -> None:
        for _ in range(n):
            headers = {"Authorization": f"Bearer {TOKEN}", **JSON}
            if keyed:
                headers["Idempotency-Key"] = f"k{next(KEYS)}"
            answer = http.post("/v1/tools/echo/calls", content=REFUSED, headers=headers)
            if answer.status_code != 422:
                raise RuntimeError(f"a refusal answered {answer.status_code}")

    figures = {}
    for label, keyed in (("without a key", False), ("each keyed", True)):
        with blade_serve(pkg, folder) as (url, pid), httpx.Client(base_url=url) as http:
            send(http, 20, keyed)  # the allocator's arenas for a 1 MB body, warm
            before = rss_mb(pid)
            send(http, count, keyed)
            figures[label] = (before, rss_mb(pid))
    return figures


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


# -- main --------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=100, help="calls (3 events each)")
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--postgres", default=os.environ.get(DSN_ENV))
    parser.add_argument("--parts", default="calls,events,keepalive,memory")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.store)
        return 0
    if args.worker is not None:
        worker(args.worker, args.events, 0.02)
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        build_package(out)
        pkg = out / "pkg"
        sys.path.insert(0, str(pkg))
        parts = args.parts.split(",")
        if "calls" in parts:
            calls = measure_calls(pkg, args.seconds, args.rounds)
            echo = calls["echo route"]
            best = f"best of {args.rounds} x {args.seconds} s"
            print(f"calls over HTTP: {CLIENTS} keep-alive clients, {best}")
            for label, figure in calls.items():
                print(
                    f"  {label:16} {figure['rps']:8.0f} req/s"
                    f"  {figure['cpu_us']:7.1f} us server CPU"
                    f"  ratio {figure['cpu_us'] / echo['cpu_us']:.2f}x CPU,"
                    f" {echo['rps'] / figure['rps']:.2f}x time"
                )
            ratio = calls["tool call"]["cpu_us"] / echo["cpu_us"]
            print(
                f"  target: a tool call at most 1.5x the echo route's server CPU: {ratio:.2f}x "
                f"({'met' if ratio <= 1.5 else 'NOT met'})"
            )

        if "events" in parts:
            engines = args.engines.split(",")
            print(
                "event latency, commit in a worker process -> SSE client "
                f"({args.events * 3} events)"
            )
            if "sqlite" in engines:
                url = f"sqlite:///{out / 'events.db'}"
                make_runtime(url).store.close()  # create the schema before the processes race
                figure = measure_events(pkg, url, args.events)
                print(
                    f"  SQLite      median {figure['median_ms']:6.1f} ms"
                    f"  p99 {figure['p99_ms']:6.1f} ms"
                )
            if "postgres" in engines:
                try:
                    with postgres_database(args.postgres) as url:
                        make_runtime(url).store.close()
                        figure = measure_events(pkg, url, args.events)
                    print(
                        f"  PostgreSQL  median {figure['median_ms']:6.1f} ms"
                        f"  p99 {figure['p99_ms']:6.1f} ms"
                    )
                except (RuntimeError, OSError, ImportError) as error:
                    print(f"  PostgreSQL  not measured: {error}")
        if "keepalive" in parts:
            times = measure_keepalive(pkg, out)
            print("a call's latency on blade-runtime serve, 50 calls each")
            for label, values in times.items():
                print(
                    f"  {label:11} median {statistics.median(values):6.2f} ms"
                    f"  p90 {percentile(values, 0.9):6.2f} ms"
                )
            ratio = statistics.median(times["kept alive"]) / statistics.median(times["fresh"])
            print(
                f"  kept alive / fresh: {ratio:.2f}x (target: at most 1x; "
                f"{'met' if ratio <= 1.0 else 'NOT met'})"
            )
        if "memory" in parts:
            figures = measure_memory(pkg, out)
            print("blade-runtime serve's resident memory, 400 calls each a refused 1 MB body")
            grown = {}
            for label, (before, after) in figures.items():
                grown[label] = after - before
                print(
                    f"  {label:13} {before:6.0f} MB -> {after:6.0f} MB ({after - before:+.0f} MB)"
                )
            extra = grown["each keyed"] - grown["without a key"]
            print(
                f"  the keys' cost: {extra:+.0f} MB (target: none beyond noise, under 10 MB: "
                f"{'met' if extra < 10 else 'NOT met'})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
