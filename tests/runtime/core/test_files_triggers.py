"""``ctx.files``, ``ctx.trigger`` and progress events: on every store, over HTTP with two tenants,
and across two worker processes.

Tools are real registrations of generated specs (``tests/files_tools.py``); stores are real
(PostgreSQL from ``tests/postgres.py``), HTTP is uvicorn on 127.0.0.1, workers are processes.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import files_tools
import forked
import httpx
import pytest
from http_support import ALICE, BOB, ROOT, TOKENS, authenticate, serving

from blade_runtime import FolderFiles, UnknownFile
from blade_runtime.client import RunEvent, ToolClient
from blade_runtime.core.caller import CallContext
from blade_runtime.core.files import FileBackend
from blade_runtime.core.results import ErrorCode, ToolError, ToolSuccess
from blade_runtime.core.store import (
    CallRecord,
    Event,
    FileRecord,
    LeaseLost,
    Store,
    TriggerRecord,
    now,
)
from blade_runtime.core.triggers import Trigger
from blade_runtime.runtime import Runtime
from blade_runtime.serving.http import HttpTransport, create_app
from blade_runtime.stores.urls import open_store

KINDS = ("memory", "sqlite", "postgres")
ALICE_CONTEXT = CallContext(principal=TOKENS["token-alice"], thread_id="thread-a")
BOB_CONTEXT = CallContext(principal=TOKENS["token-bob"], thread_id="thread-b")


@pytest.fixture(scope="session")
def files_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return files_tools.build(tmp_path_factory.mktemp("files-tools"))


def _url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind == "memory":
        return "memory:"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'files.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened = open_store(_url(request.param, request, tmp_path))
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture(params=("sqlite", "postgres"))
def durable_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    url = _url(request.param, request, tmp_path)
    open_store(url).close()  # made (and migrated) before any worker opens it
    return url


def run(coroutine: Any) -> Any:
    async def main() -> Any:
        return await coroutine

    return asyncio.run(main())


def runtime_on(store: Store, **options: Any) -> Runtime:
    runtime = Runtime(store=store, **options)
    files_tools.register(runtime)
    return runtime


async def call(
    runtime: Runtime, name: str, arguments: Any, context: CallContext, **ids: Any
) -> Any:
    result = await runtime.call(name, arguments, context=context, **ids)
    assert isinstance(result, ToolSuccess), result
    assert "refused" not in result.content, result.content
    return result.content


# -- files ---------------------------------------------------------------------------------------


def test_a_saved_file_is_the_tenants_and_its_scope_comes_from_the_stored_caller(
    files_package: Path, store: Store
) -> None:
    async def scenario() -> None:
        runtime = runtime_on(store)
        saved = await call(
            runtime,
            "export_report",
            {"rows": 3, "name": "squares.csv", "tenant": "globex"},
            ALICE_CONTEXT,
            call_id="export-1",
            run_id="run-a",
        )
        file_id = saved["file_id"]
        assert saved["size"] == len(files_tools.csv(3).encode())
        record = store.file(file_id)
        assert record is not None
        # tenant, creator and thread are the caller's, whatever the input said
        assert (record.tenant, record.creator, record.thread_id) == ("acme", "alice", "thread-a")
        assert (record.call_id, record.run_id, record.name) == ("export-1", "run-a", "squares.csv")
        assert store.file_content(file_id) == files_tools.csv(3).encode()

        read = await call(runtime, "read_report", {"file_id": file_id}, ALICE_CONTEXT)
        assert read == {"text": files_tools.csv(3), "media_type": "text/csv"}
        # another tenant's call learns nothing: the same answer as for an id never saved
        other = await call(runtime, "read_report", {"file_id": file_id}, BOB_CONTEXT)
        never = await call(runtime, "read_report", {"file_id": "file_" + "0" * 32}, BOB_CONTEXT)
        assert other == {"unknown": f"no file {file_id!r}"}
        assert never == {"unknown": f"no file {'file_' + '0' * 32!r}"}
        assert await runtime.records.file(file_id, principal=TOKENS["token-bob"]) is None
        mine = await runtime.records.file(file_id, principal=TOKENS["token-alice"])
        assert mine is not None and mine.content == files_tools.csv(3).encode()
        root = await runtime.records.file(file_id, principal=TOKENS["token-root"])
        assert root is not None and root.file.sha256 == record.sha256
        await runtime.close()

    run(scenario())


def test_a_file_over_the_limit_or_badly_named_is_refused_and_nothing_is_written(
    files_package: Path, store: Store
) -> None:
    written: list[str] = []

    class Watched:
        """The store's files, noting each save that reaches it."""

        def save_file(self, record: FileRecord, content: bytes, **kw: Any) -> None:
            written.append(record.file_id)
            store.save_file(record, content, **kw)

        def file(self, file_id: str) -> FileRecord | None:
            return store.file(file_id)

        def file_content(self, file_id: str) -> bytes | None:
            return store.file_content(file_id)

    async def scenario() -> list[Any]:
        runtime = runtime_on(store, max_file_bytes=100, files=Watched())
        outputs = [
            (await runtime.call("export_report", arguments, context=ALICE_CONTEXT)).content
            for arguments in (
                {"rows": 20},
                {"rows": 1, "name": "../../etc/passwd"},
                {"rows": 1, "media_type": "text/html\r\nSet-Cookie: x=1"},
                {"rows": 1, "name": ""},
                {"rows": 1, "media_type": 'text/plain; x="\u20ac"'},
                {"rows": 1, "media_type": 'text/plain; x="\u2028"'},
                {"rows": 1, "media_type": "text/html\r\n; x=1"},
            )
        ]
        await runtime.close()
        return outputs

    outputs = run(scenario())
    refused = [output["refused"] for output in outputs]
    assert "over the limit of 100 bytes (Runtime(max_file_bytes=...) sets it)" in refused[0]
    assert "a name has no / or \\" in refused[1]
    assert "is not a media type" in refused[2] and "\n" not in refused[2]
    assert "1 to 255 printable characters" in refused[3]
    # A Content-Type header is one line of ASCII: anything else is refused at save.
    for message in refused[4:]:
        assert "is not a media type" in message and "\n" not in message
        assert "\u2028" not in message
    assert written == []


