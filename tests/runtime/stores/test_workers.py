"""Many worker processes over one durable store: claimed re-entry, leases, the recovery loop,
expiry, events across processes; and a redacting post hook on every store.

Workers are real processes (``tests/process_worker.py``, forked by ``tests/forked.py`` from a
server that imported the runtime once), each opening the store by its URL.
Every entry of an implementation appends one line to a shared file (O_APPEND), so the tests
count what ran, in whichever process. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import forked
import process_worker
import pytest
from process_worker import SPECS, Tools

from blade_runtime.core import actions
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolResult, ToolSuccess
from blade_runtime.core.store import Store, StoreError
from blade_runtime.runtime import Runtime
from blade_runtime.serving import cli
from blade_runtime.stores.memory import MemoryStore
from blade_runtime.stores.sql import SQLStore
from blade_runtime.stores.urls import open_store

DURABLE = ("sqlite", "postgres")
BIN = Path(sys.executable).parent


def run(coroutine: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coroutine

    return asyncio.run(main())


@pytest.fixture(scope="session")
def worker_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test tools of ``process_worker.SPECS`` built into ``blade_workers`` and importable."""
    from blade_codegen.build import build

    root = tmp_path_factory.mktemp("workers")
    for spec in SPECS.values():
        path = root / "specs" / "work" / f"{spec['name']}.v1.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(spec), "utf-8")
    build(root / "specs", root / "out", process_worker.PACKAGE)
    out = root / "out"
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return out


@pytest.fixture(params=DURABLE)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh durable store, by URL: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        path = f"sqlite:///{tmp_path / 'workers.db'}"
        open_store(path).close()  # created (and migrated) before any worker opens it
        return path
    url: str = request.getfixturevalue("postgres_url")
    return url


@dataclass
class Cluster:
    """The worker processes of one test, their shared files, and helpers to read them."""

    url: str
    folder: Path
    procs: list[forked.Forked]

    @property
    def entries_file(self) -> Path:
        return self.folder / "entries"

    @property
    def go(self) -> Path:
        return self.folder / "go"

    @property
    def stop(self) -> Path:
        return self.folder / "stop"

    @property
    def ready(self) -> Path:
        return self.folder / "ready"

    def spawn(self, **config: Any) -> forked.Forked:
        """A worker with ``config`` (see process_worker.main); store and files filled in."""
        config = {
            "store": self.url,
            "entries": str(self.entries_file),
            "ready": str(self.ready),
            **config,
        }
        proc = forked.start(self.folder, process_worker.run, config)
        self.procs.append(proc)
        return proc

    def entries(self) -> list[tuple[str, str, str, int]]:
        """(call id, entry, tool, pid) of every recorded entry, in the order written."""
        if not self.entries_file.exists():
            return []
        found = []
        for line in self.entries_file.read_text().splitlines():
            call_id, entry, tool, pid = line.split()
            found.append((call_id, entry, tool, int(pid)))
        return found

    def ready_count(self) -> int:
        return len(self.ready.read_text().splitlines()) if self.ready.exists() else 0

    def start(self, count: int) -> None:
        """Wait until ``count`` workers are ready, then let them all go at once."""
        wait_until(lambda: self.ready_count() >= count, 60, f"{count} workers ready", self)
        self.go.touch()

    def results(self, proc: forked.Forked, timeout: float = 30) -> list[dict[str, Any]]:
        """The worker's result lines once it exited cleanly."""
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"worker {proc.pid} exited {proc.returncode}: {err}"
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def kill(self, proc: forked.Forked) -> None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)


@pytest.fixture
def cluster(store_url: str, worker_package: Path, tmp_path: Path) -> Iterator[Cluster]:
    """The workers of a test; ``worker_package`` puts the test tools on their import path."""
    folder = tmp_path / "shared"
    folder.mkdir()
    workers = Cluster(store_url, folder, [])
    try:
        yield workers
    finally:
        workers.close()


def wait_until(
    done: Callable[[], bool], limit_s: float, what: str, workers: Cluster | None = None
) -> None:
    """Poll ``done`` until it holds; fail naming ``what`` after ``limit_s`` (or when a worker
    died with an error)."""
    deadline = time.monotonic() + limit_s
    while not done():
        if workers is not None:
            for proc in workers.procs:
                if proc.poll() not in (None, 0, -signal.SIGKILL):
                    _, err = proc.communicate()
                    pytest.fail(f"worker {proc.pid} exited {proc.returncode}: {err}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {limit_s} s waiting for {what}")
        time.sleep(0.02)


def local_runtime(
    workers: Cluster, *, lease_s: float = 5.0, host: str | None = None, **register: Any
) -> tuple[Runtime, Store]:
    """A runtime in the test process over the cluster's store, with the same tools."""
    store = open_store(workers.url)
    runtime = Runtime(store=store, lease_s=lease_s, host=host)
    Tools(workers.entries_file).register(runtime, **register)
    return runtime, store


def suspend_calls(runtime: Runtime, tool: str, count: int, prefix: str) -> list[ToolPending]:
    async def all_of() -> list[ToolResult[Any]]:
        return [
            await runtime.call(tool, {"n": i, "suspend": True}, call_id=f"{prefix}{i}")
            for i in range(count)
        ]

    results: list[ToolResult[Any]] = run(all_of())
    waiting = [r for r in results if isinstance(r, ToolPending)]
    assert len(waiting) == count, results
    return waiting


def operator_submit(url: str, action_id: str, payload: Any, *, check: bool = True) -> int:
    """What ``blade-runtime pending submit ACTION JSON --store URL`` does (its code, in this
    process): validate, resolve with no owner, the call is left resumable. Its exit code."""
    code = cli.main(["pending", "submit", action_id, json.dumps(payload), "--store", url])
    assert code == 0 or not check
    return code


