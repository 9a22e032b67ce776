"""``SQLiteStore``: the embedded durable store.

WAL journal with ``synchronous=NORMAL``: a commit survives the process being killed (measured
about 0.1-0.23 ms a commit here); pass ``synchronous="FULL"`` to survive power loss as well (about
4 ms a commit). Every method is one ``BEGIN IMMEDIATE`` transaction, so writers from other threads
and processes queue on the file's lock (``busy_timeout``), and resolving an action is an
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

Many processes may share one file (on one machine: SQLite's locks do not hold over network file
systems). Whether the owner of a running call still runs is checked by its pid when it is on this
host; otherwise its lease decides. Other processes' events are found by polling the events table.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import sqlite3
import threading
import weakref
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import JsonValue

from blade_runtime.core.store import (
    ActionAlreadyResolved,
    ActionRecord,
    ActionState,
    CallRecord,
    CallState,
    Claimed,
    DataRecord,
    DuplicateCall,
    Event,
    LeaseLost,
    Resolution,
    Resolved,
    StoreUnavailable,
    UnknownAction,
    clock,
    encodable,
    now,
)
from blade_runtime.core.store import dump_json as _dump
from blade_runtime.core.store import load_json as _load

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

_CALL_COLUMNS = (
    "call_id, run_id, name, spec_id, side_effect, execution, input, state, started_at, owner, "
    "entry, result, lease_until, tenant, context"
)
_ACTION_COLUMNS = (
    "action_id, call_id, run_id, name, spec_id, point, payload, submit_schema, suspended_at, "
    "state, resume, resolved_at, reason, tenant, expires_at"
)
_HOST = socket.gethostname()


class _Schemas:
    """Schemas repeat (every action of a suspend point stores the same one): each distinct text
    is parsed once, and each schema object (the runtime passes its own) is dumped once."""

    def __init__(self) -> None:
        self._parsed: dict[str, Any] = {}
        self._texts: dict[int, tuple[Any, str]] = {}

    def dump(self, schema: Any) -> str:
        found = self._texts.get(id(schema))
        if found is None or found[0] is not schema:
            found = self._texts[id(schema)] = (schema, _dump(dict(schema)))
        return found[1]

    def load(self, text: str) -> Any:
        parsed = self._parsed.get(text)
        if parsed is None:
            parsed = self._parsed[text] = json.loads(text)
        return parsed


class _Transaction:
    """``with store._write() as db``: one BEGIN IMMEDIATE transaction, committed at the end or
    rolled back (a class, not a generator: it is entered on every state change)."""

    __slots__ = ("_db", "_store")

    def __init__(self, store: SQLiteStore) -> None:
        self._db = store._connection()
        self._store = store

    def __enter__(self) -> sqlite3.Connection:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:  # locked past busy_timeout, a disk gone
            raise StoreUnavailable(f"{self._store.url}: {error}") from None
        return self._db

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            try:
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            self._store._committed()  # never raises: the change is committed
            return
        self._db.execute("ROLLBACK")


# Held by checkpointer threads whenever they are inside SQLite, and taken around os.fork: a child
# forked while such a thread held one of SQLite's own mutexes would find it held for good (15 of
# 621 children forked amid checkpoints hung opening a database, found in review).
_IN_SQLITE = threading.Lock()
if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(
        before=_IN_SQLITE.acquire,
        after_in_parent=_IN_SQLITE.release,
        after_in_child=_IN_SQLITE.release,
    )


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
    that commit waits while the WAL is synced and copied: about 12 ms here, every 60 cycles or so,
    two thirds of the commit time of a suspend-submit-resume cycle (measured). This thread runs a
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


class SQLiteStore:
    """A durable store in one SQLite file, shared safely by threads and processes."""

    durable = True
    # The class of its connections (a subclass may trace or time the statements it runs).
    connection_class: type[sqlite3.Connection] = sqlite3.Connection

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout_ms: int = 30_000,
        create: bool = True,
    ) -> None:
        """``create=False``: only a store a runtime has made is opened (see ``open_store``)."""
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self.poll_s = 0.05  # how often other processes' events are looked for
        self._synchronous = synchronous
        self._busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        self._commits = 0  # by this store's connections (counted without a lock: a hint)
        self._checkpointer: _Checkpointer | None = None  # started by the first commits
        self._checkpoint_warnings = _Once()
        self._closed = False  # until a connection is made again
        self._schemas = _Schemas()
        if not create:
            self._refuse_unless_made()
        try:
            self._migrate()
        except sqlite3.DatabaseError as error:
            self.close()
            raise StoreUnavailable(f"{self.url}: not a blade-runtime store ({error})") from None

    # -- connections and transactions ----------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        """One connection per thread: sqlite3 connections must not be shared across threads."""
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=True,
                factory=self.connection_class,
            )
            self._local.connection = connection  # before the pragmas: close() must find it
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute(f"PRAGMA synchronous={self._synchronous}")
            connection.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
            connection.execute(f"PRAGMA wal_autocheckpoint={_BACKSTOP_PAGES}")
            with self._connections_lock:
                self._connections.append(connection)
                self._closed = False
        return connection

    def _write(self) -> _Transaction:
        return _Transaction(self)

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

    @staticmethod
    @contextmanager
    def _read(db: sqlite3.Connection) -> Iterator[None]:
        """One snapshot for several reads."""
        db.execute("BEGIN")
        try:
            yield
        finally:
            db.execute("COMMIT")

    def _refuse_unless_made(self) -> None:
        """Read, on a read-only connection, whether a runtime made this store: nothing is
        written to a file that is not one (not even the switch to WAL)."""
        try:
            with contextlib.closing(
                sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
            ) as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as error:
            raise StoreUnavailable(f"{self.url}: not a blade-runtime store ({error})") from None
        if version == 0:
            raise StoreUnavailable(
                f"{self.url}: not a blade-runtime store (it has none of its tables; a runtime "
                "makes them when it first opens the store)"
            )

    def _migrate(self) -> None:
        with self._write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreUnavailable(
                    f"{self.url}: store schema version {version} is newer than this "
                    f"blade-runtime knows ({SCHEMA_VERSION}); upgrade blade-runtime"
                )
            for step in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[step]:
                    if statement in _STEPS:
                        _STEPS[statement](db)
                    else:
                        db.execute(statement)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @staticmethod
    def _append(db: sqlite3.Connection, event: Event) -> None:
        cursor = db.execute(
            "INSERT INTO events (run_id, call_id, kind, payload, at) VALUES (?, ?, ?, ?, ?)",
            (event.run_id, event.call_id, event.kind, _dump(event.payload), event.at),
        )
        event.seq = int(cursor.lastrowid or 0)

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
            f"SELECT {_CALL_COLUMNS} FROM calls WHERE call_id IN "
            "(SELECT call_id FROM events WHERE seq > ?) AND owner = ? AND state = 'running'",
            (since, owner),
        ).fetchall()
        found = {row[0] for row in rows}
        for start in range(0, len(listed), 500):
            chunk = [call_id for call_id in listed[start : start + 500] if call_id not in found]
            if chunk:
                rows += db.execute(
                    f"SELECT {_CALL_COLUMNS} FROM calls WHERE call_id IN "
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
    def _put_call(db: sqlite3.Connection, call: CallRecord, action_ids: str | None = None) -> None:
        db.execute(
            f"INSERT INTO calls ({_CALL_COLUMNS}, action_ids) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                call.call_id,
                call.run_id,
                call.name,
                call.spec_id,
                call.side_effect,
                call.execution,
                _dump(dict(call.input)),
                call.state,
                call.started_at,
                call.owner,
                _dump(call.entry),
                _dump(call.result),
                call.lease_until,
                call.tenant,
                _dump(call.context),
                action_ids,
            ),
        )

    # -- the Store interface -------------------------------------------------------------------

    def begin(self, call: CallRecord, event: Event) -> None:
        with self._write() as db:
            try:
                self._put_call(db, call)
            except sqlite3.IntegrityError:
                raise DuplicateCall(call.call_id) from None
            self._append(db, event)
            if call.state == "running":
                self._grant(db, call.owner, call.lease_until, event.seq)

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
                self._put_call(db, call, listed)
            db.execute(
                f"INSERT INTO actions ({_ACTION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    action.action_id,
                    action.call_id,
                    action.run_id,
                    action.name,
                    action.spec_id,
                    action.point,
                    _dump(action.payload),
                    self._schemas.dump(action.submit_schema),
                    action.suspended_at,
                    action.state,
                    _dump(action.resume),
                    action.resolved_at,
                    action.reason,
                    action.tenant,
                    action.expires_at,
                ),
            )
            self._append(db, event)

    def resolve(self, action_id: str, resolution: Resolution, event: Event) -> Resolved:
        with self._write() as db:
            expiry = " AND expires_at <= ?" if resolution.only_if_expired else ""
            row = db.execute(
                "UPDATE actions SET state = ?, resume = ?, resolved_at = ?, reason = ? "
                f"WHERE action_id = ? AND state = 'pending'{expiry} RETURNING {_ACTION_COLUMNS}",
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
                action = self._one_action(db, action_id)
                if action is None:
                    raise UnknownAction(action_id)
                raise ActionAlreadyResolved(action)
            action = _action(row, self._schemas)
            owner = resolution.call_owner
            until = clock() + resolution.lease_s if owner else 0.0
            call_input = db.execute(
                "UPDATE calls SET state = ?, entry = ?, result = ?, owner = COALESCE(?, owner), "
                "input = COALESCE(?, input), lease_until = ? WHERE call_id = ? "
                "RETURNING input, context",
                (
                    resolution.call_state,
                    _dump(resolution.call_entry),
                    _dump(resolution.call_result),
                    owner,
                    None if resolution.call_input is None else _dump(dict(resolution.call_input)),
                    until,
                    action.call_id,
                ),
            ).fetchone()
            self._append(db, event)
            if owner and resolution.call_state == "running" and call_input is not None:
                self._grant(db, owner, until, event.seq)
            if call_input is None:
                return Resolved(action, {})
            return Resolved(action, _load(call_input[0]), _load(call_input[1]))

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
        names: Collection[str] | None = None,
        call_id: str | None = None,
        limit: int = 100,
    ) -> list[Claimed]:
        # BEGIN IMMEDIATE holds the write lock from the reads to the updates: sweeps of other
        # processes wait for it and then find these calls owned, with fresh leases.
        at = clock()
        gone = set(dead)
        wanted = None if names is None else set(names)

        def claimable(call: CallRecord) -> bool:
            if wanted is not None and call.name not in wanted:
                return False
            if call.state == "resumable":
                return True
            return call.state == "running" and (call.lease_until < at or call.owner in gone)

        with self._write() as db:
            examined: list[tuple[str, list[CallRecord]]] = []
            if call_id is not None:
                row = db.execute(
                    f"SELECT {_CALL_COLUMNS} FROM calls WHERE call_id = ?", (call_id,)
                ).fetchone()
                candidates = [c for c in ([] if row is None else [_call(row)]) if claimable(c)]
            else:
                only, values = "", []
                if wanted is not None:
                    only, values = f" AND name IN ({','.join('?' * len(wanted))})", [*wanted]
                candidates = [
                    _call(row)
                    for row in db.execute(
                        f"SELECT {_CALL_COLUMNS} FROM calls WHERE state = 'resumable'{only} "
                        "ORDER BY started_at LIMIT ?",
                        (*values, limit),
                    )
                ]
                marks = ",".join("?" * len(gone))
                due = db.execute(
                    "SELECT owner, since, held FROM runtimes WHERE lease_until < ?"
                    + (f" OR owner IN ({marks})" if gone else ""),
                    (at, *gone),
                ).fetchall()
                for who, since, held in due:
                    running = [_call(row) for row in self._running_of(db, who, since, held)]
                    examined.append((who, running))
                    candidates += [c for c in running if claimable(c)]
                candidates.sort(key=lambda c: c.started_at)
                del candidates[limit:]
            head = self.head() if examined else 0  # the same connection: in this transaction
            claimed, first = [], 0
            for before in candidates:
                db.execute(
                    "UPDATE calls SET state = 'running', owner = ?, lease_until = ? "
                    "WHERE call_id = ?",
                    (owner, at + lease_s, before.call_id),
                )
                after = replace(before, state="running", owner=owner, lease_until=at + lease_s)
                payload: JsonValue = {"was": before.state, "previous_owner": before.owner}
                event = Event(before.run_id, before.call_id, "claimed", payload, now())
                self._append(db, event)
                first = first or event.seq
                claimed.append(Claimed(after, before.state, before.owner))
            taken = {c.call.call_id for c in claimed}
            for who, running in examined:
                self._keep(db, who, [c for c in running if c.call_id not in taken], head)
            if claimed:
                self._grant(db, owner, at + lease_s, first)
            return claimed

    def renew(self, owner: str, lease_s: float) -> set[str]:
        with self._write() as db:
            row = db.execute(
                "SELECT since, held FROM runtimes WHERE owner = ?", (owner,)
            ).fetchone()
            if row is None:  # it holds no running call (each grant makes the row)
                return set()
            until = clock() + lease_s
            held = [_call(r) for r in self._running_of(db, owner, row[0], row[1])]
            ids = [c.call_id for c in held]
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                db.execute(
                    f"UPDATE calls SET lease_until = ? WHERE call_id IN "
                    f"({','.join('?' * len(chunk))})",
                    (until, *chunk),
                )
            head = self.head()  # the same connection: read inside this transaction
            self._keep(db, owner, held, head, until)
        return set(ids)

    def expired(self, limit: int = 100) -> list[ActionRecord]:
        rows = self._connection().execute(
            f"SELECT {_ACTION_COLUMNS} FROM actions WHERE state = 'pending' "
            "AND expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at LIMIT ?",
            (clock(), limit),
        )
        return [_action(row, self._schemas) for row in rows]

    def owners(self) -> set[str]:
        """The owners whose runtimes row has not come due: each holds, or lately held, a
        running call whose lease has not expired. A row's lease_until is its earliest lease, so
        an owner of a lapsed call and a live one is left out until the sweep (which examines
        due rows anyway) moves its row to the live lease."""
        rows = self._connection().execute(
            "SELECT owner FROM runtimes WHERE lease_until >= ?", (clock(),)
        )
        return {row[0] for row in rows}

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

    def data(self, call_id: str, channel: str | None = None) -> list[DataRecord]:
        query, values = "WHERE call_id = ?", [call_id]
        if channel is not None:
            query, values = "WHERE call_id = ? AND channel = ?", [call_id, channel]
        rows = self._connection().execute(
            f"SELECT call_id, channel, item_id, value, updated_at, seq FROM data {query} "
            "ORDER BY seq",
            values,
        )
        return [DataRecord(r[0], r[1], r[2], _load(r[3]), r[4], r[5]) for r in rows]

    def call(self, call_id: str) -> CallRecord | None:
        if not encodable(call_id):
            return None
        row = (
            self._connection()
            .execute(f"SELECT {_CALL_COLUMNS} FROM calls WHERE call_id = ?", (call_id,))
            .fetchone()
        )
        return None if row is None else _call(row)

    def calls(
        self,
        states: Iterable[CallState] | None = None,
        *,
        run_id: str | None = None,
        tenant: str | None = None,
    ) -> list[CallRecord]:
        clauses: list[str] = []
        values: list[Any] = []
        if states is not None:
            wanted = list(states)
            clauses.append(f"state IN ({','.join('?' * len(wanted))})")
            values += wanted
        for column, value in (("run_id", run_id), ("tenant", tenant)):
            if value is not None:
                clauses.append(f"{column} = ?")
                values.append(value)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._connection().execute(
            f"SELECT {_CALL_COLUMNS} FROM calls {where} ORDER BY started_at", values
        )
        return [_call(row) for row in rows]

    def action(self, action_id: str) -> ActionRecord | None:
        if not encodable(action_id):
            return None
        return self._one_action(self._connection(), action_id)

    def actions(
        self,
        *,
        state: ActionState | None = "pending",
        run_id: str | None = None,
        name: str | None = None,
        call_id: str | None = None,
        tenant: str | None = None,
    ) -> list[ActionRecord]:
        # Only the filters given: "? IS NULL OR column = ?" would keep SQLite from using indexes.
        given = {
            "state": state,
            "run_id": run_id,
            "name": name,
            "call_id": call_id,
            "tenant": tenant,
        }
        clauses = [f"{column} = ?" for column, value in given.items() if value is not None]
        values: list[Any] = [value for value in given.values() if value is not None]
        db = self._connection()
        if call_id is None:
            rows = db.execute(
                f"SELECT {_ACTION_COLUMNS} FROM actions "
                f"{'WHERE ' + ' AND '.join(clauses) if clauses else ''} "
                "ORDER BY suspended_at, action_id",
                values,
            ).fetchall()
        else:  # the call lists its actions: look them up by id
            with self._read(db):
                listed = db.execute(
                    "SELECT action_ids FROM calls WHERE call_id = ?", (call_id,)
                ).fetchone()
                ids: list[str] = [] if listed is None else _load(f"[{listed[0] or ''}]")
                rows = []
                for start in range(0, len(ids), 500):
                    chunk = ids[start : start + 500]
                    rows += db.execute(
                        f"SELECT {_ACTION_COLUMNS} FROM actions WHERE action_id IN "
                        f"({','.join('?' * len(chunk))}) AND {' AND '.join(clauses)}",
                        (*chunk, *values),
                    ).fetchall()
            rows.sort(key=lambda row: (row[8], row[0]))  # suspended_at, action_id
        return [_action(row, self._schemas) for row in rows]

    def events(self, run_id: str, after: int = 0) -> list[Event]:
        # No index on run_id (it would cost every transaction): a range scan from ``after``,
        # which is short when a subscriber catches up from the last event it saw.
        rows = self._connection().execute(
            "SELECT run_id, call_id, kind, payload, at, seq FROM events "
            "WHERE seq > ? AND run_id = ? ORDER BY seq",
            (after, run_id),
        )
        return [Event(r[0], r[1], r[2], _load(r[3]), r[4], r[5]) for r in rows]

    def head(self, run_id: str | None = None) -> int:
        # One writer at a time, numbering in its transaction: numbers follow commit order.
        row = self._connection().execute("SELECT MAX(seq) FROM events").fetchone()
        return int(row[0] or 0)

    async def changed(self, timeout_s: float) -> None:
        # SQLite tells no other process of a commit: poll (the reader compares sequence numbers).
        await asyncio.sleep(min(timeout_s, self.poll_s))

    def close(self) -> None:
        with self._connections_lock:
            checkpointer, self._checkpointer = self._checkpointer, None
            self._closed = True
        if checkpointer is not None:
            checkpointer.stop()
        with self._connections_lock:
            for connection in self._connections:
                # One made in another thread cannot be closed here; SQLite frees it with the thread.
                with contextlib.suppress(sqlite3.ProgrammingError):
                    connection.close()
            self._connections.clear()
        self._local = threading.local()

    def _one_action(self, db: sqlite3.Connection, action_id: str) -> ActionRecord | None:
        row = db.execute(
            f"SELECT {_ACTION_COLUMNS} FROM actions WHERE action_id = ?", (action_id,)
        ).fetchone()
        return None if row is None else _action(row, self._schemas)


def _call(row: tuple[Any, ...]) -> CallRecord:
    return CallRecord(
        call_id=row[0],
        run_id=row[1],
        name=row[2],
        spec_id=row[3],
        side_effect=row[4],
        execution=row[5],
        input=_load(row[6]),
        state=row[7],
        started_at=row[8],
        owner=row[9],
        entry=_load(row[10]),
        result=_load(row[11]),
        lease_until=row[12],
        tenant=row[13],
        context=_load(row[14]),
    )


def _action(row: tuple[Any, ...], schemas: _Schemas) -> ActionRecord:
    return ActionRecord(
        action_id=row[0],
        call_id=row[1],
        run_id=row[2],
        name=row[3],
        spec_id=row[4],
        point=row[5],
        payload=_load(row[6]),
        submit_schema=schemas.load(row[7]),
        suspended_at=row[8],
        state=row[9],
        resume=_load(row[10]),
        resolved_at=row[11],
        reason=row[12],
        tenant=row[13],
        expires_at=row[14],
    )