class Gated:
    """A file backend whose saves wait at a gate before reaching ``backend``."""

    def __init__(self, backend: FileBackend) -> None:
        self.backend = backend
        self.reached = threading.Event()
        self.open = threading.Event()
        self.done = threading.Event()
        self.ids: list[str] = []

    def save_file(self, record: FileRecord, content: bytes, **kw: Any) -> None:
        self.ids.append(record.file_id)
        self.reached.set()
        try:
            assert self.open.wait(30)
            self.backend.save_file(record, content, **kw)
        finally:
            self.done.set()

    def file(self, file_id: str) -> FileRecord | None:
        return self.backend.file(file_id)

    def file_content(self, file_id: str) -> bytes | None:
        return self.backend.file_content(file_id)


def _cancelled_save(files: Gated, store: Store) -> ToolError:
    async def scenario() -> Any:
        runtime = runtime_on(store, files=files)
        calling = asyncio.ensure_future(
            runtime.call("export_report", {"rows": 5}, call_id="c-1", context=ALICE_CONTEXT)
        )
        while not files.reached.is_set():
            await asyncio.sleep(0.01)
        assert runtime.cancel_call("c-1", "the user stopped it")
        result = await calling
        files.open.set()  # the save goes on in its thread, and finds its call cancelled
        assert await asyncio.to_thread(files.done.wait, 30)
        await runtime.close()
        return result

    result = run(scenario())
    assert isinstance(result, ToolError) and result.code == ErrorCode.CANCELLED
    return result


def test_cancelling_a_call_stops_its_save_and_nothing_is_stored(
    files_package: Path, store: Store
) -> None:
    gated = Gated(store)
    _cancelled_save(gated, store)
    (file_id,) = gated.ids
    assert store.file(file_id) is None and store.file_content(file_id) is None


class Recorded:
    """A file backend that notes each save's id and when it began and ended."""

    def __init__(self, backend: FileBackend) -> None:
        self.backend = backend
        self.ids: list[str] = []
        self.spans: list[tuple[float, float]] = []

    def save_file(self, record: FileRecord, content: bytes, **kw: Any) -> None:
        self.ids.append(record.file_id)
        began = time.perf_counter()
        try:
            self.backend.save_file(record, content, **kw)
        finally:
            self.spans.append((began, time.perf_counter()))

    def file(self, file_id: str) -> FileRecord | None:
        return self.backend.file(file_id)

    def file_content(self, file_id: str) -> bytes | None:
        return self.backend.file_content(file_id)

    def delete_file(self, file_id: str) -> None:
        self.backend.delete_file(file_id)


