"""``SQLiteStore``: the embedded durable store.

WAL journal with ``synchronous=NORMAL``: a commit survives the process being killed; pass
``synchronous="FULL"`` to survive power loss as well (a sync of the disk on every commit, many
times dearer). Every method is one ``BEGIN IMMEDIATE`` transaction, so writers from other
threads and processes queue on the file's lock (``busy_timeout``), and resolving an action is an
``UPDATE ... WHERE state = 'pending'``: exactly one of many concurrent submits changes a row.

The schema is versioned with ``PRAGMA user_version``; ``MIGRATIONS[n]`` (its statements, in one
transaction) takes version n to n+1.

What a commit costs here is mostly the pages it writes (each a WAL frame, and a share of the
checkpoint that syncs the WAL and copies it back), so the transitions of a call touch as few B-trees
as they can: no index follows a call's state. Sweeps find the calls that may need a runtime without
one. A resumable call is in a partial index that the running-suspended-running-settled path never
enters. A running call is found through its owner: ``runtimes`` has a row per owner that may hold
running calls, and each of them is either listed in its ``held`` or was granted to it by a
transaction whose event comes after its ``since`` (every begin, claim and resume appends one), so
a sweep reads the owner's calls from that short tail of the events table. A sweep looks at an
owner only once its row's ``lease_until`` (no later than the lease of any call it holds) has
passed or the owner is known dead, and then moves ``since`` up to the end of the events table, or
drops the row when the owner holds nothing. Leases stay per call, as on every store. A call's
actions are listed in its own row (``action_ids``, written with the state change of its
suspension) instead of an index on the actions table.

Checkpoints run in a thread of the store's own (``_Checkpointer``), not inside the commit that
fills the WAL.

Threads: each thread has its own connection (``close`` closes them all); ``nowait()`` switches the
calling thread to a second one whose busy_timeout is 0, so that an operation that would wait for
the write lock is ``StoreBusy`` at once and the runtime can hand it to a thread; ``renewer()``
renews leases on a connection of its own. Leases are granted from the clock read once the write
lock is held, and a sweep judges them by the clock read before it waited for that lock.

Many processes may share one file (on one machine: SQLite's locks do not hold over network file
systems). Whether the owner of a running call still runs is checked by its pid when it is on this
host; otherwise its lease decides. Other processes' events are found by polling the events table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sqlite3
import threading
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import JsonValue

from blade_runtime.core.store import (
    DEFAULT_LEASE_S,
    ActionAlreadyResolved,
    ActionRecord,
    CallRecord,
    Claimed,
    DataRecord,
    DuplicateCall,
    Event,
    FileRecord,
    GrantRecord,
    LeaseLost,
    Resolution,
    Resolved,
    SaveStopped,
    StoreBusy,
    StoreError,
    StoreUnavailable,
    TriggerRecord,
    UnknownAction,
    clock,
    lapsed_before,
    made_by,
    now,
)
from blade_runtime.core.store import dump_json as _dump
from blade_runtime.core.store import load_json as _load
from blade_runtime.stores.sql import (
    ACTION_COLUMNS,
    CALL_COLUMNS,
    FILE_COLUMNS,
    GRANT_COLUMNS,
    GRANT_KEY,
    TRIGGER_COLUMNS,
    SQLStore,
    action_record,
    action_values,
    call_record,
    call_values,
    file_values,
    grant_key,
    grant_record,
    grant_values,
    trigger_record,
    trigger_values,
)

log = logging.getLogger("blade_runtime")

# The checkpointer copies the WAL back after this many commits of its store (about 400 WAL pages
# at the 4 pages of a typical commit).
CHECKPOINT_EVERY = 100
# SQLite's automatic checkpoint, inside the commit that takes the WAL past this many pages, stays
# as a backstop (SQLite's default is 1,000 pages). Under writes without a pause the WAL cannot
# start over after a checkpoint (a writer has always added frames meanwhile), so it grows to this
# size (16 MB) and the backstop's checkpoint, with little left to copy, lets it start over.
_BACKSTOP_PAGES = 4_000

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: the first release
        """
        CREATE TABLE calls (
            call_id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL,
            name TEXT NOT NULL,
            spec_id TEXT NOT NULL,
            side_effect TEXT NOT NULL,
            execution TEXT NOT NULL,
            input TEXT NOT NULL,
            state TEXT NOT NULL,
            started_at TEXT NOT NULL,
            owner TEXT NOT NULL,
            entry TEXT,
            result TEXT
        ) WITHOUT ROWID
        """,
        """
        CREATE TABLE actions (
            action_id TEXT PRIMARY KEY,
            call_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            name TEXT NOT NULL,
            spec_id TEXT NOT NULL,
            point TEXT,
            payload TEXT NOT NULL,
            submit_schema TEXT NOT NULL,
            suspended_at TEXT NOT NULL,
            state TEXT NOT NULL,
            resume TEXT,
            resolved_at TEXT,
            reason TEXT
        ) WITHOUT ROWID
        """,
        """
        CREATE INDEX actions_pending ON actions (run_id, name) WHERE state = 'pending'
        """,
        """
        CREATE INDEX actions_call ON actions (call_id)
        """,
        """
        CREATE TABLE data (
            seq INTEGER PRIMARY KEY,
            call_id TEXT NOT NULL,
            channel TEXT NOT NULL,
            item_id TEXT NOT NULL,
            value TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            UNIQUE (call_id, channel, item_id)
        )
        """,
        """
        CREATE TABLE events (
            seq INTEGER PRIMARY KEY,  -- not AUTOINCREMENT: nothing is deleted, it costs a write
            run_id TEXT NOT NULL,
            call_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            payload TEXT NOT NULL,
            at TEXT NOT NULL
        )
        """,
    ),
    (  # 2: leases, tenants, the caller's context, action deadlines
        "ALTER TABLE calls ADD COLUMN lease_until REAL NOT NULL DEFAULT 0",
        "ALTER TABLE calls ADD COLUMN tenant TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE calls ADD COLUMN context TEXT",
        "ALTER TABLE actions ADD COLUMN tenant TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE actions ADD COLUMN expires_at REAL",
        # Sweeps read only the calls that may need a runtime: a partial index stays small.
        "CREATE INDEX calls_open ON calls (state) WHERE state IN ('running', 'resumable')",
        "CREATE INDEX calls_run ON calls (run_id)",
        "CREATE INDEX actions_expiring ON actions (expires_at) "
        "WHERE state = 'pending' AND expires_at IS NOT NULL",
    ),
    (  # 3: owners find their running calls, and calls their actions, without per-state indexes
        """
        CREATE TABLE runtimes (
            owner TEXT PRIMARY KEY,
            lease_until REAL NOT NULL,  -- no later than the lease of any call it holds
            since INTEGER NOT NULL,  -- calls granted to it later have an event after this seq
            held TEXT NOT NULL  -- calls granted up to since that may still run (JSON, no brackets)
        ) WITHOUT ROWID
        """,
        "ALTER TABLE calls ADD COLUMN action_ids TEXT",  # the action ids, JSON, without brackets
        "DROP INDEX calls_open",
        "CREATE INDEX calls_resumable ON calls (started_at) WHERE state = 'resumable'",
        "@owners_and_action_ids",  # the data of the two new columns and table, in Python
        "DROP INDEX actions_call",
    ),
    (  # 4: files tools saved, and triggers to deliver
        # A rowid table (not WITHOUT ROWID): its rows hold whole files.
        """
        CREATE TABLE files (
            file_id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            name TEXT NOT NULL,
            media_type TEXT NOT NULL,
            size INTEGER NOT NULL,
            sha256 TEXT NOT NULL,
            created_at TEXT NOT NULL,
            call_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            creator TEXT,
            thread_id TEXT,
            content BLOB NOT NULL
        )
        """,
        """
        CREATE TABLE triggers (
            seq INTEGER PRIMARY KEY,
            trigger_id TEXT NOT NULL UNIQUE,
            call_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            name TEXT NOT NULL,
            tenant TEXT NOT NULL,
            input TEXT NOT NULL,
            created_at TEXT NOT NULL,
            context TEXT,
            thread_id TEXT,
            state TEXT NOT NULL,
            owner TEXT NOT NULL,
            claimed_until REAL NOT NULL,
            finished_at TEXT,
            error TEXT
        )
        """,
        # Deliveries read only the triggers not yet delivered.
        "CREATE INDEX triggers_open ON triggers (seq) WHERE state IN ('pending', 'claimed')",
    ),
    (  # 5: a call's narrowed kind and its fencing token; standing permission grants
        "ALTER TABLE calls ADD COLUMN kind TEXT",
        "ALTER TABLE calls ADD COLUMN fence INTEGER NOT NULL DEFAULT 0",
        """
        CREATE TABLE grants (
            grant_id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            principal TEXT NOT NULL,
            tool TEXT NOT NULL,
            subject TEXT NOT NULL,
            created_at TEXT NOT NULL,
            action_id TEXT,
            spec_id TEXT NOT NULL,
            point TEXT NOT NULL,
            UNIQUE (tenant, principal, tool, spec_id, point, subject)
        ) WITHOUT ROWID
        """,
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)


def _owners_and_action_ids(db: sqlite3.Connection) -> None:
    """Migration 3's data: a runtimes row per owner of running calls, and each call's actions."""
    head = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
    held: dict[str, tuple[list[str], float]] = {}
    for owner, call_id, lease_until in db.execute(
        "SELECT owner, call_id, lease_until FROM calls WHERE state = 'running'"
    ):
        ids, earliest = held.get(owner, ([], lease_until))
        ids.append(call_id)
        held[owner] = (ids, min(earliest, lease_until))
    db.executemany(
        "INSERT INTO runtimes (owner, lease_until, since, held) VALUES (?, ?, ?, ?)",
        [(owner, earliest, head, _dump(ids)[1:-1]) for owner, (ids, earliest) in held.items()],
    )
    listed: dict[str, list[str]] = {}
    for call_id, action_id in db.execute("SELECT call_id, action_id FROM actions"):
        listed.setdefault(call_id, []).append(action_id)
    db.executemany(
        "UPDATE calls SET action_ids = ? WHERE call_id = ?",
        [(_dump(ids)[1:-1], call_id) for call_id, ids in listed.items()],
    )


_STEPS = {"@owners_and_action_ids": _owners_and_action_ids}

_HOST = socket.gethostname()
_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _busy(error: sqlite3.Error) -> bool:
    """Whether ``error`` is a lock another connection holds (not a disk, file or bug)."""
    return getattr(error, "sqlite_errorcode", 0) & 0xFF in _BUSY


def _rollback(db: sqlite3.Connection) -> None:
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


class _Gate:
    """Counts the threads inside SQLite (store operations, checkpoints); ``os.fork`` waits until
    none is, and lets none in until it returns: a child forked while another thread held one of
    SQLite's own mutexes would find it held for good (15 of 621 children forked amid checkpoints
    hung opening a database). A fork waits at most ``FORK_WAIT_S`` (a thread may be waiting for
    a lock up to its busy_timeout)."""

    FORK_WAIT_S = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._inside = 0
        self._forking = False

    def __enter__(self) -> None:
        with self._lock:
            while self._forking:
                self._changed.wait()
            self._inside += 1

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._inside -= 1
            if self._forking and not self._inside:
                self._changed.notify_all()

    def before_fork(self) -> None:
        self._lock.acquire()
        self._forking = True
        self._changed.wait_for(lambda: not self._inside, self.FORK_WAIT_S)

    def after_fork_in_parent(self) -> None:
        self._forking = False
        self._changed.notify_all()
        self._lock.release()

    def after_fork_in_child(self) -> None:
        self._forking, self._inside = False, 0  # the child has only the forking thread
        self._lock.release()


_IN_SQLITE = _Gate()
if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(
        before=_IN_SQLITE.before_fork,
        after_in_parent=_IN_SQLITE.after_fork_in_parent,
        after_in_child=_IN_SQLITE.after_fork_in_child,
    )


class _Transaction:
    """``with store._write() as db``: one BEGIN IMMEDIATE transaction, committed at the end or
    rolled back (a class, not a generator: it is entered on every state change). A lock another
    connection holds is ``StoreBusy`` within ``nowait()`` and ``StoreUnavailable`` past the
    busy_timeout, whichever statement met it; either way the transaction is rolled back."""

    __slots__ = ("_db", "_store")

    def __init__(self, store: SQLiteStore, db: sqlite3.Connection) -> None:
        self._db = db
        self._store = store

    def __enter__(self) -> sqlite3.Connection:
        _IN_SQLITE.__enter__()
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:  # locked (past busy_timeout), a disk gone
            _IN_SQLITE.__exit__()
            raise self._store._failed(error) from None
        return self._db

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: object
    ) -> None:
        db = self._db
        try:
            if kind is None:
                try:
                    db.execute("COMMIT")
                except sqlite3.Error as failure:
                    _rollback(db)
                    raise self._store._failed(failure) from None
                except BaseException:
                    _rollback(db)
                    raise
                self._store._committed()  # never raises: the change is committed
                return
            _rollback(db)
            if isinstance(error, sqlite3.OperationalError):
                raise self._store._failed(error) from None
        finally:
            _IN_SQLITE.__exit__()


class _NoWait:
    """``store.nowait()``: the calling thread's operations run on its connection whose
    busy_timeout is 0 (a class, not a generator: the runtime enters it around every operation
    it tries on the event loop's thread)."""

    __slots__ = ("_local", "_saved", "_store")

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        self._local = store._local
        self._saved: sqlite3.Connection | None = None

    def __enter__(self) -> None:
        local = self._local
        if getattr(local, "nowait", False):
            return  # nested: the outer one restores
        self._saved = self._store._connection()
        fast = getattr(local, "fast", None)
        if fast is None:
            fast = local.fast = self._store._open(busy_timeout_ms=0)
        local.connection, local.nowait = fast, True

    def __exit__(self, *_: object) -> None:
        if self._saved is not None:
            self._local.connection, self._local.nowait = self._saved, False
            self._saved = None


class _Once:
    """A warning logged once (by a store and its checkpointer threads, which must not hold the
    store itself: a store nobody closes must still be collected, and its thread end then)."""

    def __init__(self) -> None:
        self.said = False

    def warn(self, message: str, *args: object) -> None:
        if not self.said:
            self.said = True
            log.warning(message, *args)


class _Checkpointer:
    """A thread that copies the WAL back into the database file, so that no commit waits for it.

    SQLite's automatic checkpoint runs inside the commit that takes the WAL past 1,000 pages, and
    that commit waits while the WAL is synced and copied, most of the commit time of a cycle when
    it is spread over the cycles between checkpoints (bench/pending.py). This thread runs a
    PASSIVE checkpoint, which waits for no reader or writer, whenever ``request`` is called. A
    failed checkpoint is logged and left to the next one (or the backstop); a thread that cannot
    open the file ends, and the store starts another later."""

    def __init__(self, path: Path, synchronous: str, warnings: _Once) -> None:
        self.pid = os.getpid()  # a forked child has none of its parent's threads
        self.gave_up = False  # it could not open the file
        self._path, self._synchronous, self._warnings = path, synchronous, warnings
        self._due = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, name=f"blade-runtime checkpoint {path.name}", daemon=True
        )

    def serves(self) -> bool:
        return self.pid == os.getpid() and not self.gave_up

    def start(self) -> None:
        self._thread.start()

    def request(self) -> None:
        self._due.set()

    def signal_stop(self) -> None:
        """Asks the thread to end (after the checkpoint under way, if any)."""
        self._stopping = True
        self._due.set()

    def stop(self) -> None:
        """Ends the thread, and waits for it in the process that started it."""
        self.signal_stop()
        thread, here = self._thread, self.pid == os.getpid()
        if here and thread.ident is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        with _IN_SQLITE:
            db = self._open()
        if db is None:
            self.gave_up = True
            return
        try:
            while True:
                self._due.wait()
                self._due.clear()
                if self._stopping:
                    return
                with _IN_SQLITE:
                    self._checkpoint(db)
        finally:
            with _IN_SQLITE:
                db.close()

    def _open(self) -> sqlite3.Connection | None:
        try:  # mode=rw: a file removed meanwhile is not made again, empty
            uri = f"{self._path.resolve().as_uri()}?mode=rw"
            db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            db.execute(f"PRAGMA synchronous={self._synchronous}")  # how the checkpoint syncs
        except (sqlite3.Error, OSError, RuntimeError) as error:  # resolve() raises the latter two
            self._warnings.warn("%s: no checkpoints from a thread (%s)", self._path, error)
            return None
        return db

    def _checkpoint(self, db: sqlite3.Connection) -> None:
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as error:
            self._warnings.warn("%s: a checkpoint failed (%s); retried later", self._path, error)


