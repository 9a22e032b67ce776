"""``SQLiteStore``: the embedded durable store (a dialect of ``blade_runtime.stores.sql``).

WAL journal with ``synchronous=NORMAL``: a commit survives the process being killed; pass
``synchronous="FULL"`` to survive power loss as well (a sync of the disk on every commit, many
times dearer). Every transition is one ``BEGIN IMMEDIATE`` transaction of the rules' statements,
so writers from other threads and processes queue on the file's lock (``busy_timeout``), and the
clock a lease is granted from is read with that lock held.

The schema is versioned with ``PRAGMA user_version``; ``MIGRATIONS[n]`` (its statements, in one
transaction) takes version n to n+1. A new file vacuums incrementally: a prune gives the pages
of what it deleted back; the WAL is cut back to 16 MB after each checkpoint that empties it.

What a commit costs here is mostly the pages it writes (each a WAL frame, and a share of the
checkpoint that syncs the WAL and copies it back), so no index follows a call's state through its
life: the listings' indexes have keys that never change (written once, at a row's insert). Sweeps
find the calls that may need a runtime without one. A resumable call is in a partial index that
the running-suspended-running-settled path never enters. A running call is found through its
owner: ``blade_runtimes`` has a row per owner that may hold running calls, and each of them is
either listed in its ``held`` or was granted to it by a transaction whose event comes after its
``since`` (every begin, claim and resume appends one), so a sweep reads the owner's calls from
that short tail of the events table. A sweep looks at an owner only once its row's
``lease_until`` (no later than the lease of any call it holds) has passed or the owner is known
dead, and then moves ``since`` up to the end of the events table, or drops the row when the owner
holds nothing. Leases stay per call, as on every store.

Checkpoints run in a thread of the store's own (``_Checkpointer``), not inside the commit that
fills the WAL.

Threads: each thread has its own connection (``close`` closes them all); ``nowait()`` switches the
calling thread to a second one whose busy_timeout is 0, so that an operation that would wait for
the write lock is ``StoreBusy`` at once and the runtime can hand it to a thread; ``renewer()``
renews leases on a connection of its own.

Many processes may share one file (on one machine: SQLite's locks do not hold over network file
systems). Whether the owner of a running call still runs is checked by its pid when it is on this
host; otherwise its lease decides. Other processes' events are found by polling the run's events
(an indexed read of the rows after the last one seen).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Literal

from blade_runtime.core.store import (
    CallRecord,
    Event,
    StoreBusy,
    StoreError,
    StoreUnavailable,
    clock,
)
from blade_runtime.core.store import dump_json as _dump
from blade_runtime.core.store import load_json as _load
from blade_runtime.stores.sql import (
    CALL_COLUMNS,
    Candidates,
    Rows,
    SQLStore,
    Tx,
    call_record,
    names_filter,
)
from blade_runtime.stores.sqlite_schema import MIGRATIONS, SCHEMA_VERSION, STEPS

log = logging.getLogger("blade_runtime")

# The checkpointer copies the WAL back after this many commits of its store (about 400 WAL pages
# at the 4 pages of a typical commit).
CHECKPOINT_EVERY = 100
# SQLite's automatic checkpoint, inside the commit that takes the WAL past this many pages, stays
# as a backstop (SQLite's default is 1,000 pages). Under writes without a pause the WAL cannot
# start over after a checkpoint (a writer has always added frames meanwhile), so it grows to this
# size (16 MB) and the backstop's checkpoint, with little left to copy, lets it start over.
_BACKSTOP_PAGES = 4_000
# After a checkpoint has copied the whole WAL back, the file is cut to this size: with several
# writer processes the WAL can grow far past the backstop while readers hold its old frames.
_WAL_LIMIT_BYTES = 16 * 1024 * 1024


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


class _Rows:
    """A statement's rows, read at once (SQLite runs each statement as it is given)."""

    __slots__ = ("_rows",)

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def all(self) -> list[tuple[Any, ...]]:
        return self._rows

    def one(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None


class _Refused(Exception):
    """A guard found no row: the transaction is rolled back, then ``failure()`` is raised."""

    def __init__(self, failure: Callable[[], StoreError]) -> None:
        self.failure = failure


@functools.lru_cache(maxsize=512)
def _sql(text: str) -> str:
    """A statement as SQLite takes it: the clock is the ``now`` parameter, read with the write
    lock held."""
    return text.replace("{now}", ":now")


class _Tx:
    """One ``BEGIN IMMEDIATE`` transaction on a connection: ``began`` is the clock before it
    waited for the write lock, ``now`` the clock once it held it (what leases are granted
    from)."""

    __slots__ = ("_db", "began", "now")

    def __init__(self, db: sqlite3.Connection, began: float) -> None:
        self._db, self.began, self.now = db, began, clock()

    def run(self, sql: str, params: Mapping[str, Any] | None = None) -> _Rows:
        values = {"now": self.now} if params is None else {**params, "now": self.now}
        return _Rows(self._db.execute(_sql(sql), values).fetchall())

    def require(
        self, sql: str, params: Mapping[str, Any], failure: Callable[[], StoreError]
    ) -> _Rows:
        rows = self.run(sql, params)
        if not rows.all():
            raise _Refused(failure)
        return rows

    def append(self, event: Event, root_id: str) -> _Rows:
        return self.run(_APPEND, _event_params(event, root_id))


_APPEND = (
    "INSERT INTO blade_events (run_id, call_id, kind, payload, at, tenant, principal, root_id) "
    "VALUES (:run_id, :call_id, :kind, :payload, :at, :tenant, :principal, :root_id) "
    "RETURNING seq"
)


def _event_params(event: Event, root_id: str) -> dict[str, Any]:
    return {
        "run_id": event.run_id,
        "call_id": event.call_id,
        "kind": event.kind,
        "payload": _dump(event.payload),
        "at": event.at,
        "tenant": event.tenant,
        "principal": event.principal,
        "root_id": root_id,
    }


class _Transaction:
    """``with store._transaction() as tx``: one BEGIN IMMEDIATE transaction, committed at the
    end or rolled back (a class, not a generator: it is entered on every state change). A lock
    another connection holds is ``StoreBusy`` within ``nowait()`` and ``StoreUnavailable`` past
    the busy_timeout, whichever statement met it; either way the transaction is rolled back. A
    guard that found no row rolls it back and raises the guard's error."""

    __slots__ = ("_db", "_store")

    def __init__(self, store: SQLiteStore, db: sqlite3.Connection) -> None:
        self._db = db
        self._store = store

    def __enter__(self) -> _Tx:
        began = clock()
        _IN_SQLITE.__enter__()
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:  # locked (past busy_timeout), a disk gone
            _IN_SQLITE.__exit__()
            raise self._store._failed(error) from None
        return _Tx(self._db, began)

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
            if isinstance(error, _Refused):
                raise error.failure() from None
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
    _holds_nul = True
    _LAST_EVENT = "(SELECT max(seq) FROM blade_events)"  # one writer at a time: its own
    _NOW = ":now"
    _BEFORE_WAIT = ":since"  # given by the rule: the clock before BEGIN IMMEDIATE
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
        self.poll_s = 0.05  # how often other processes' commits are looked for (a stat)
        self._wal = Path(f"{self.path}-wal")
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
                # A new file vacuums incrementally (a prune gives its pages back): set before
                # its first table and before WAL (on a file that has pages it would take a lock).
                if connection.execute("PRAGMA page_count").fetchone()[0] == 0:
                    connection.execute("PRAGMA auto_vacuum=INCREMENTAL")
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute(f"PRAGMA synchronous={self._synchronous}")
                connection.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
                connection.execute(f"PRAGMA wal_autocheckpoint={_BACKSTOP_PAGES}")
                connection.execute(f"PRAGMA journal_size_limit={_WAL_LIMIT_BYTES}")
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

    def _transaction(self) -> _Transaction:
        return _Transaction(self, self._connection())

    def _failed(self, error: sqlite3.Error) -> StoreError:
        """What a failed statement is: ``StoreBusy`` for a lock met within ``nowait()``."""
        if _busy(error) and getattr(self._local, "nowait", False):
            return StoreBusy(f"{self.url}: {error}")
        return StoreUnavailable(f"{self.url}: {error}")

    def _duplicate(self, error: BaseException) -> bool:
        return isinstance(error, sqlite3.IntegrityError)

    def _fetch(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        db = self._connection()
        values = {"now": clock()} if params is None else {**params, "now": clock()}
        with _IN_SQLITE:
            try:
                return db.execute(_sql(sql), values).fetchall()
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

    def _pruned(self) -> None:
        """Give the pages of deleted rows back to the file system (a store made since migration
        6 vacuums incrementally; an older file keeps them for reuse: ``VACUUM`` it once)."""
        db = self._connection()
        with _IN_SQLITE, contextlib.suppress(sqlite3.Error):
            # executescript steps it to the end: execute() frees one page per statement
            db.executescript("PRAGMA incremental_vacuum;")

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
        db = self._connection()
        with _Transaction(self, db):
            version = db.execute("PRAGMA user_version").fetchone()[0]

            def run(statement: str) -> None:
                if statement in STEPS:
                    STEPS[statement](db)
                else:
                    db.execute(statement)

            self._migrate_from(version, MIGRATIONS, run)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    # -- who holds what: liveness ----------------------------------------------------------------

    def _granted(self, tx: Tx, owner: str, until: Rows, event: Rows) -> None:
        """``owner`` now holds a running call, granted by the transaction whose event is
        ``event``: its runtimes row exists (a new one starts just before that event), and its
        lease_until is no later than this call's. Usually the row is there already and no page
        is written. (Always a statement: another runtime's sweep may have rewritten or dropped
        the row on a verdict that this owner died, and a call granted then must still be
        found.)"""
        tx.run(
            "INSERT INTO blade_runtimes (owner, lease_until, since, held) "
            "VALUES (:owner, :until, :since, '') "
            "ON CONFLICT (owner) DO UPDATE SET lease_until = excluded.lease_until "
            "WHERE excluded.lease_until < blade_runtimes.lease_until",
            {"owner": owner, "until": float(_one(until)), "since": int(_one(event)) - 1},
        )

    @staticmethod
    def _running_of(tx: Tx, owner: str, since: int, held: str) -> list[CallRecord]:
        """The calls running under ``owner``: those its runtimes row lists, and those of the
        events after its ``since`` that it still owns."""
        listed = _load(f"[{held}]")
        rows = tx.run(
            f"SELECT {CALL_COLUMNS} FROM blade_calls WHERE call_id IN "
            "(SELECT call_id FROM blade_events WHERE seq > :since) AND owner = :owner "
            "AND state = 'running'",
            {"since": since, "owner": owner},
        ).all()
        found = {row[0] for row in rows}
        for start in range(0, len(listed), 500):
            chunk = [call_id for call_id in listed[start : start + 500] if call_id not in found]
            if chunk:
                marks = {f"i{n}": call_id for n, call_id in enumerate(chunk)}
                rows += tx.run(
                    f"SELECT {CALL_COLUMNS} FROM blade_calls WHERE call_id IN "
                    f"({', '.join(':' + m for m in marks)}) AND owner = :owner "
                    "AND state = 'running'",
                    marks | {"owner": owner},
                ).all()
        return [call_record(row) for row in rows]

    @staticmethod
    def _keep(
        tx: Tx, owner: str, left: list[CallRecord], head: int, until: float | None = None
    ) -> None:
        """Rewrite ``owner``'s runtimes row once its running calls were read (``left``: those it
        still holds): they are listed, the events up to ``head`` need no reading again, and
        lease_until is the earliest of their leases. ``until``: a renewal (every call it holds
        and the row have that lease). A sweep drops the row of an owner that holds nothing (its
        next grant makes one)."""
        if not left and until is None:
            tx.run("DELETE FROM blade_runtimes WHERE owner = :owner", {"owner": owner})
            return
        earliest = min(c.lease_until for c in left) if until is None else until
        row = {"until": earliest, "since": head, "held": _dump([c.call_id for c in left])[1:-1]}
        # A row that stays as it was is not written (a sweep every second would rewrite it).
        tx.run(
            "UPDATE blade_runtimes SET lease_until = :until, since = :since, held = :held "
            "WHERE owner = :owner AND (lease_until, since, held) IS NOT (:until, :since, :held)",
            row | {"owner": owner},
        )

    def _candidates(
        self,
        tx: Tx,
        *,
        call_id: str | None,
        names: Collection[str] | Mapping[str, str] | None,
        dead: Collection[str],
        limit: int,
    ) -> Candidates:
        # BEGIN IMMEDIATE holds the write lock from these reads to the updates: sweeps of other
        # processes wait for it and then find these calls owned, with fresh leases. A running
        # call is found through its owner's runtimes row, once that row has come due.
        assert isinstance(tx, _Tx)
        if call_id is not None:
            rows = tx.run(
                f"SELECT {CALL_COLUMNS} FROM blade_calls WHERE call_id = :id", {"id": call_id}
            ).all()
            return Candidates([(call_record(row), 0) for row in rows], tx.began, tx.now)
        only, values = names_filter(names)
        found = [
            call_record(row)
            for row in tx.run(
                f"SELECT {CALL_COLUMNS} FROM blade_calls WHERE state = 'resumable'{only} "
                "ORDER BY started_at LIMIT :limit",
                values | {"limit": limit},
            ).all()
        ]
        gone = {f"d{n}": owner for n, owner in enumerate(dead)}
        due = tx.run(
            "SELECT owner, since, held FROM blade_runtimes WHERE lease_until < :now"
            + (f" OR owner IN ({', '.join(':' + d for d in gone)})" if gone else ""),
            gone,
        ).all()
        examined = [(who, self._running_of(tx, who, since, held)) for who, since, held in due]
        head = int(_one(tx.run("SELECT COALESCE(MAX(seq), 0) FROM blade_events"))) if due else 0
        found += [call for _, running in examined for call in running]
        found.sort(key=lambda call: call.started_at)

        def then(taken: set[str]) -> None:
            for who, running in examined:
                self._keep(tx, who, [c for c in running if c.call_id not in taken], head)

        return Candidates([(call, 0) for call in found], tx.began, tx.now, then)

    def renew(self, owner: str, lease_s: float) -> set[str]:
        with self._transaction() as tx:
            return self._renew(tx, owner, lease_s)

    def _renew(self, tx: Tx, owner: str, lease_s: float) -> set[str]:
        """``renew`` in the transaction ``tx`` (the write lock taken: the clock read then)."""
        assert isinstance(tx, _Tx)
        row = tx.run(
            "SELECT since, held FROM blade_runtimes WHERE owner = :owner", {"owner": owner}
        ).one()
        if row is None:  # it holds no running call (each grant makes the row)
            return set()
        until = tx.now + lease_s
        held = self._running_of(tx, owner, row[0], row[1])
        ids = [c.call_id for c in held]
        for start in range(0, len(ids), 500):
            marks = {f"i{n}": call_id for n, call_id in enumerate(ids[start : start + 500])}
            tx.run(
                "UPDATE blade_calls SET lease_until = :until WHERE call_id IN "
                f"({', '.join(':' + m for m in marks)})",
                marks | {"until": until},
            )
        head = int(_one(tx.run("SELECT COALESCE(MAX(seq), 0) FROM blade_events")))
        self._keep(tx, owner, held, head, until)
        return set(ids)

    def owners(self) -> set[str]:
        """The owners whose runtimes row has not come due: each holds, or lately held, a
        running call whose lease has not expired. A row's lease_until is its earliest lease, so
        an owner of a lapsed call and a live one is left out until the sweep (which examines
        due rows anyway) moves its row to the live lease."""
        return {
            row[0]
            for row in self._fetch("SELECT owner FROM blade_runtimes WHERE lease_until >= :now")
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

    # -- events --------------------------------------------------------------------------------

    def head(self, run_id: str | None = None) -> int:
        # One writer at a time, numbering in its transaction: numbers follow commit order.
        rows = self._fetch("SELECT MAX(seq) FROM blade_events")
        return int(rows[0][0] or 0)

    def mark(self) -> int:
        # SQLite tells no other process of a commit, but every commit writes the WAL file: its
        # size and time of change, read by a stat (microseconds, no connection, no thread hop),
        # are the notice an idle reader polls, instead of a query each time.
        signature = 0
        for path in (self.path, self._wal):
            with contextlib.suppress(OSError):
                found = os.stat(path)
                signature = hash((signature, found.st_mtime_ns, found.st_size, found.st_ino))
        return signature

    async def changed(self, timeout_s: float, mark: int) -> None:
        deadline = time.monotonic() + timeout_s
        while self.mark() == mark:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, self.poll_s))

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


def _one(rows: Rows) -> Any:
    row = rows.one()
    assert row is not None
    return row[0]


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
            with _Transaction(self._store, self._db) as tx:
                return self._store._renew(tx, owner, lease_s)

    def close(self) -> None:
        with self._lock:
            db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()