def resumes(workers: Cluster) -> Counter[str]:
    return Counter(call_id for call_id, entry, _, _ in workers.entries() if entry == "resume")


def settled(store: Store, call_ids: list[str]) -> bool:
    return all((c := store.call(i)) is not None and c.state == "settled" for i in call_ids)


# -- 1. four processes recovering at once ------------------------------------------------------


def test_every_module_the_fork_server_preloads_imports() -> None:
    # multiprocessing skips a preload that fails to import: a misspelt name would only cost
    # every worker its imports again, silently.
    for name in forked.PRELOAD:
        importlib.import_module(name)


def test_four_processes_recovering_at_once_resume_each_submitted_call_exactly_once(
    cluster: Cluster,
) -> None:
    runtime, store = local_runtime(cluster)
    waiting = suspend_calls(runtime, "charge", 20, "c")
    for pending in waiting:
        operator_submit(cluster.url, pending.action.action_id, {"approved": True})
    assert {c.state for c in store.calls()} == {"resumable"}
    procs = [cluster.spawn(go=str(cluster.go), recover_once=True) for _ in range(4)]
    cluster.start(4)
    results = [r for proc in procs for r in cluster.results(proc)]

    call_ids = [p.call.call_id for p in waiting]
    assert sorted(r["call_id"] for r in results) == sorted(call_ids)  # each taken up once
    assert all(r["status"] == "success" for r in results), results
    assert resumes(cluster) == Counter(call_ids)  # 20 resume entries, one per call
    assert settled(store, call_ids)
    for call_id in call_ids:
        record = store.call(call_id)
        assert record is not None
        assert record.result == {
            "status": "success",
            "content": {"n": int(call_id[1:]), "entry": "resume", "note": "ok"},
        }
    run(runtime.close())
    store.close()


# -- 2. a worker killed while it holds a lease -------------------------------------------------

THREE = [("k-charge", "charge"), ("k-sync", "sync"), ("k-fetch", "fetch")]


def start_hanging(workers: Cluster, lease_s: float, host: str) -> forked.Forked:
    """A worker whose three calls (one per side effect) block in their implementation; returns
    once all three entries ran, their starts committed under the worker's lease."""
    proc = workers.spawn(
        lease_s=lease_s,
        host=host,
        hang=["charge", "sync", "fetch"],
        calls=[[call_id, tool, {"n": 1}] for call_id, tool in THREE],
    )
    wait_until(lambda: len(workers.entries()) == 3, 30, "three blocked entries", workers)
    return proc


def assert_contract(workers: Cluster, store: Store, victim: int) -> None:
    """The side-effect contract after the victim died in all three calls."""
    charge, sync, fetch = (store.call(call_id) for call_id, _ in THREE)
    assert charge is not None and sync is not None and fetch is not None
    interrupted: Any = charge.result
    assert interrupted == {
        "status": "error",
        "code": "INTERRUPTED",
        "message": interrupted["message"],
    }
    assert "reconcile" in interrupted["message"]
    for replayed in (sync, fetch):
        assert replayed.state == "settled"
        assert replayed.result == {
            "status": "success",
            "content": {"n": 1, "entry": "initial", "note": "ok"},
        }
    by_call = Counter((call_id, pid == victim) for call_id, _, _, pid in workers.entries())
    assert by_call == {
        ("k-charge", True): 1,  # ran once, in the victim; never again
        ("k-sync", True): 1,
        ("k-sync", False): 1,  # replayed once, elsewhere
        ("k-fetch", True): 1,
        ("k-fetch", False): 1,
    }


def test_a_killed_worker_s_calls_are_taken_after_its_lease_by_the_contract(
    cluster: Cluster,
) -> None:
    lease_s = 3.0
    victim = start_hanging(cluster, lease_s, host="host-a")
    cluster.kill(victim)
    runtime, store = local_runtime(cluster, lease_s=lease_s, host="host-b")
    leases = {call_id: store.call(call_id) for call_id, _ in THREE}
    expiry = max(c.lease_until for c in leases.values() if c is not None)
    assert all(c is not None and c.state == "running" for c in leases.values())
    early = run(runtime.recover())
    checked_at = time.time()
    postgres = cluster.url.startswith("postgresql")
    if not postgres:
        # Another host's pid cannot be checked: on SQLite only the lease frees the calls.
        assert checked_at < expiry, "the sweep came too late to test the lease (overloaded?)"
        assert early == [], "a sweep took calls whose lease had not expired"
    taken: list[ToolResult[Any]] = list(early)
    deadline = time.monotonic() + lease_s + 10
    while len(taken) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        taken += run(runtime.recover())
    assert sorted(r.call.call_id for r in taken) == sorted(c for c, _ in THREE)
    if not postgres:
        assert time.time() >= expiry
    interrupted = next(r for r in taken if r.call.call_id == "k-charge")
    assert isinstance(interrupted, ToolError) and interrupted.code == ErrorCode.INTERRUPTED
    assert_contract(cluster, store, victim.pid)
    assert run(runtime.recover()) == []  # nothing left to take
    run(runtime.close())
    store.close()


# -- 3. two hosts, one killed ------------------------------------------------------------------