class SQLiteStore(SQLStore):
    """A durable store in one SQLite file, shared safely by threads and processes."""

    # The class of its connections (a subclass may trace or time the statements it runs).
    connection_class: type[sqlite3.Connection] = sqlite3.Connection
    _mark = "?"
    _holds_nul = True
    _files, _triggers = "files", "triggers"
    _calls, _actions, _data, _grants = "calls", "actions", "data", "grants"
    inline_first = True  # an uncontended commit costs less than a thread hop

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout_ms: int = 30_000,
        create: bool = True,
    ) -> None:
        """``create=False``: only a store a runtime has made is opened (see ``open_store``)."""
        super().__init__()
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self.poll_s = 0.05  # how often other processes' events are looked for
        self._synchronous = synchronous
        self._busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        self._renewers: weakref.WeakSet[SQLiteRenewer] = weakref.WeakSet()
        self._commits = 0  # by this store's connections (counted without a lock: a hint)
        self._checkpointer: _Checkpointer | None = None  # started by the first commits
        self._checkpoint_warnings = _Once()
        self._closed = False  # until a connection is made again
        if not create:
            self._refuse_unless_made()
        try:
            self._migrate()
        except sqlite3.DatabaseError as error:
            self.close()
            raise self._not_made(str(error)) from None

    # -- connections and transactions ----------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        """One connection per thread: a sqlite3 connection must not be used by two threads at
        once (made without sqlite3's same-thread check only so that ``close`` can close it)."""
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = self._open(self._busy_timeout_ms)
        return connection

    def _open(self, busy_timeout_ms: int, *, shared: bool = True) -> sqlite3.Connection:
        """A new connection; ``shared``: one of the store's (``close`` closes it)."""
        with _IN_SQLITE:
            connection = sqlite3.connect(
                self.path,
                timeout=busy_timeout_ms / 1000,
                isolation_level=None,
                check_same_thread=False,
                factory=self.connection_class,
            )
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute(f"PRAGMA synchronous={self._synchronous}")
                connection.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
                connection.execute(f"PRAGMA wal_autocheckpoint={_BACKSTOP_PAGES}")
            except sqlite3.OperationalError as error:  # locked, a disk gone
                connection.close()
                raise self._failed(error) from None
            except BaseException:  # not a database, among others: the caller says which
                connection.close()
                raise
        if shared:
            with self._connections_lock:
                self._connections.append(connection)
                self._closed = False
        return connection

    def _write(self) -> _Transaction:
        return _Transaction(self, self._connection())

    def _failed(self, error: sqlite3.Error) -> StoreError:
        """What a failed statement is: ``StoreBusy`` for a lock met within ``nowait()``."""
        if _busy(error) and getattr(self._local, "nowait", False):
            return StoreBusy(f"{self.url}: {error}")
        return StoreUnavailable(f"{self.url}: {error}")

    def _fetch(self, query: str, values: Sequence[Any]) -> list[tuple[Any, ...]]:
        db = self._connection()
        with _IN_SQLITE:
            try:
                return db.execute(query, values).fetchall()
            except sqlite3.OperationalError as error:
                raise self._failed(error) from None

    def nowait(self) -> contextlib.AbstractContextManager[None]:
        return _NoWait(self)

    def renewer(self) -> SQLiteRenewer:
        renewer = SQLiteRenewer(self)
        self._renewers.add(renewer)
        return renewer

    def _committed(self) -> None:
        """Counts a commit, and asks for a checkpoint every CHECKPOINT_EVERY. Never raises: the
        change is committed."""
        self._commits += 1
        if self._commits % CHECKPOINT_EVERY:
            return
        checkpointer = self._checkpointer
        if checkpointer is None or not checkpointer.serves():
            checkpointer = self._new_checkpointer()
        if checkpointer is not None:
            checkpointer.request()

    def _new_checkpointer(self) -> _Checkpointer | None:
        with self._connections_lock:
            if self._closed:  # a commit of another thread that raced close()
                return None
            current = self._checkpointer
            if current is not None and current.serves():
                return current
            made = _Checkpointer(self.path, self._synchronous, self._checkpoint_warnings)
            self._checkpointer = made
        try:
            made.start()  # outside the lock: a fork meanwhile finds it free
        except RuntimeError as error:  # no thread to be had: SQLite's own checkpoint stays
            self._checkpoint_warnings.warn("%s: no checkpoint thread (%s)", self.path, error)
            with self._connections_lock:
                if self._checkpointer is made:
                    self._checkpointer = None  # tried again at the next request
            return None
        weakref.finalize(self, made.signal_stop)  # a store nobody closes ends its thread too
        return made

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """One snapshot for several reads."""
        db = self._connection()
        with _IN_SQLITE:
            try:
                db.execute("BEGIN")
                try:
                    yield db
                finally:
                    _rollback(db)
            except sqlite3.OperationalError as error:
                raise self._failed(error) from None

    def _refuse_unless_made(self) -> None:
        """Read, on a read-only connection, whether a runtime made this store: nothing is
        written to a file that is not one (not even the switch to WAL)."""
        try:
            with contextlib.closing(
                sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
            ) as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as error:
            raise self._not_made(str(error)) from None
        if version == 0:
            raise self._not_made()

    def _migrate(self) -> None:
        with self._write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]

            def run(statement: str) -> None:
                if statement in _STEPS:
                    _STEPS[statement](db)
                else:
                    db.execute(statement)

            self._migrate_from(version, MIGRATIONS, run)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @staticmethod
    def _append(db: sqlite3.Connection, event: Event) -> None:
        cursor = db.execute(
            "INSERT INTO events (run_id, call_id, kind, payload, at) VALUES (?, ?, ?, ?, ?)",
            (event.run_id, event.call_id, event.kind, _dump(event.payload), event.at),
        )
        event.seq = int(cursor.lastrowid or 0)

    @staticmethod
    def _head(db: sqlite3.Connection) -> int:
        # One writer at a time, numbering in its transaction: numbers follow commit order.
        row = db.execute("SELECT MAX(seq) FROM events").fetchone()
        return int(row[0] or 0)

    def _grant(self, db: sqlite3.Connection, owner: str, lease_until: float, seq: int) -> None:
        """``owner`` now holds a running call, granted by the transaction whose event is ``seq``:
        its runtimes row exists (a new one starts just before that event), and its lease_until is
        no later than this call's. Usually the row is there already and no page is written.
        (Always a statement: another runtime's sweep may have rewritten or dropped the row on a
        verdict that this owner died, and a call granted then must still be found.)"""
        db.execute(
            "INSERT INTO runtimes (owner, lease_until, since, held) VALUES (?, ?, ?, '') "
            "ON CONFLICT (owner) DO UPDATE SET lease_until = excluded.lease_until "
            "WHERE excluded.lease_until < runtimes.lease_until",
            (owner, lease_until, seq - 1),
        )

    @staticmethod
    def _running_of(
        db: sqlite3.Connection, owner: str, since: int, held: str
    ) -> list[tuple[Any, ...]]:
        """The rows of the calls running under ``owner``: those its runtimes row lists, and
        those of the events after its ``since`` that it still owns."""
        listed = _load(f"[{held}]")
        rows = db.execute(
            f"SELECT {CALL_COLUMNS} FROM calls WHERE call_id IN "
            "(SELECT call_id FROM events WHERE seq > ?) AND owner = ? AND state = 'running'",
            (since, owner),
        ).fetchall()
        found = {row[0] for row in rows}
        for start in range(0, len(listed), 500):
            chunk = [call_id for call_id in listed[start : start + 500] if call_id not in found]
            if chunk:
                rows += db.execute(
                    f"SELECT {CALL_COLUMNS} FROM calls WHERE call_id IN "
                    f"({','.join('?' * len(chunk))}) AND owner = ? AND state = 'running'",
                    (*chunk, owner),
                ).fetchall()
        return rows

    def _keep(
        self,
        db: sqlite3.Connection,
        owner: str,
        left: list[CallRecord],
        head: int,
        until: float | None = None,
    ) -> None:
        """Rewrite ``owner``'s runtimes row once its running calls were read (``left``: those it
        still holds): they are listed, the events up to ``head`` need no reading again, and
        lease_until is the earliest of their leases. ``until``: a renewal (every call it holds
        and the row have that lease). A sweep drops the row of an owner that holds nothing (its
        next grant makes one)."""
        if not left and until is None:
            db.execute("DELETE FROM runtimes WHERE owner = ?", (owner,))
            return
        earliest = min(c.lease_until for c in left) if until is None else until
        row = (earliest, head, _dump([c.call_id for c in left])[1:-1])
        # A row that stays as it was is not written (a sweep every second would rewrite it).
        db.execute(
            "UPDATE runtimes SET lease_until = ?, since = ?, held = ? "
            "WHERE owner = ? AND (lease_until, since, held) IS NOT (?, ?, ?)",
            (*row, owner, *row),
        )

    @staticmethod
    def _put_call(
        db: sqlite3.Connection, call: CallRecord, lease_until: float, action_ids: str | None = None
    ) -> None:
        db.execute(
            f"INSERT INTO calls ({CALL_COLUMNS}, action_ids) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (*call_values(call, lease_until), action_ids),
        )

    def _renew(self, db: sqlite3.Connection, owner: str, lease_s: float) -> set[str]:
        """``renew`` in the transaction of ``db`` (the write lock taken: the clock read now)."""
        row = db.execute("SELECT since, held FROM runtimes WHERE owner = ?", (owner,)).fetchone()
        if row is None:  # it holds no running call (each grant makes the row)
            return set()
        until = clock() + lease_s
        held = [call_record(r) for r in self._running_of(db, owner, row[0], row[1])]
        ids = [c.call_id for c in held]
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            db.execute(
                f"UPDATE calls SET lease_until = ? WHERE call_id IN "
                f"({','.join('?' * len(chunk))})",
                (until, *chunk),
            )
        self._keep(db, owner, held, self._head(db), until)
        return set(ids)

    # -- the Store interface -------------------------------------------------------------------

    def begin(self, call: CallRecord, event: Event, *, lease_s: float = DEFAULT_LEASE_S) -> None:
        with self._write() as db:
            running = call.state == "running"
            until = clock() + lease_s if running else call.lease_until  # the write lock held
            try:
                self._put_call(db, call, until)
            except sqlite3.IntegrityError:
                raise DuplicateCall(call.call_id) from None
            self._append(db, event)
            if running:
                self._grant(db, call.owner, until, event.seq)
        call.lease_until = until

    def suspend(
        self, call: CallRecord, action: ActionRecord, event: Event, *, known: bool = False
    ) -> None:
        listed = _dump(action.action_id)
        with self._write() as db:
            if known:
                changed = db.execute(
                    "UPDATE calls SET state = ?, action_ids = COALESCE(action_ids || ',', '') || ? "
                    "WHERE call_id = ? AND owner = ? AND state = 'running'",
                    (call.state, listed, call.call_id, call.owner),
                ).rowcount
                if not changed:
                    raise LeaseLost(call.call_id, call.owner)
            else:
                self._put_call(db, call, call.lease_until, listed)
            db.execute(
                f"INSERT INTO actions ({ACTION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                action_values(action, self._schemas),
            )
            self._append(db, event)

    def resolve(self, action_id: str, resolution: Resolution, event: Event) -> Resolved:
        with self._write() as db:
            expiry = " AND expires_at <= ?" if resolution.only_if_expired else ""
            row = db.execute(
                "UPDATE actions SET state = ?, resume = ?, resolved_at = ?, reason = ? "
                f"WHERE action_id = ? AND state = 'pending'{expiry} RETURNING {ACTION_COLUMNS}",
                (
                    resolution.state,
                    _dump(resolution.resume),
                    resolution.resolved_at,
                    resolution.reason,
                    action_id,
                    *((clock(),) if expiry else ()),
                ),
            ).fetchone()
            if row is None:  # lost the race, or no such action: say which, and how it went
                found = db.execute(
                    f"SELECT {ACTION_COLUMNS} FROM actions WHERE action_id = ?", (action_id,)
                ).fetchone()
                if found is None:
                    raise UnknownAction(action_id)
                raise ActionAlreadyResolved(action_record(found, self._schemas))
            action = action_record(row, self._schemas)
            owner = resolution.call_owner
            until = clock() + resolution.lease_s if owner else 0.0  # the write lock held
            call_input = db.execute(
                "UPDATE calls SET state = ?, entry = ?, result = ?, owner = COALESCE(?, owner), "
                "input = COALESCE(?, input), kind = COALESCE(?, kind), "
                "side_effect = COALESCE(?, side_effect), lease_until = ?, fence = fence + ? "
                "WHERE call_id = ? RETURNING input, context, fence",
                (
                    resolution.call_state,
                    _dump(resolution.call_entry),
                    _dump(resolution.call_result),
                    owner,
                    None if resolution.call_input is None else _dump(dict(resolution.call_input)),
                    resolution.call_kind,
                    resolution.call_side_effect,
                    until,
                    1 if owner else 0,
                    action.call_id,
                ),
            ).fetchone()
            self._append(db, event)
            if owner and resolution.call_state == "running" and call_input is not None:
                self._grant(db, owner, until, event.seq)
            if call_input is None:
                return Resolved(action, {})
            return Resolved(action, _load(call_input[0]), _load(call_input[1]), int(call_input[2]))

    def settle(self, call_id: str, result: JsonValue, event: Event, *, owner: str) -> None:
        with self._write() as db:
            changed = db.execute(
                "UPDATE calls SET state = 'settled', result = ? WHERE call_id = ? AND owner = ? "
                "AND state = 'running'",
                (_dump(result), call_id, owner),
            ).rowcount
            if not changed:
                raise LeaseLost(call_id, owner)
            self._append(db, event)

    def claim(
        self,
        owner: str,
        lease_s: float,
        *,
        dead: Collection[str] = (),
        names: Collection[str] | Mapping[str, str] | None = None,
        call_id: str | None = None,
        limit: int = 100,
        waited_s: float = 0.0,
    ) -> list[Claimed]:
        # Leases are judged by the clock before the wait for the write lock, and not at all
        # after a long wait (see Store.claim): an owner whose renewal waits behind the same
        # lock keeps its calls. BEGIN IMMEDIATE then holds the lock from the reads to the
        # updates: sweeps of other processes wait for it and then find these calls owned, with
        # fresh leases.
        began = clock()
        gone = set(dead)
        wanted = None if names is None else set(names)

        def claimable(call: CallRecord, lapsed: float) -> bool:
            if names is not None and not made_by(call, names):
                return False
            if call.state == "resumable":
                return True
            return call.state == "running" and (call.lease_until < lapsed or call.owner in gone)

        with self._write() as db:
            granted = clock()
            until = granted + lease_s
            lapsed = lapsed_before(began, granted, waited_s, lease_s)
            examined: list[tuple[str, list[CallRecord]]] = []
            if call_id is not None:
                row = db.execute(
                    f"SELECT {CALL_COLUMNS} FROM calls WHERE call_id = ?", (call_id,)
                ).fetchone()
                candidates = [
                    c for c in ([] if row is None else [call_record(row)]) if claimable(c, lapsed)
                ]
            else:
                only, values = "", []
                if isinstance(names, Mapping):
                    pairs = " OR ".join(["(name = ? AND spec_id = ?)"] * len(names))
                    only = f" AND ({pairs or 'FALSE'})"
                    values = [value for pair in names.items() for value in pair]
                elif wanted is not None:
                    only, values = f" AND name IN ({','.join('?' * len(wanted))})", [*wanted]
                candidates = [
                    call_record(row)
                    for row in db.execute(
                        f"SELECT {CALL_COLUMNS} FROM calls WHERE state = 'resumable'{only} "
                        "ORDER BY started_at LIMIT ?",
                        (*values, limit),
                    )
                ]
                marks = ",".join("?" * len(gone))
                due = db.execute(
                    "SELECT owner, since, held FROM runtimes WHERE lease_until < ?"
                    + (f" OR owner IN ({marks})" if gone else ""),
                    (lapsed, *gone),
                ).fetchall()
                for who, since, held in due:
                    running = [call_record(row) for row in self._running_of(db, who, since, held)]
                    examined.append((who, running))
                    candidates += [c for c in running if claimable(c, lapsed)]
                candidates.sort(key=lambda c: c.started_at)
                del candidates[limit:]
            head = self._head(db) if examined else 0
            claimed, first = [], 0
            for before in candidates:
                db.execute(
                    "UPDATE calls SET state = 'running', owner = ?, lease_until = ?, "
                    "fence = fence + 1 WHERE call_id = ?",
                    (owner, until, before.call_id),
                )
                after = replace(
                    before, state="running", owner=owner, lease_until=until, fence=before.fence + 1
                )
                payload: JsonValue = {"was": before.state, "previous_owner": before.owner}
                event = Event(before.run_id, before.call_id, "claimed", payload, now())
                self._append(db, event)
                first = first or event.seq
                claimed.append(Claimed(after, before.state, before.owner))
            taken = {c.call.call_id for c in claimed}
            for who, running in examined:
                self._keep(db, who, [c for c in running if c.call_id not in taken], head)
            if claimed:
                self._grant(db, owner, until, first)
            return claimed

    def renew(self, owner: str, lease_s: float) -> set[str]:
        with self._write() as db:
            return self._renew(db, owner, lease_s)

    def owners(self) -> set[str]:
        """The owners whose runtimes row has not come due: each holds, or lately held, a
        running call whose lease has not expired. A row's lease_until is its earliest lease, so
        an owner of a lapsed call and a live one is left out until the sweep (which examines
        due rows anyway) moves its row to the live lease."""
        return {
            row[0]
            for row in self._fetch("SELECT owner FROM runtimes WHERE lease_until >= ?", (clock(),))
        }

    def alive(self, owner: str) -> bool | None:
        """Only a process on this host can be checked (by its pid)."""
        host, _, rest = owner.partition(":")
        pid = rest.partition(":")[0]
        if host != _HOST or not pid.isdigit():
            return None
        if int(pid) == os.getpid():
            return None  # a runtime of this process: it tells for itself
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def attach(self, owner: str) -> None:
        pass

    def detach(self, owner: str) -> None:
        pass

    def held(self, call_id: str, owner: str, fence: int) -> bool:
        if not (self._holdable(call_id) and self._holdable(owner)):
            return False
        return bool(
            self._fetch(
                "SELECT 1 FROM calls WHERE call_id = ? AND owner = ? AND fence = ? "
                "AND state = 'running' AND lease_until >= ?",
                (call_id, owner, fence, clock()),
            )
        )

    def add_grant(self, grant: GrantRecord) -> GrantRecord:
        with self._write() as db:
            db.execute(
                f"INSERT INTO grants ({GRANT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?) "
                f"ON CONFLICT ({GRANT_KEY}) DO NOTHING",
                grant_values(grant),
            )
            row = db.execute(
                f"SELECT {GRANT_COLUMNS} FROM grants WHERE tenant = ? AND principal = ? "
                "AND tool = ? AND spec_id = ? AND point = ? AND subject = ?",
                grant_key(grant),
            ).fetchone()
        return grant_record(row)

    def revoke_grant(
        self, grant_id: str, *, tenant: str | None = None, principal: str | None = None
    ) -> GrantRecord | None:
        if not self._holdable(grant_id):
            return None
        only = ("" if tenant is None else " AND tenant = ?") + (
            "" if principal is None else " AND principal = ?"
        )
        values = [v for v in (tenant, principal) if v is not None]
        with self._write() as db:
            row = db.execute(
                f"DELETE FROM grants WHERE grant_id = ?{only} RETURNING {GRANT_COLUMNS}",
                (grant_id, *values),
            ).fetchone()
        return None if row is None else grant_record(row)

    def write_data(self, record: DataRecord, event: Event | None) -> None:
        with self._write() as db:
            # Same item id: the value and time change, the position (seq, the rowid) stays.
            db.execute(
                "INSERT INTO data (call_id, channel, item_id, value, updated_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (call_id, channel, item_id) DO UPDATE SET "
                "value = excluded.value, updated_at = excluded.updated_at",
                (
                    record.call_id,
                    record.channel,
                    record.item_id,
                    _dump(record.value),
                    record.updated_at,
                ),
            )
            if event is not None:
                self._append(db, event)

    # -- files and triggers ----------------------------------------------------------------

    def save_file(
        self, record: FileRecord, content: bytes, *, keep: Callable[[], bool] | None = None
    ) -> None:
        with self._write() as db:
            db.execute(
                f"INSERT INTO files ({FILE_COLUMNS}, content) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (*file_values(record), content),
            )
            if keep is not None and not keep():  # rolled back: nothing of it is stored
                raise SaveStopped(f"file {record.file_id} was not kept")

    def add_trigger(self, trigger: TriggerRecord, event: Event, *, owner: str | None) -> bool:
        with self._write() as db:
            if owner is not None:
                held = db.execute(
                    "SELECT 1 FROM calls WHERE call_id = ? AND owner = ? AND state = 'running' "
                    "AND lease_until >= ?",
                    (trigger.call_id, owner, clock()),
                ).fetchone()
                if held is None:
                    raise LeaseLost(trigger.call_id, owner)
            added = db.execute(
                f"INSERT INTO triggers ({TRIGGER_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (trigger_id) DO NOTHING",
                trigger_values(trigger),
            ).rowcount
            if not added:
                return False
            self._append(db, event)
            return True

    def claim_triggers(
        self, owner: str, lease_s: float, *, limit: int = 100
    ) -> list[TriggerRecord]:
        with self._write() as db:  # the write lock: concurrent claims wait, then see these taken
            at = clock()
            rows = db.execute(
                "UPDATE triggers SET state = 'claimed', owner = ?, claimed_until = ? "
                "WHERE seq IN (SELECT seq FROM triggers WHERE state IN ('pending', 'claimed') "
                "AND (state = 'pending' OR claimed_until < ?) ORDER BY seq LIMIT ?) "
                f"RETURNING seq, {TRIGGER_COLUMNS}",
                (owner, at + lease_s, at, limit),
            ).fetchall()
        return [trigger_record(row[1:]) for row in sorted(rows)]

    def finish_trigger(self, trigger_id: str, owner: str, *, error: str | None = None) -> bool:
        with self._write() as db:
            changed = db.execute(
                "UPDATE triggers SET state = ?, finished_at = ?, error = ? "
                "WHERE trigger_id = ? AND owner = ? AND state = 'claimed'",
                ("delivered" if error is None else "failed", now(), error, trigger_id, owner),
            ).rowcount
        return bool(changed)

    def _actions_of(
        self, call_id: str, clauses: list[str], values: list[Any]
    ) -> list[tuple[Any, ...]]:
        # The call lists its actions (no index on the actions' call id): look them up by id.
        filters = "".join(f" AND {clause}" for clause in clauses)
        with self._reading() as db:
            listed = db.execute(
                "SELECT action_ids FROM calls WHERE call_id = ?", (call_id,)
            ).fetchone()
            ids: list[str] = [] if listed is None else _load(f"[{listed[0] or ''}]")
            rows: list[tuple[Any, ...]] = []
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                rows += db.execute(
                    f"SELECT {ACTION_COLUMNS} FROM actions WHERE action_id IN "
                    f"({','.join('?' * len(chunk))}){filters}",
                    (*chunk, *values),
                ).fetchall()
        rows.sort(key=lambda row: (row[8], row[0]))  # suspended_at, action_id
        return rows

    def events(self, run_id: str, after: int = 0) -> list[Event]:
        # No index on run_id (it would cost every transaction): a range scan from ``after``,
        # which is short when a subscriber catches up from the last event it saw.
        rows = self._fetch(
            "SELECT run_id, call_id, kind, payload, at, seq FROM events "
            "WHERE seq > ? AND run_id = ? ORDER BY seq",
            (after, run_id),
        )
        return [Event(r[0], r[1], r[2], _load(r[3]), r[4], r[5]) for r in rows]

    def head(self, run_id: str | None = None) -> int:
        rows = self._fetch("SELECT MAX(seq) FROM events", ())
        return int(rows[0][0] or 0)

    async def changed(self, timeout_s: float) -> None:
        # SQLite tells no other process of a commit: poll (the reader compares sequence numbers).
        await asyncio.sleep(min(timeout_s, self.poll_s))

    def close(self) -> None:
        """Closes every connection of the store, those other threads made and the renewers'
        too (an operation after it opens a connection again)."""
        with self._connections_lock:
            checkpointer, self._checkpointer = self._checkpointer, None
            self._closed = True
        if checkpointer is not None:
            checkpointer.stop()
        for renewer in list(self._renewers):
            renewer.close()
        with self._connections_lock:
            for connection in self._connections:
                with contextlib.suppress(sqlite3.Error):
                    connection.close()
            self._connections.clear()
        self._local = threading.local()


class SQLiteRenewer:
    """``SQLiteStore.renewer()``: renewals on a connection of its own, opened at the first one
    (by whichever thread calls it; one at a time), waiting for the write lock as long as the
    store's busy_timeout."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def renew(self, owner: str, lease_s: float) -> set[str]:
        with self._lock:
            if self._db is None:
                self._db = self._store._open(self._store._busy_timeout_ms, shared=False)
            with _Transaction(self._store, self._db) as db:
                return self._store._renew(db, owner, lease_s)

    def close(self) -> None:
        with self._lock:
            db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()