@pytest.mark.parametrize("kind", ("sqlite", "postgres"))
def test_a_save_cancelled_anywhere_up_to_its_commit_leaves_nothing_stored(
    files_package: Path, kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Cancellations walked across a save of about 8 MiB, up to and past its commit: a call that
    ends CANCELLED never leaves its file stored, and one that ends with the file's id has it."""
    store = open_store(_url(kind, request, tmp_path))
    recorded = Recorded(store)
    rows = 600_000  # about 8 MiB of CSV

    async def one(call_id: str, delay: float | None) -> tuple[Any, list[str]]:
        runtime = runtime_on(store, files=recorded, max_file_bytes=64 << 20)
        before = len(recorded.ids)
        calling = asyncio.ensure_future(
            runtime.call("export_report", {"rows": rows}, call_id=call_id, context=ALICE_CONTEXT)
        )
        if delay is not None:
            while len(recorded.ids) == before and not calling.done():
                await asyncio.sleep(0.001)
            await asyncio.sleep(delay)
            runtime.cancel_call(call_id, "walked")
        result = await calling
        await runtime.close()
        return result, recorded.ids[before:]

    try:
        first, _ = run(one("walk-first", None))  # a save left alone: how long it takes
        assert isinstance(first, ToolSuccess), first
        began, ended = recorded.spans[-1]
        length = ended - began
        outcomes: Counter[str] = Counter()
        for step in range(8):  # from the save's start to just past its end
            result, ids = run(one(f"walk-{step}", length * step / 6))
            if isinstance(result, ToolSuccess):
                outcomes["kept"] += 1
                assert [store.file(i) is not None for i in ids] == [True]
            else:
                assert isinstance(result, ToolError) and result.code == ErrorCode.CANCELLED
                outcomes["cancelled"] += 1
                assert all(store.file(i) is None and store.file_content(i) is None for i in ids)
        assert outcomes["cancelled"] >= 1, outcomes
    finally:
        store.close()


def test_files_in_a_folder_round_trip_and_a_cancelled_save_leaves_nothing(
    files_package: Path, tmp_path: Path
) -> None:
    from blade_runtime.stores.memory import MemoryStore

    folder = FolderFiles(tmp_path / "files")

    async def scenario() -> tuple[Any, Any, Any]:
        runtime = runtime_on(MemoryStore(), files=folder)
        saved = await call(runtime, "export_report", {"rows": 4}, ALICE_CONTEXT)
        read = await call(runtime, "read_report", {"file_id": saved["file_id"]}, ALICE_CONTEXT)
        other = await call(runtime, "read_report", {"file_id": saved["file_id"]}, BOB_CONTEXT)
        hostile = await call(runtime, "read_report", {"file_id": "../files"}, ALICE_CONTEXT)
        await runtime.close()
        return saved, (read, other), hostile

    saved, (read, other), hostile = run(scenario())
    assert read["text"] == files_tools.csv(4)
    assert "unknown" in other and "unknown" in hostile
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == [
        f"{saved['file_id']}.bin",
        f"{saved['file_id']}.json",
    ]
    gated = Gated(folder)
    _cancelled_save(gated, MemoryStore())  # its save's thread has returned: nothing of it stays
    assert len(list((tmp_path / "files").iterdir())) == 2
    assert folder.file(gated.ids[0]) is None


def test_a_file_another_worker_process_saved_is_read_here_per_tenant(
    files_package: Path, durable_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "saved.json"
    (tmp_path / "w").mkdir()
    worker = forked.start(tmp_path / "w", files_tools.save, durable_url, str(out))
    worker.communicate(60)
    assert worker.returncode == 0
    file_id = json.loads(out.read_text("utf-8"))["file_id"]
    store = open_store(durable_url)

    async def scenario() -> tuple[Any, Any]:
        runtime = runtime_on(store)
        mine = await call(runtime, "read_report", {"file_id": file_id}, ALICE_CONTEXT)
        theirs = await runtime.records.file(file_id, principal=TOKENS["token-bob"])
        await runtime.close()
        return mine, theirs

    try:
        mine, theirs = run(scenario())
        record = store.file(file_id)
    finally:
        store.close()
    assert mine == {"text": files_tools.csv(7), "media_type": "text/csv"} and theirs is None
    assert record is not None and (record.creator, record.thread_id) == ("alice", "thread-w")


def test_get_a_file_over_http_is_tenant_checked_and_the_typed_client_reads_it(
    files_package: Path, tmp_path: Path
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'http.db'}")
    runtime = runtime_on(store)
    app = create_app(runtime, authenticate=authenticate)
    try:
        with serving(app) as server:
            made = httpx.post(
                f"{server.url}/v1/tools/export_report/calls",
                json={"rows": 2, "name": "résumé.csv"},
                headers=ALICE,
            )
            assert made.status_code == 200, made.text
            file_id = made.json()["output"]["file_id"]
            got = httpx.get(f"{server.url}/v1/files/{file_id}", headers=ALICE)
            body = files_tools.csv(2).encode()
            assert got.status_code == 200 and got.content == body
            assert got.headers["content-type"] == "text/csv"
            assert got.headers["content-length"] == str(len(body))
            assert got.headers["x-content-type-options"] == "nosniff"
            assert got.headers["content-disposition"] == (
                "attachment; filename*=UTF-8''r%C3%A9sum%C3%A9.csv"
            )
            theirs = httpx.get(f"{server.url}/v1/files/{file_id}", headers=BOB)
            never = httpx.get(f"{server.url}/v1/files/file_{'1' * 32}", headers=BOB)
            assert theirs.status_code == never.status_code == 404
            assert theirs.json()["code"] == never.json()["code"] == "UNKNOWN_FILE"
            assert httpx.get(f"{server.url}/v1/files/{file_id}").status_code == 401
            assert httpx.get(f"{server.url}/v1/files/{file_id}", headers=ROOT).content == body

            async def typed() -> None:
                async with HttpTransport(server.url, token="token-alice") as alice:
                    found = await ToolClient(alice).read_file(file_id)
                    assert found.content == body and found.file.name == "résumé.csv"
                    assert found.file.media_type == "text/csv" and found.file.size == len(body)
                async with HttpTransport(server.url, token="token-bob") as bob:
                    with pytest.raises(UnknownFile):
                        await ToolClient(bob).read_file(file_id)
                in_process = await ToolClient(runtime).read_file(file_id)
                assert in_process.content == body

            asyncio.run(typed())
    finally:
        store.close()


# -- triggers ------------------------------------------------------------------------------------


def test_a_trigger_is_recorded_with_its_event_and_delivered_once(
    files_package: Path, store: Store
) -> None:
    delivered: list[Trigger] = []

    async def scenario() -> tuple[str, list[Any], list[Any]]:
        async def handler(trigger: Trigger) -> None:
            delivered.append(trigger)

        runtime = runtime_on(store, on_trigger=handler)
        idle = runtime_on(store)  # a second runtime without a handler delivers nothing
        watching = runtime.subscribe("run-t")
        output = await call(
            runtime, "notify_later", {"job": "j-1"}, ALICE_CONTEXT, run_id="run-t", call_id="n-1"
        )
        for _ in range(200):
            if delivered:
                break
            await asyncio.sleep(0.01)
        assert await runtime.deliver_triggers() == 0  # nothing left: delivered once
        assert await idle.deliver_triggers() == 0
        watching.close()
        events = [event async for event in watching]
        await idle.close()
        await runtime.close()
        return output["trigger_id"], events, store.triggers()

    trigger_id, events, stored = run(scenario())
    (trigger,) = delivered
    assert trigger.trigger_id == trigger_id
    assert (trigger.call_id, trigger.run_id, trigger.tool) == ("n-1", "run-t", "notify_later")
    assert trigger.thread_id == "thread-a" and trigger.context == ALICE_CONTEXT
    assert trigger.input == {"notification": "job done", "job": "j-1"}
    kinds = [event.kind for event in events]
    assert kinds == ["started", "trigger", "result"]
    assert events[1].payload == {
        "trigger_id": trigger_id,
        "thread_id": "thread-a",
        "input": trigger.input,
    }
    (record,) = stored
    assert record.state == "delivered" and record.tenant == "acme" and record.error is None


def test_a_failing_handler_marks_the_trigger_failed_and_the_tool_still_succeeds(
    files_package: Path, store: Store
) -> None:
    def handler(trigger: Trigger) -> None:
        raise RuntimeError("secret-token-123 leaked?")

    async def scenario() -> Any:
        runtime = runtime_on(store, on_trigger=handler)
        output = await call(runtime, "notify_later", {"job": "j"}, ALICE_CONTEXT)
        for _ in range(200):
            if store.triggers(state="failed"):
                break
            await asyncio.sleep(0.01)
        await runtime.close()
        return output

    output = run(scenario())
    (record,) = store.triggers()
    assert record.trigger_id == output["trigger_id"]
    assert record.state == "failed" and record.error == "RuntimeError"


def test_a_trigger_of_a_call_this_runtime_no_longer_owns_is_not_recorded(store: Store) -> None:
    call = CallRecord(
        "c-lost", "r", "notify_later", "files.notify-later.v1", "idempotent", "backend", {},
        "running", now(), owner="worker-a",
    )  # fmt: skip
    store.begin(call, Event("r", "c-lost", "started", None, now()))
    trigger = TriggerRecord("trg-1", "c-lost", "r", "notify_later", "", {"x": 1}, now())
    with pytest.raises(LeaseLost):
        store.add_trigger(
            trigger,
            Event("r", "c-lost", "trigger", None, now()),
            claim=replace(call.claim, owner="worker-b"),
        )
    assert store.triggers() == []
    assert [e.kind for e in store.events("r")] == ["started"]
    store.add_trigger(trigger, Event("r", "c-lost", "trigger", None, now()), claim=call.claim)
    assert [t.trigger_id for t in store.claim_triggers("w", 30.0)] == ["trg-1"]
    assert store.claim_triggers("w2", 30.0) == []  # claimed: not claimable again
    assert not store.finish_trigger("trg-1", "w2")
    assert store.finish_trigger("trg-1", "w")
    assert store.trigger("trg-1") is not None and store.trigger("trg-1").state == "delivered"  # type: ignore[union-attr]


def test_a_replayed_entry_asks_its_triggers_again_and_each_is_recorded_once(
    files_package: Path, durable_url: str
) -> None:
    """Worker A triggers, then stalls past its lease; worker B's recovery runs the idempotent
    call again, which triggers again: one trigger is recorded and delivered, not two."""
    import importlib

    from stalled import Stalled, taken_over

    notify = importlib.import_module(f"{files_tools.PACKAGE}.files.notify_later_v1")
    delivered: list[Trigger] = []
    gate = threading.Event()

    def implementation(stalls: bool) -> Any:
        async def notify_later(ctx: Any) -> Any:
            trigger_id = await ctx.trigger({"job": ctx.input.job})
            if stalls:
                await asyncio.get_running_loop().run_in_executor(None, gate.wait)
            return notify.NotifyLaterOutput(trigger_id=trigger_id)

        return notify_later

    async def scenario() -> tuple[list[str], list[Any]]:
        stalled_store = Stalled(open_store(durable_url))
        survivor_store = open_store(durable_url)
        a = Runtime(store=stalled_store, lease_s=0.6)  # type: ignore[arg-type]
        a.register(notify.SPEC, implementation(stalls=True))
        b = Runtime(store=survivor_store, lease_s=0.6, on_trigger=delivered.append)
        b.register(notify.SPEC, implementation(stalls=False))
        first = asyncio.create_task(
            a.call("notify_later", {"job": "j"}, context=ALICE_CONTEXT, call_id="n1")
        )
        while not survivor_store.triggers():
            await asyncio.sleep(0.01)
        [replayed] = await taken_over(b, "n1")
        await b.deliver_triggers()
        gate.set()
        stalled_store.stalled = False
        await first
        ids = [t.trigger_id for t in survivor_store.triggers()]
        await a.close()
        await b.close()
        stalled_store.close()
        survivor_store.close()
        return ids, [replayed]

    ids, [replayed] = run(scenario())
    assert isinstance(replayed, ToolSuccess), replayed
    assert len(ids) == 1 and replayed.output.trigger_id == ids[0]
    assert [t.trigger_id for t in delivered] == ids  # delivered once


def test_triggers_are_delivered_once_across_two_worker_processes(
    files_package: Path, durable_url: str, tmp_path: Path
) -> None:
    store = open_store(durable_url)
    count = 30

    async def make() -> list[str]:
        runtime = runtime_on(store)
        ids = [
            (await call(runtime, "notify_later", {"job": f"j{n}"}, ALICE_CONTEXT))["trigger_id"]
            for n in range(count)
        ]
        await runtime.close()
        return ids

    made = run(make())
    out, stop = tmp_path / "delivered.txt", tmp_path / "stop"
    for n in range(2):
        (tmp_path / f"w{n}").mkdir()
    workers = [
        forked.start(tmp_path / f"w{n}", files_tools.deliver, durable_url, str(out), str(stop))
        for n in range(2)
    ]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and store.triggers(state="delivered").__len__() < count:
            time.sleep(0.05)
    finally:
        stop.write_text("")
        for worker in workers:
            worker.communicate(60)
    lines = out.read_text().split()
    delivered = Counter(lines[0::2])
    assert sorted(delivered) == sorted(made) and set(delivered.values()) == {1}
    assert {t.state for t in store.triggers()} == {"delivered"}
    assert {worker.returncode for worker in workers} == {0}
    store.close()


# -- progress, messages and triggers in the event stream -----------------------------------------


def test_progress_keeps_its_place_behind_stored_events_other_runs_pushed_back(
    files_package: Path, tmp_path: Path
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'order.db'}")

    async def scenario() -> list[str]:
        runtime = runtime_on(store)
        watching = runtime.subscribe("r1")
        await call(runtime, "notify_later", {"job": "other"}, ALICE_CONTEXT, run_id="r0")
        await call(runtime, "notify_later", {"job": "j", "steps": 2}, ALICE_CONTEXT, run_id="r1")
        watching.close()
        kinds = [event.kind async for event in watching]
        await runtime.close()
        return kinds

    try:
        kinds = run(scenario())
    finally:
        store.close()
    assert kinds == ["started", "progress", "progress", "message", "trigger", "result"]


def test_the_in_process_typed_client_follows_only_its_principals_events(
    files_package: Path, tmp_path: Path
) -> None:
    from blade_runtime.client import RuntimeTransport

    store = open_store(f"sqlite:///{tmp_path / 'client.db'}")

    async def scenario() -> list[RunEvent]:
        runtime = runtime_on(store)
        await call(runtime, "notify_later", {"job": "a"}, ALICE_CONTEXT, run_id="both")
        await call(runtime, "notify_later", {"job": "b"}, BOB_CONTEXT, run_id="both")
        client = ToolClient(RuntimeTransport(runtime, TOKENS["token-bob"]))
        seen: list[RunEvent] = []
        events = client.events("both", after=0)
        async for event in events:
            seen.append(event)
            if event.kind == "result":
                break
        await runtime.close()
        return seen

    try:
        seen = run(scenario())
    finally:
        store.close()
    assert [e.kind for e in seen] == ["started", "trigger", "result"]
    assert seen[1].payload["input"]["job"] == "b"  # type: ignore[index]


def _watch(
    url: str,
    token: str,
    run_id: str,
    until: Callable[[list[RunEvent]], bool],
    after: int | None = 0,
) -> list[RunEvent]:
    """The run's events as the typed client over HTTP sees them, until ``until`` says."""

    async def follow() -> list[RunEvent]:
        seen: list[RunEvent] = []
        async with HttpTransport(url, token=token) as transport:
            events = ToolClient(transport).events(run_id, after=after)
            async for event in events:
                seen.append(event)
                if until(seen):
                    break
        return seen

    return asyncio.run(asyncio.wait_for(follow(), 30))


def test_the_http_event_stream_shows_each_tenant_its_own_progress_messages_and_triggers(
    files_package: Path, tmp_path: Path
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'events.db'}")
    runtime = runtime_on(store)
    app = create_app(runtime, authenticate=authenticate)
    try:
        with serving(app) as server:

            def watch(token: str, into: list[list[RunEvent]]) -> None:
                into.append(
                    _watch(server.url, token, "shared", lambda seen: seen[-1].kind == "result")
                )

            # Alice's call first, Bob's second, in one run: each watches from the start.
            for headers, job in ((ALICE, "alice-job"), (BOB, "bob-job")):
                made = httpx.post(
                    f"{server.url}/v1/tools/notify_later/calls",
                    params={"run_id": "shared"},
                    json={"job": job, "steps": 2} if job == "alice-job" else {"job": job},
                    headers=headers,
                )
                assert made.status_code == 200, made.text
            alice: list[list[RunEvent]] = []
            bob: list[list[RunEvent]] = []
            watch("token-alice", alice)
            watch("token-bob", bob)
    finally:
        store.close()
    kinds = [e.kind for e in alice[0]]
    # progress and messages are transient: a stream opened after the call has only stored events
    assert kinds == ["started", "trigger", "result"]
    assert alice[0][1].payload["input"]["job"] == "alice-job"  # type: ignore[index]
    assert [e.kind for e in bob[0]] == ["started", "trigger", "result"]
    assert bob[0][1].payload["input"]["job"] == "bob-job"  # type: ignore[index]
    assert {e.call_id for e in alice[0]}.isdisjoint({e.call_id for e in bob[0]})


def test_live_progress_reaches_the_typed_client_over_http_in_order(
    files_package: Path, tmp_path: Path
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'live.db'}")
    runtime = runtime_on(store)
    app = create_app(runtime, authenticate=authenticate)
    try:
        with serving(app) as server:
            # a principal's stream opens on a run that has a call of its own
            first = httpx.post(
                f"{server.url}/v1/tools/notify_later/calls",
                params={"run_id": "live"},
                json={"job": "first"},
                headers=ALICE,
            )
            assert first.status_code == 200, first.text
            watched: list[list[RunEvent]] = []

            def follow() -> None:
                done = lambda seen: seen[-1].kind == "result"  # noqa: E731
                watched.append(_watch(server.url, "token-alice", "live", done, after=None))

            follower = threading.Thread(target=follow)
            follower.start()
            # the stream is open once the server holds a subscription for it
            api = app.state.api
            deadline = time.monotonic() + 10
            while not api.streams and time.monotonic() < deadline:
                time.sleep(0.01)
            made = httpx.post(
                f"{server.url}/v1/tools/notify_later/calls",
                params={"run_id": "live"},
                json={"job": "j", "steps": 3},
                headers=ALICE,
            )
            assert made.status_code == 200, made.text
            follower.join(30)
    finally:
        store.close()
    (events,) = watched
    assert [e.kind for e in events] == [
        "started",
        "progress",
        "progress",
        "progress",
        "message",
        "trigger",
        "result",
    ]
    assert [e.payload for e in events[1:4]] == [
        {"message": f"step {n}", "completed": n, "total": 3} for n in (1, 2, 3)
    ]
    assert all(e.seq == 0 for e in events[1:5]) and all(e.seq > 0 for e in events[5:])


def _tree(events: list[RunEvent], root: str) -> list[tuple[str, str]]:
    """The (call id, kind) of the events of ``root`` and of its child calls."""
    return [(e.call_id, e.kind) for e in events if e.call_id.split("/")[0] == root]


CHILD = "batch-1/notify_later/1"


def test_a_child_calls_progress_reaches_whom_its_parent_call_shows_over_http(
    files_package: Path, tmp_path: Path
) -> None:
    """A child call's start is never stored: its events are shown to whom the store's record
    of its root parent call shows them (alice's), and to nobody else of the run."""
    store = open_store(f"sqlite:///{tmp_path / 'children.db'}")
    runtime = runtime_on(store)
    app = create_app(runtime, authenticate=authenticate)
    watchers = {"alice": "token-alice", "carol": "token-carol", "bob": "token-bob"}
    seen: dict[str, list[RunEvent]] = {}
    try:
        with serving(app) as server:

            def post(token: str, tool: str, call_id: str, job: dict[str, Any]) -> None:
                made = httpx.post(
                    f"{server.url}/v1/tools/{tool}/calls",
                    params={"run_id": "kids", "call_id": call_id},
                    json=job,
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert made.status_code == 200, made.text

            def follow(who: str) -> None:
                last = "batch-1" if who == "alice" else f"close-{who}"

                def done(got: list[RunEvent]) -> bool:
                    return got[-1].kind == "result" and got[-1].call_id == last

                seen[who] = _watch(server.url, watchers[who], "kids", done, after=None)

            for who, token in watchers.items():  # a stream opens on a run with a call of its own
                post(token, "notify_later", f"open-{who}", {"job": "open"})
            followers = [threading.Thread(target=follow, args=(who,)) for who in watchers]
            for follower in followers:
                follower.start()
            api = app.state.api
            deadline = time.monotonic() + 10
            while len(api.streams) < len(watchers) and time.monotonic() < deadline:
                time.sleep(0.01)
            post("token-alice", "notify_batch", "batch-1", {"job": "j", "steps": 2})
            for who in ("carol", "bob"):  # after alice's call: their streams end behind it
                post(watchers[who], "notify_later", f"close-{who}", {"job": "close"})
            for follower in followers:
                follower.join(30)
    finally:
        store.close()
    tree = _tree(seen["alice"], "batch-1")
    assert ("batch-1", "progress") in tree and ("batch-1", "result") in tree
    assert [kind for call_id, kind in tree if call_id == CHILD][:4] == [
        "started",
        "progress",
        "progress",
        "message",
    ]
    assert (CHILD, "result") in tree
    progress = [e.payload for e in seen["alice"] if e.call_id == CHILD and e.kind == "progress"]
    assert progress == [{"message": f"step {n}", "completed": n, "total": 2} for n in (1, 2)]
    for who in ("carol", "bob"):  # carol shares alice's tenant, bob does not
        assert _tree(seen[who], "batch-1") == [], who
        assert seen[who][-1].call_id == f"close-{who}"


def test_the_in_process_typed_client_follows_its_child_calls_events(
    files_package: Path, tmp_path: Path
) -> None:
    from blade_runtime.client import RuntimeTransport

    store = open_store(f"sqlite:///{tmp_path / 'client-children.db'}")

    async def scenario() -> dict[str, list[RunEvent]]:
        runtime = runtime_on(store)
        seen: dict[str, list[RunEvent]] = {"alice": [], "bob": []}

        async def follow(who: str, last: str, started: asyncio.Event) -> None:
            client = ToolClient(RuntimeTransport(runtime, TOKENS[f"token-{who}"]))
            events = client.events("kids", after=None)
            waiting = asyncio.ensure_future(events.__anext__())
            started.set()
            event = await waiting
            while True:
                seen[who].append(event)
                if event.kind == "result" and event.call_id == last:
                    return
                event = await events.__anext__()

        ready = {who: asyncio.Event() for who in seen}
        followers = [
            asyncio.create_task(follow("alice", "batch-1", ready["alice"])),
            asyncio.create_task(follow("bob", "close-bob", ready["bob"])),
        ]
        for event in ready.values():
            await event.wait()
        await asyncio.sleep(0.05)  # each follower's subscription is open
        batch = {"job": "j", "steps": 2}
        await call(runtime, "notify_batch", batch, ALICE_CONTEXT, run_id="kids", call_id="batch-1")
        await call(
            runtime, "notify_later", {"job": "c"}, BOB_CONTEXT, run_id="kids", call_id="close-bob"
        )
        await asyncio.wait_for(asyncio.gather(*followers), 30)
        await runtime.close()
        return seen

    try:
        seen = run(scenario())
    finally:
        store.close()
    tree = _tree(seen["alice"], "batch-1")
    assert (CHILD, "progress") in tree and (CHILD, "message") in tree
    assert _tree(seen["bob"], "batch-1") == []


def test_the_parents_a_call_id_has_the_form_of_a_child_of() -> None:
    from blade_runtime.core.context import child_id, parent_ids

    child = child_id("batch-1", "", "notify_later", 1)
    grandchild = child_id(child, "act_0123abcd", "step.v-2", 12)
    assert child == CHILD and parent_ids(child) == ["batch-1"]
    assert parent_ids(grandchild)[:2] == ["batch-1", CHILD]  # the root first
    # a caller's own id with a "/" is not a child's: the store's record of it decides alone
    for own in ("lg/thread-1/call_abc", "a/b", "a/", "/step/1", "a/step/0", "a/step/1/"):
        assert parent_ids(own) == [], own


def test_a_call_made_under_a_childs_id_by_another_never_shows_that_childs_events(
    store: Store,
) -> None:
    """Bob guesses alice's call id and starts a call of his own at her child's id: the child's
    events are still alice's alone (her parent's record must be the viewer's too)."""
    from blade_runtime.core.records import Records

    def begin(call_id: str, context: CallContext) -> None:
        record = CallRecord(
            call_id, "kids", "notify_later", "files.notify-later.v1", "idempotent", "backend",
            {}, "running", now(), owner="w", tenant=context.tenant, context=context.to_json(),
        )  # fmt: skip
        store.begin(record, Event("kids", call_id, "started", None, now()))

    begin("batch-1", ALICE_CONTEXT)
    begin(CHILD, BOB_CONTEXT)  # bob's own call, at the id alice's child has
    records = Records(store)
    alice, bob = ALICE_CONTEXT.principal, BOB_CONTEXT.principal
    assert run(records.sees_events(CHILD, "kids", principal=bob)) is False
    assert run(records.sees_events(CHILD, "kids", principal=alice)) is False  # nor his to her
    assert run(records.sees_events("batch-1", "kids", principal=alice)) is True
    assert run(records.sees_events("batch-1/notify_later/2", "kids", principal=alice)) is True
    assert run(records.sees_events("batch-1/notify_later/2", "kids", principal=bob)) is False
