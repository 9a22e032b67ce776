"""SQLiteStore's own behaviour, beyond the conformance suite: the busy timeout, liveness by pid,
the checkpoint thread across forks and failures, and its refusals of files it cannot use.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import forked
import pytest
from records import a_call, begun, ev, eventually, one_line, uid

from blade_runtime.core.store import (
    StoreUnavailable,
)
from blade_runtime.stores.sqlite import CHECKPOINT_EVERY, SQLiteStore
from blade_runtime.stores.urls import open_store


def test_a_sqlite_file_locked_past_the_busy_timeout_is_unavailable(tmp_path: Path) -> None:
    """Another process holding the write lock past busy_timeout: StoreUnavailable naming the
    store, as PostgreSQL's outages are, not sqlite3's own exception."""
    path = tmp_path / "locked.db"
    store = SQLiteStore(path, busy_timeout_ms=50)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    call = a_call(uid("locked"))
    try:
        with pytest.raises(StoreUnavailable, match=r"locked\.db: database is locked"):
            store.begin(call, ev(call, "started"))
    finally:
        other.execute("ROLLBACK")
        other.close()
    begun = store.begin(call, ev(call, "started"))  # the lock released: the store works
    assert store.call(call.call_id) == replace(call, lease_until=begun.lease_until)
    store.close()


def test_sqlite_liveness_is_a_pid_check_on_this_host(tmp_path: Path) -> None:
    import socket

    store = open_store(tmp_path / "store.db")
    try:
        host = socket.gethostname()
        child = forked.CONTEXT.Process(target=time.sleep, args=(0,))
        child.start()
        child.join()
        assert store.alive(f"{host}:{child.pid}:x") is False
        assert store.alive(f"{host}:{os.getppid()}:x") is True
        assert store.alive(f"{host}:{os.getpid()}:x") is None  # this process tells for itself
        assert store.alive(f"another-{host}:{os.getppid()}:x") is None
        store.attach("a")  # nothing to hold
        store.detach("a")
    finally:
        store.close()


def test_sqlite_commits_leave_the_checkpoint_to_the_store_s_thread(tmp_path: Path) -> None:
    """A commit never waits for a checkpoint: the store's thread copies the WAL back into the
    database file while the WAL is still far below 1,000 pages (SQLite's default automatic
    checkpoint, which ran inside the commit that crossed it), and closing the store ends the
    thread."""
    path = tmp_path / "checkpointed.db"
    store = SQLiteStore(path)
    try:
        size = path.stat().st_size
        calls = [begun(store) for _ in range(CHECKPOINT_EVERY + 20)]
        wal_pages = (path.with_name("checkpointed.db-wal").stat().st_size - 32) // (4096 + 24)
        assert wal_pages < 1000  # so no automatic checkpoint ran, at either threshold
        assert _grows(path, size)
        assert [store.call(call.call_id) for call in calls] == calls
    finally:
        store.close()
    assert _checkpoint_threads(path) == []


def test_sqlite_a_store_nobody_closes_ends_its_checkpoint_thread(tmp_path: Path) -> None:
    """The thread does not keep its store: once the store is collected, the thread ends and
    lets go of the file (nothing of it is left open, -wal and -shm removed as on a close)."""
    import gc

    path = tmp_path / "forgotten.db"
    store = SQLiteStore(path)
    for _ in range(CHECKPOINT_EVERY):
        begun(store)
    assert len(_checkpoint_threads(path)) == 1
    del store
    gc.collect()
    assert eventually(lambda: _checkpoint_threads(path) == [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forgotten.db"]


def test_sqlite_a_fork_waits_for_a_checkpoint_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process forked while a checkpoint runs would inherit SQLite's mutexes held by the
    checkpointer thread and hang on its first database: os.fork waits for the checkpoint."""
    import blade_runtime.stores.sqlite

    inside, gate = threading.Event(), threading.Event()
    checkpoint = blade_runtime.stores.sqlite._Checkpointer._checkpoint

    def held(self: Any, db: sqlite3.Connection) -> None:
        inside.set()
        gate.wait(10)
        checkpoint(self, db)

    monkeypatch.setattr(blade_runtime.stores.sqlite._Checkpointer, "_checkpoint", held)
    store = SQLiteStore(tmp_path / "store.db")
    forked_at: list[float] = []

    def fork() -> None:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        forked_at.append(time.monotonic())
        os.waitpid(pid, 0)

    try:
        for _ in range(CHECKPOINT_EVERY):
            begun(store)
        assert inside.wait(10)
        forking, _ = started(fork)
        time.sleep(0.3)
        released = time.monotonic()
        gate.set()
        forking.join(10)
        assert forked_at and forked_at[0] >= released
    finally:
        gate.set()
        store.close()