def test_the_surviving_host_recovers_the_dead_host_s_calls(cluster: Cluster) -> None:
    postgres = cluster.url.startswith("postgresql")
    # On PostgreSQL the dead host's advisory lock is released with its session: a lease far
    # longer than the wait below shows that death is seen without waiting for the lease.
    lease_s = 60.0 if postgres else 1.0
    survivor = cluster.spawn(lease_s=lease_s, host="host-b", loop=0.2, stop=str(cluster.stop))
    victim = start_hanging(cluster, lease_s, host="host-a")
    store = open_store(cluster.url)
    cluster.kill(victim)
    killed_at = time.time()
    ids = [call_id for call_id, _ in THREE]
    wait_until(lambda: settled(store, ids), 15, "the survivor's recovery", cluster)
    if postgres:
        assert time.time() < killed_at + lease_s  # sooner than the lease: the lock said dead
    assert survivor.poll() is None  # it recovered them while it kept running
    replays = [pid for call_id, _, _, pid in cluster.entries() if pid != victim.pid]
    assert replays == [survivor.pid, survivor.pid]
    assert_contract(cluster, store, victim.pid)
    cluster.stop.touch()
    assert cluster.results(survivor) == []  # the loop's results are in the store
    store.close()


def test_a_postgresql_restart_does_not_make_live_runtimes_look_dead(
    worker_package: Path, tmp_path: Path
) -> None:
    """A restart ends every session, the live runtimes' lock sessions too: a free lock then
    proves nothing. Another host's sweep after it takes none of a live runtime's calls (it
    took both, running the idempotent one twice and settling the other INTERRUPTED while it
    ran), and the live runtime's next renewal attaches it again (its lock is held)."""
    from postgres import start_cluster, temporary_database

    server = start_cluster()
    entries = tmp_path / "entries"

    async def scenario(url: str) -> tuple[list[Any], list[Any], bool | None]:
        stores = open_store(url), open_store(url)
        live = Runtime(store=stores[0], lease_s=3.0, host="host-a")
        other = Runtime(store=stores[1], lease_s=3.0, host="host-b")
        for runtime in (live, other):
            Tools(entries).register(runtime)
        running = [
            asyncio.create_task(live.call(name, {"n": 1, "sleep_ms": 3500}, call_id=f"c-{name}"))
            for name in ("sync", "charge")
        ]
        await asyncio.sleep(0.5)
        await asyncio.to_thread(server.restart)
        await asyncio.sleep(1.5)  # a renewal (every lease/3 s) meanwhile: it attaches again
        swept = []
        for _ in range(20):  # each pooled connection the restart cut fails once
            try:
                swept = await other.recover()
                break
            except StoreError:
                await asyncio.sleep(0.1)
        alive = stores[1].alive(live.owner)
        results = await asyncio.gather(*running)
        await live.close()
        await other.close()
        for store in stores:
            store.close()
        return swept, results, alive

    try:
        with temporary_database(server.url, "restarted") as url:
            swept, results, alive = run(scenario(url))
    finally:
        server.stop()
    assert swept == [] and alive is True
    assert [r.status for r in results] == ["success", "success"]
    assert sorted(line.split()[0] for line in entries.read_text().splitlines()) == [
        "c-charge",
        "c-sync",
    ]  # each entered once


# -- 4. a submit racing a recovery sweep -------------------------------------------------------


def test_a_submit_racing_recovery_sweeps_and_an_operator_re_enters_once(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime, store = local_runtime(cluster)
    waiting = suspend_calls(runtime, "charge", 30, "r")
    action_ids = [p.action.action_id for p in waiting]
    call_ids = [p.call.call_id for p in waiting]
    common = {"go": str(cluster.go), "stop": str(cluster.stop)}
    submitter = cluster.spawn(
        submits=[[a, {"approved": True, "note": "runtime"}] for a in action_ids], **common
    )
    sweepers = [cluster.spawn(sweep=True, limit=1, **common) for _ in range(2)]
    cluster.start(3)
    operator_won = set()
    for action_id in reversed(action_ids):  # from the other end: they race in the middle
        action = store.action(action_id)
        assert action is not None
        if action.state != "pending":
            continue  # what the CLI checks first
        resolution, event = actions.resumption(action, {"approved": True, "note": "operator"}, None)
        with contextlib.suppress(StoreError):  # the runtime's submit won the compare-and-set
            store.resolve(action_id, resolution, event)
            operator_won.add(action_id)
        time.sleep(0.004)  # about the pace of the runtime's submits
    wait_until(lambda: settled(store, call_ids), 20, "every call settled", cluster)
    cluster.stop.touch()
    submitted = {r["call_id"]: r for r in cluster.results(submitter)}
    swept = [r for proc in sweepers for r in cluster.results(proc)]
    capsys.readouterr()

    assert resumes(cluster) == Counter(call_ids)  # exactly one re-entry per call
    by_call = {call_id: pid for call_id, entry, _, pid in cluster.entries() if entry == "resume"}
    for pending in waiting:
        call_id, action_id = pending.call.call_id, pending.action.action_id
        record = store.call(call_id)
        assert record is not None and record.state == "settled"
        content: Any = record.result["content"]  # type: ignore[index,call-overload]
        if action_id in operator_won:  # resumable: one sweeper claimed and resumed it
            assert submitted[call_id]["code"] == "ACTION_ALREADY_RESOLVED"
            assert by_call[call_id] in {p.pid for p in sweepers}
            assert content["note"] == "operator"
        else:  # the runtime's submit claimed it with the resolve: no sweep could take it
            assert submitted[call_id]["status"] == "success"
            assert by_call[call_id] == submitter.pid
            assert content["note"] == "runtime"
    print(f"the operator won {len(operator_won)} of 30, the runtime's submit the others")
    assert sorted(r["call_id"] for r in swept) == sorted(
        p.call.call_id for p in waiting if p.action.action_id in operator_won
    )
    run(runtime.close())
    store.close()


# -- 5. an operator's CLI submit taken up by a live worker's loop ------------------------------


def test_an_operator_cli_submit_is_taken_up_by_a_live_worker_loop(cluster: Cluster) -> None:
    worker = cluster.spawn(loop=0.2, stop=str(cluster.stop))
    wait_until(lambda: cluster.ready_count() == 1, 30, "the worker's loop", cluster)
    runtime, store = local_runtime(cluster)
    [pending] = suspend_calls(runtime, "sync", 1, "cli")
    time.sleep(0.5)  # the loop sweeps meanwhile: a suspended call is not its to take
    record = store.call("cli0")
    assert record is not None and record.state == "suspended"
    done = subprocess.run(
        [
            str(BIN / "blade-runtime"),
            "pending",
            "submit",
            pending.action.action_id,
            '{"approved": true, "note": "from the cli"}',
            "--store",
            cluster.url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    wait_until(lambda: settled(store, ["cli0"]), 10, "the loop to resume the call", cluster)
    assert worker.poll() is None  # no restart
    record = store.call("cli0")
    assert record is not None and record.result == {
        "status": "success",
        "content": {"n": 0, "entry": "resume", "note": "from the cli"},
    }
    assert [(e, pid) for c, e, _, pid in cluster.entries()] == [
        ("initial", os.getpid()),
        ("resume", worker.pid),
    ]
    cluster.stop.touch()
    cluster.results(worker)
    run(runtime.close())
    store.close()


# -- 6. hundreds of calls through four workers with random SIGKILLs ----------------------------


def test_three_hundred_calls_through_four_workers_killed_at_random(cluster: Cluster) -> None:
    rng = random.Random(12)
    tools = ["charge", "sync", "fetch"]
    plan: dict[int, list[list[Any]]] = {w: [] for w in range(4)}
    side: dict[str, str] = {}
    for i in range(300):
        tool = tools[i % 3]
        arguments = {"n": i, "sleep_ms": rng.randrange(50, 300), "suspend": i % 4 == 0}
        call_id = f"m{i}"
        side[call_id] = tool
        plan[i % 4].append([call_id, tool, arguments])
    config = {
        "lease_s": 0.6,
        "loop": 0.2,
        "skip_known": True,  # a restarted worker calls again only what was never recorded
        "concurrency": 3,
        "stop": str(cluster.stop),
        "max_s": 120,
    }
    workers = {w: cluster.spawn(calls=plan[w], **config) for w in range(4)}
    store = open_store(cluster.url)
    kills = 0
    started = time.monotonic()
    next_kill = started + 60.0  # the first once calls are under way

    def everything_settled() -> bool:
        answer_pending(cluster, store)
        return len(store.calls(["settled"])) == 300

    deadline = started + 90  # about 10 s on an idle machine
    while not everything_settled():
        now = time.monotonic()
        if kills == 0 and next_kill > now + 1 and len(cluster.entries()) >= 20:
            next_kill = now
        assert now < deadline, f"not settled: {Counter(c.state for c in store.calls())}"
        if kills < 6 and now >= next_kill:
            w = rng.randrange(4)
            cluster.kill(workers[w])
            workers[w] = cluster.spawn(calls=plan[w], **config)
            kills += 1
            next_kill = now + rng.uniform(0.2, 0.5)
        for proc in workers.values():
            assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.05)
    cluster.stop.touch()
    for proc in workers.values():
        cluster.results(proc, timeout=60)

    entries = Counter((call_id, entry) for call_id, entry, _, _ in cluster.entries())
    interrupted = replayed = 0
    for call_id, tool in side.items():
        record = store.call(call_id)
        assert record is not None and record.state == "settled", (call_id, record)  # not lost
        result: Any = record.result
        n = int(call_id[1:])
        suspends = n % 4 == 0
        if tool == "charge":  # never run twice: each entry at most once
            assert entries[(call_id, "initial")] <= 1 and entries[(call_id, "resume")] <= 1
            if result["status"] == "error":
                assert result["code"] == "INTERRUPTED", (call_id, result)
                interrupted += 1
                continue
        assert result["status"] == "success", (call_id, result)
        expected = "resume" if suspends else "initial"
        assert result["content"] == {"n": n, "entry": expected, "note": "ok"}
        assert entries[(call_id, expected)] >= 1
        replayed += entries[(call_id, expected)] > 1
    assert store.calls(["running", "resumable", "suspended", "pending"]) == []  # none left
    assert store.actions() == []
    assert kills == 6
    print(f"kills {kills}, non_idempotent interrupted {interrupted}, replayed {replayed}")
    assert interrupted + replayed > 0  # kills hit running calls, and the contract held
    store.close()


def answer_pending(workers: Cluster, store: Store) -> None:
    """An operator answering every pending approval as the CLI does (no owner: resumable)."""
    for action in store.actions():
        resolution, event = actions.resumption(action, {"approved": True}, owner=None)
        with contextlib.suppress(StoreError):  # resolved meanwhile: not here, one operator
            store.resolve(action.action_id, resolution, event)


# -- 7. expiry under racing workers ------------------------------------------------------------


def test_an_expired_action_settles_once_as_timeout_whoever_sweeps_and_a_late_submit_is_refused(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    procs = [cluster.spawn(loop=0.05, stop=str(cluster.stop)) for _ in range(4)]
    wait_until(lambda: cluster.ready_count() == 4, 60, "four sweeping workers", cluster)
    # A client tool's timeout, and a suspend point's expiresAfterMs as the generated code has it.
    runtime, store = local_runtime(cluster, client_timeout_ms=500)
    remind = importlib.import_module(f"{process_worker.PACKAGE}.work.remind_v1")
    assert remind.SPEC.suspend["approval"].expires_after_ms == process_worker.EXPIRES_AFTER_MS

    async def open_both() -> list[ToolResult[Any]]:
        return [
            await runtime.call("ask", {"question": "Ship it?"}, call_id="x-ask", run_id="x"),
            await runtime.call("remind", {"n": 1, "suspend": True}, call_id="x-remind", run_id="x"),
        ]

    waiting = run(open_both())
    assert all(isinstance(w, ToolPending) for w in waiting), waiting
    ids = ["x-ask", "x-remind"]
    wait_until(lambda: settled(store, ids), 15, "the workers to expire both actions", cluster)
    assert all(proc.poll() is None for proc in procs)
    results = [e for e in store.events("x") if e.kind == "result"]
    assert sorted(e.call_id for e in results) == ids  # settled once each
    for pending in waiting:
        assert isinstance(pending, ToolPending)
        action = store.action(pending.action.action_id)
        assert action is not None and action.state == "expired"
        record = store.call(pending.call.call_id)
        assert record is not None and record.result == {
            "status": "error",
            "code": "TIMEOUT",
            "message": "Nobody answered the pending action before its deadline, so the tool "
            "call timed out.",
        }
        late = run(runtime.submit(pending.action.action_id, {"answer": "yes", "approved": True}))
        assert isinstance(late, ToolError) and late.code == ErrorCode.ACTION_ALREADY_RESOLVED
        assert f"{pending.action.action_id} expired at {action.resolved_at}" in late.message
        assert "settled as TIMEOUT" in late.message
        refused = operator_submit(cluster.url, pending.action.action_id, {}, check=False)
        assert refused == cli.EXIT_REFUSED and "expired" in capsys.readouterr().err
    assert [e[1] for e in cluster.entries()] == ["initial"]  # the suspension never resumed
    assert len([e for e in store.events("x") if e.kind == "result"]) == 2
    cluster.stop.touch()
    for proc in procs:
        cluster.results(proc)
    run(runtime.close())
    store.close()


# -- 8. a redacting post hook, on every store --------------------------------------------------

SECRET = "sk-live-4f9a2b7c"


@pytest.fixture(params=("memory", "sqlite", "postgres"))
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        store: Store = MemoryStore()
    elif request.param == "sqlite":
        store = open_store(tmp_path / "hooks.db")
    else:
        store = open_store(request.getfixturevalue("postgres_url"))
    try:
        yield store
    finally:
        store.close()


WITHHELD = "The result was withheld: it holds a credential."


def redacted_calls(store: Store, entries: Path) -> tuple[list[Any], list[Any]]:
    """Calls whose outputs hold SECRET, under a post hook that redacts it (and one that aborts
    the results of ``sync``): plain, through the typed client, resumed, typed and resumed,
    aborted. Returns the five results and the events a subscription received."""
    from blade_runtime.core.hooks import HookInput, HookOutput

    Client = importlib.import_module(f"{process_worker.PACKAGE}.client").Client
    charge_v1 = importlib.import_module(f"{process_worker.PACKAGE}.work.charge_v1")
    fetch_v1 = importlib.import_module(f"{process_worker.PACKAGE}.work.fetch_v1")

    runtime = Runtime(store=store)
    Tools(entries, note=SECRET).register(runtime)

    async def redact(event: HookInput) -> HookOutput | None:
        output = event.output
        if isinstance(output, dict) and output.get("note") == SECRET:
            return HookOutput(modified_output={**output, "note": "[redacted]"})
        return None

    async def abort(event: HookInput) -> HookOutput:
        return HookOutput(action="abort", reason=WITHHELD)

    runtime.on("post_tool_use", redact)
    runtime.on("post_tool_use", abort, tools=["sync"])
    client = Client(runtime)

    async def scenario() -> tuple[list[Any], list[Any]]:
        events = runtime.subscribe("h")
        views: list[Any] = [
            await runtime.call("fetch", {"n": 1}, call_id="h-plain", run_id="h"),
            await client.fetch(fetch_v1.FetchInput(n=2), call_id="h-typed", run_id="h"),
        ]
        waiting = await runtime.call("charge", {"n": 3, "suspend": True}, call_id="h-s", run_id="h")
        assert isinstance(waiting, ToolPending)
        views.append(await runtime.submit(waiting.action.action_id, {"approved": True}))
        typed = await client.charge(
            charge_v1.ChargeInput(n=4, suspend=True), call_id="h-ts", run_id="h"
        )
        assert typed.status == "pending", typed
        views.append(await typed.action.submit(charge_v1.ChargeApprovalResume(approved=True)))
        aborted = await runtime.call("sync", {"n": 5, "suspend": True}, call_id="h-a", run_id="h")
        assert isinstance(aborted, ToolPending)
        views.append(await runtime.submit(aborted.action.action_id, {"approved": True}))
        events.close()
        return views, [event async for event in events]

    views, streamed = run(scenario())
    run(runtime.close())
    return views, streamed


def test_a_redacting_post_hook_leaves_the_secret_in_no_store_event_or_stream(
    any_store: Store, worker_package: Path, tmp_path: Path
) -> None:
    views, streamed = redacted_calls(any_store, tmp_path / "entries")
    plain, typed, resumed, typed_resumed, aborted = views
    for result in (plain, resumed):
        assert isinstance(result, ToolSuccess)
        content: Any = result.content
        assert content["note"] == "[redacted]"  # the hook ran on every path
    assert typed.status == "success" and typed_resumed.status == "success"
    assert isinstance(aborted, ToolError) and aborted.code == ErrorCode.HOOK_ABORTED
    assert aborted.message == WITHHELD
    recorded = {c.call_id: c.result for c in any_store.calls(run_id="h")}
    assert recorded["h-a"] == {"status": "error", "code": "HOOK_ABORTED", "message": WITHHELD}
    assert recorded["h-s"] == {
        "status": "success",
        "content": {"n": 3, "entry": "resume", "note": "[redacted]"},
    }
    results = [e.payload for e in streamed if e.kind == "result"]
    assert len(results) == 5 and results[-1] == recorded["h-a"]

    def shown(value: Any) -> str:
        return json.dumps(value, default=repr)

    assert SECRET not in shown(recorded), "the stored calls"
    assert SECRET not in shown([e.payload for e in any_store.events("h")]), "the stored events"
    assert SECRET not in shown([e.payload for e in streamed]), "the subscription"
    assert SECRET not in shown([plain.content, resumed.content]), "the results' content"


def test_a_redacting_post_hook_leaves_the_secret_out_of_the_typed_client_s_view(
    any_store: Store, worker_package: Path, tmp_path: Path
) -> None:
    views, _ = redacted_calls(any_store, tmp_path / "entries")
    _, typed, _, typed_resumed, _ = views
    assert typed.status == "success" and typed_resumed.status == "success"
    for view in (typed, typed_resumed):
        assert SECRET not in view.model_dump_json(), "the typed client's view"
        assert view.output.note == "[redacted]"


# -- 9. events across processes ----------------------------------------------------------------


def test_a_subscription_receives_another_process_s_events_in_commit_order_and_resumes(
    cluster: Cluster,
) -> None:
    runtime, store = local_runtime(cluster)

    async def take(subscription: Any, count: int) -> list[Any]:
        got: list[Any] = []

        async def read() -> None:
            async for event in subscription:
                got.append(event)
                if len(got) == count:
                    return

        await asyncio.wait_for(read(), 20)
        return got

    async def scenario() -> tuple[list[Any], list[Any], int]:
        subscription = runtime.subscribe("ev")
        for w in range(3):  # three processes committing events of the run at once
            calls = [[f"e{w}-{i}", "fetch", {"n": i}] for i in range(8)]
            if w == 0:
                calls += [[f"e-s{i}", "charge", {"n": i, "suspend": True}] for i in range(2)]
            cluster.spawn(run_id="ev", go=str(cluster.go), calls=calls, concurrency=2)
        noise = [[f"noise{i}", "fetch", {"n": i}] for i in range(8)]
        cluster.spawn(run_id="noise", go=str(cluster.go), calls=noise)  # another run
        cluster.start(4)
        first = await take(subscription, 52)  # 24 x (started, result), 2 x (started, suspended)
        subscription.close()
        cut = first[20].seq
        resumed = runtime.subscribe("ev", after=cut)
        suspended = [a.action_id for a in store.actions(run_id="ev")]
        assert len(suspended) == 2
        cluster.spawn(
            run_id="ev",
            calls=[[f"f{i}", "sync", {"n": i}] for i in range(3)],
            submits=[[a, {"approved": True}] for a in suspended],
            concurrency=1,
        )
        rest = await take(resumed, 31 + 6 + 4)  # the tail of the first batch, then the new
        resumed.close()
        return first, rest, cut

    first, rest, cut = run(scenario())
    committed = store.events("ev")
    assert len(committed) == 62
    assert [e.seq for e in first] == [e.seq for e in committed[:52]]  # commit order
    assert [e.seq for e in rest] == [e.seq for e in committed if e.seq > cut]  # no loss, no dup
    seqs = [e.seq for e in first] + [e.seq for e in rest if e.seq > first[-1].seq]
    assert seqs == sorted(set(seqs)) and all(s > 0 for s in seqs)  # strictly increasing
    assert all(e.run_id == "ev" for e in first + rest)
    kinds = Counter(e.kind for e in committed)
    assert kinds == {"started": 29, "result": 29, "suspended": 2, "resumed": 2}
    assert {(e.call_id, e.kind) for e in rest if e.kind == "resumed"} == {
        ("e-s0", "resumed"),
        ("e-s1", "resumed"),
    }
    assert len(store.events("noise")) == 16
    run(runtime.close())
    store.close()


# -- 10. leases: kept by the heartbeat, lost by a stalled owner --------------------------------


def test_a_call_longer_than_its_lease_keeps_it_by_the_heartbeat(cluster: Cluster) -> None:
    # A lease of 2 s: renewed every 0.67 s by a thread, which a machine at a load of 20 still
    # schedules in time (with 1 s, a heartbeat 0.67 s late on such a machine lost the call).
    sweeper = cluster.spawn(lease_s=2.0, loop=0.1, stop=str(cluster.stop))
    wait_until(lambda: cluster.ready_count() == 1, 30, "the sweeping worker", cluster)
    owner = cluster.spawn(lease_s=2.0, calls=[["long", "charge", {"n": 7, "sleep_ms": 6000}]])
    [result] = cluster.results(owner)  # 3 leases long; renewed every third of one
    assert result == {"call_id": "long", "status": "success", "code": None}
    store = open_store(cluster.url)
    kinds = [e.kind for e in store.events("default") if e.call_id == "long"]
    assert kinds == ["started", "result"]  # never claimed by the sweeping worker
    assert [(c, e, pid) for c, e, _, pid in cluster.entries()] == [("long", "initial", owner.pid)]
    cluster.stop.touch()
    cluster.results(sweeper)
    store.close()


def test_a_stalled_owner_past_its_lease_loses_its_calls_and_its_late_results_are_not_kept(
    cluster: Cluster,
) -> None:
    survivor = cluster.spawn(
        lease_s=0.6, host="host-b", loop=0.1, note="survivor", stop=str(cluster.stop)
    )
    wait_until(lambda: cluster.ready_count() == 1, 30, "the surviving worker", cluster)
    calls = [["st-fetch", "fetch", {"n": 1, "sleep_ms": 1500}]]
    calls.append(["st-charge", "charge", {"n": 2, "sleep_ms": 1500}])
    stalled = cluster.spawn(lease_s=0.6, host="host-a", note="stalled", calls=calls)
    wait_until(lambda: len(cluster.entries()) == 2, 30, "both calls running", cluster)
    os.kill(stalled.pid, signal.SIGSTOP)  # alive (its PostgreSQL session too), not beating
    store = open_store(cluster.url)
    try:
        wait_until(lambda: settled(store, ["st-fetch", "st-charge"]), 15, "the take-over", cluster)
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    late = cluster.results(stalled)  # it finishes; the store refuses what it reports
    assert sorted(r["call_id"] for r in late) == ["st-charge", "st-fetch"]
    fetch, charge = store.call("st-fetch"), store.call("st-charge")
    assert fetch is not None and charge is not None
    assert fetch.result == {
        "status": "success",
        "content": {"n": 1, "entry": "initial", "note": "survivor"},  # the replay's
    }
    interrupted: Any = charge.result
    assert interrupted["code"] == "INTERRUPTED"  # not the stalled entry's late success
    ran = Counter((c, pid) for c, _, _, pid in cluster.entries())
    assert ran == {
        ("st-fetch", stalled.pid): 1,
        ("st-fetch", survivor.pid): 1,
        ("st-charge", stalled.pid): 1,  # and never again
    }
    for call_id in ("st-fetch", "st-charge"):
        assert [e.kind for e in store.events("default") if e.call_id == call_id] == [
            "started",
            "claimed",
            "result",
        ]
    cluster.stop.touch()
    cluster.results(survivor)
    store.close()


def test_a_stalled_owner_s_fenced_write_never_lands_after_the_take_over(
    cluster: Cluster,
) -> None:
    survivor = cluster.spawn(
        lease_s=0.6, host="host-b", loop=0.1, note="survivor", stop=str(cluster.stop)
    )
    wait_until(lambda: cluster.ready_count() == 1, 30, "the surviving worker", cluster)
    calls = [["fp", "post", {"n": 1, "sleep_ms": 1500}]]
    stalled = cluster.spawn(lease_s=0.6, host="host-a", note="stalled", calls=calls)
    wait_until(lambda: len(cluster.entries()) == 1, 30, "the call running", cluster)
    os.kill(stalled.pid, signal.SIGSTOP)  # mid-sleep, before its write
    store = open_store(cluster.url)
    try:
        wait_until(lambda: settled(store, ["fp"]), 15, "the take-over", cluster)
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    [late] = cluster.results(stalled)
    # It wakes holding token 1: its assert_held() fails (LEASE_LOST), or its heartbeat saw the
    # take-over first and cancelled it (it then reports the store's outcome): no write either way.
    assert late["code"] == "LEASE_LOST" or late == {
        "call_id": "fp",
        "status": "success",
        "code": None,
    }
    writes = [(entry, pid) for _, entry, _, pid in cluster.entries() if entry.startswith("write")]
    assert writes == [("write-2", survivor.pid)]  # the replay's, under the larger token
    record = store.call("fp")
    assert record is not None and record.fence == 2
    assert record.result == {
        "status": "success",
        "content": {"n": 1, "entry": "initial", "note": "survivor"},
    }
    cluster.stop.touch()
    cluster.results(survivor)
    store.close()


def test_a_stalled_owner_reports_nothing_the_store_keeps_after_the_take_over(
    cluster: Cluster,
) -> None:
    """Issue 38: worker A runs an idempotent tool and is frozen (SIGSTOP) before it reports;
    worker B's recovery replays the call, writes its ToolData item, saves its file, triggers
    and settles. A, resumed, writes the same item, saves a file and triggers: the store refuses
    each (A's entry ends as LEASE_LOST, or its heartbeat saw the take-over first), so what the
    store holds is B's alone, and no event of A's write is in the run."""
    survivor = cluster.spawn(
        lease_s=0.6, host="host-b", loop=0.1, note="survivor", stop=str(cluster.stop)
    )
    wait_until(lambda: cluster.ready_count() == 1, 30, "the surviving worker", cluster)
    stalled = cluster.spawn(
        lease_s=0.6,
        host="host-a",
        note="stalled",
        calls=[["au", "audit", {"n": 1, "sleep_ms": 1600}]],
    )
    wait_until(lambda: len(cluster.entries()) == 1, 30, "the call running", cluster)
    os.kill(stalled.pid, signal.SIGSTOP)  # mid-sleep, before it reports anything
    store = open_store(cluster.url)
    try:
        wait_until(lambda: settled(store, ["au"]), 15, "the take-over", cluster)
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    [late] = cluster.results(stalled)
    assert late["code"] == "LEASE_LOST" or late == {
        "call_id": "au",
        "status": "success",
        "code": None,
    }
    ran = [pid for call_id, _, _, pid in cluster.entries() if call_id == "au"]
    assert ran == [stalled.pid, survivor.pid]  # both entered: only one is recorded
    [item] = store.data("au", "log")
    assert item.value == {"who": "survivor", "pid": survivor.pid}
    # The store lists no files by call: read the table the way an operator would.
    assert isinstance(store, SQLStore)
    saved = store._fetch("SELECT content FROM blade_files WHERE call_id = :c", {"c": "au"})
    assert [json.loads(bytes(row[0])) for row in saved] == [
        {"who": "survivor", "pid": survivor.pid}
    ]
    record = store.call("au")
    assert record is not None and record.fence == 2
    assert record.result == {
        "status": "success",
        "content": {"n": 1, "entry": "initial", "note": "survivor"},
    }
    [trigger] = store.triggers(run_id="default")
    assert trigger.input == {"who": "survivor", "pid": survivor.pid}
    kinds = [e.kind for e in store.events("default") if e.call_id == "au"]
    assert kinds == ["started", "claimed", "data", "trigger", "result"]
    assert [e.payload for e in store.events("default") if e.kind == "data"] == [
        {
            "channel": "log",
            "id": "log",
            "value": {"who": "survivor", "pid": survivor.pid},
            "transient": False,
        }
    ]
    cluster.stop.touch()
    cluster.results(survivor)
    store.close()


# -- 11. a runtime that closes with calls still running -----------------------------------------


def test_a_runtime_closed_with_calls_running_settles_them_cancelled(cluster: Cluster) -> None:
    closing = cluster.spawn(
        lease_s=60.0,
        hang=["fetch", "charge"],
        close_after=2,
        calls=[
            ["cc-fetch", "fetch", {"n": 1}],
            ["cc-charge", "charge", {"n": 2}],
        ],
    )
    out, err = closing.communicate(timeout=30)
    assert closing.returncode == 0, err
    assert json.loads(out.splitlines()[-1]) == {"abandoned": [], "kept": []}
    store = open_store(cluster.url)
    for call_id in ("cc-fetch", "cc-charge"):
        record = store.call(call_id)
        assert record is not None and record.state == "settled"  # nothing left running
        assert record.result == {
            "status": "error",
            "code": "CANCELLED",
            "message": "The tool call was cancelled after its implementation started: the runtime "
            "is closing.",
        }
    store.close()


def test_a_call_close_could_not_stop_is_never_run_elsewhere_while_its_process_lives(
    cluster: Cluster,
) -> None:
    """close() fails closed: the implementation that ignores its cancellation keeps its call's
    lease (renewed) while its process lives, however short the lease; once the process is gone,
    the lease lapses and another worker takes the call up by its contract."""
    lease_s = 1.0
    survivor = cluster.spawn(lease_s=lease_s, host="host-b", loop=0.1, stop=str(cluster.stop))
    wait_until(lambda: cluster.ready_count() == 1, 30, "the surviving worker", cluster)
    closing = cluster.spawn(
        lease_s=lease_s,
        host="host-a",  # another host: its pid cannot be looked up, only its lease counts
        stubborn=["fetch"],  # ignores the cancellation: close cannot stop it
        close_after=1,
        close_timeout_s=0.3,
        linger_s=4 * lease_s,  # alive, the implementation running, for four leases
        calls=[["ab-fetch", "fetch", {"n": 1}]],
    )
    store = open_store(cluster.url)
    try:
        while closing.poll() is None:  # not one entry elsewhere while it may still act
            elsewhere = [e for e in cluster.entries() if e[0] == "ab-fetch" and e[3] != closing.pid]
            assert elsewhere == [], "another worker ran the call while its implementation ran"
            time.sleep(0.05)
        out, err = closing.communicate(timeout=30)
        assert closing.returncode == 0, err
        assert json.loads(out.splitlines()[-1]) == {"abandoned": ["ab-fetch"], "kept": ["ab-fetch"]}
        wait_until(lambda: settled(store, ["ab-fetch"]), 30, "the call taken up after the process")
        record = store.call("ab-fetch")
        assert record is not None and record.result == {
            "status": "success",
            "content": {"n": 1, "entry": "initial", "note": "ok"},  # replayed by the survivor
        }
    finally:
        cluster.stop.touch()
        cluster.results(survivor)
        store.close()


# -- 7b. submits racing the deadline and the sweeps --------------------------------------------


def test_submits_at_the_deadline_racing_sweeps_each_action_ends_one_way(cluster: Cluster) -> None:
    procs = [cluster.spawn(loop=0.02, stop=str(cluster.stop)) for _ in range(2)]
    wait_until(lambda: cluster.ready_count() == 2, 60, "two sweeping workers", cluster)
    runtime, store = local_runtime(cluster)
    waiting = suspend_calls(runtime, process_worker.EXPIRING, 20, "dl")
    first = store.action(waiting[0].action.action_id)
    assert first is not None and first.expires_at is not None
    time.sleep(max(0.0, first.expires_at - time.time() - 0.1))  # submit across the deadline

    async def submit_all() -> list[ToolResult[Any]]:
        results = []
        for pending in waiting:
            results.append(await runtime.submit(pending.action.action_id, {"approved": True}))
            await asyncio.sleep(0.01)
        return results

    submitted = {r.call.call_id: r for r in run(submit_all())}
    call_ids = [p.call.call_id for p in waiting]
    wait_until(lambda: settled(store, call_ids), 15, "every call settled", cluster)
    resumed = resumes(cluster)
    outcomes: Counter[str] = Counter()
    for pending in waiting:
        call_id = pending.call.call_id
        action = store.action(pending.action.action_id)
        record = store.call(call_id)
        assert action is not None and record is not None
        result: Any = record.result
        events = [e.kind for e in store.events("default") if e.call_id == call_id]
        if action.state == "submitted":  # the submit won: resumed once, by the submitter
            assert resumed[call_id] == 1 and result["status"] == "success"
            assert events == ["started", "suspended", "resumed", "result"]
            assert isinstance(submitted[call_id], ToolSuccess)
        else:  # the deadline won: TIMEOUT, never resumed, and the submit was told so
            assert action.state == "expired" and result["code"] == "TIMEOUT"
            assert resumed[call_id] == 0
            assert events == ["started", "suspended", "result"]
            refused = submitted[call_id]
            assert isinstance(refused, ToolError)
            assert (
                refused.code == ErrorCode.ACTION_ALREADY_RESOLVED and "expired" in refused.message
            )
        outcomes[action.state] += 1
    assert sum(outcomes.values()) == 20
    print(f"submitted {outcomes['submitted']}, expired {outcomes['expired']}")
    cluster.stop.touch()
    for proc in procs:
        cluster.results(proc)
    run(runtime.close())
    store.close()