def test_sqlite_a_checkpointer_that_could_not_open_the_file_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpointer thread that cannot open the file ends; the store starts another at its
    next request, and says so once however often it fails."""
    import blade_runtime.stores.sqlite

    opened = blade_runtime.stores.sqlite._Checkpointer._open
    tries: list[int] = []

    def twice_elsewhere(self: Any) -> sqlite3.Connection | None:
        """The first two threads look for a file that is not there (mode=rw: not made)."""
        tries.append(1)
        if len(tries) <= 2:
            self._path = tmp_path / "missing.db"
        return opened(self)

    monkeypatch.setattr(blade_runtime.stores.sqlite._Checkpointer, "_open", twice_elsewhere)
    path = tmp_path / "retried.db"
    store = SQLiteStore(path)
    try:
        size = path.stat().st_size
        for attempt in (1, 2):
            for _ in range(CHECKPOINT_EVERY):
                begun(store)
            assert eventually(lambda n=attempt: len(tries) == n and not _checkpoint_threads(path))
        assert not _grows(path, size, 0.2)
        for _ in range(CHECKPOINT_EVERY):
            begun(store)
        assert _grows(path, size) and len(tries) == 3
        assert caplog.text.count("no checkpoints from a thread") == 1
        assert not (tmp_path / "missing.db").exists()
    finally:
        store.close()


def test_sqlite_a_commit_stands_when_no_checkpoint_thread_can_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The commit that would start the checkpointer is committed and reported so, even when
    the thread cannot start (SQLite's own checkpoint is left as the backstop), and the next
    request tries again."""
    import blade_runtime.stores.sqlite

    def no_thread(self: Any) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(blade_runtime.stores.sqlite._Checkpointer, "start", no_thread)
    path = tmp_path / "threadless.db"
    store = SQLiteStore(path)
    try:
        calls = [begun(store) for _ in range(CHECKPOINT_EVERY)]
        assert [store.call(call.call_id) for call in calls] == calls
        assert "no checkpoint thread (can't start new thread)" in caplog.text
        monkeypatch.undo()
        for _ in range(CHECKPOINT_EVERY):
            begun(store)
        assert len(_checkpoint_threads(path)) == 1
    finally:
        store.close()


def test_sqlite_a_newer_schema_version_is_refused_and_nothing_written(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    open_store(path).close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    db.close()
    before = path.read_bytes()
    with pytest.raises(StoreUnavailable) as error:
        open_store(f"sqlite:///{path}")
    assert "schema version 99 is newer" in one_line(error)
    assert path.read_bytes() == before


def test_a_file_that_is_not_a_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("these are my notes, not a database\n" * 50)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(StoreUnavailable) as error:
        open_store(path)
    message = one_line(error)
    assert str(path) in message and "not a blade-runtime store" in message
    assert path.read_text() == "these are my notes, not a database\n" * 50
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def _checkpoint_threads(path: Path) -> list[threading.Thread]:
    """The live checkpointer threads of the store file ``path`` (named after the file)."""
    name = f"blade-runtime checkpoint {path.name}"
    return [thread for thread in threading.enumerate() if thread.name == name]


def _grows(path: Path, size: int, limit_s: float = 10) -> bool:
    """Whether the database file ``path`` grows past ``size`` within ``limit_s``: a WAL
    database file changes only by a checkpoint."""
    return eventually(lambda: path.stat().st_size > size, limit_s)


def started(run: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``run()`` on a thread of its own, started; the list its result is put in."""
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(run()))
    thread.start()
    return thread, results
