"""``PostgresStore``: the store shared by workers on many machines (``blade-runtime[postgres]``).

On psycopg 3 with a ``psycopg_pool.ConnectionPool`` of autocommit connections. Every state
change is ONE SQL statement (writable CTEs), so it is one transaction and one round trip: the
change, what follows from it and its event commit together or not at all.

- **Exactly once.** Resolving an action is ``UPDATE ... WHERE state = 'pending' RETURNING``
  (with ``expires_at <= now`` for an expiry); of many concurrent resolutions one changes the row.
- **Claims.** A sweep selects its candidates ``FOR UPDATE SKIP LOCKED`` and updates them in the
  same statement, returning each call's previous state and owner: concurrent sweeps skip the
  rows another sweep holds and re-check, on the row as committed, those it waited for, so no
  call is claimed twice.
- **Events in commit order.** An identity column numbers events when they are inserted, which
  is not the order in which their transactions commit: a reader that saw 6 could later find 5.
  So the event is appended last in its statement, by ``blade_event()``, which first takes its
  run's transaction advisory lock SHARED and holds it to the commit; a reader of the run takes it
  exclusively (``blade_events_after()``; ``blade_events_head()`` for where a subscription
  starts), which waits out every event of the run numbered but not committed, and reads after
  it. So a reader sees every event of its run up to the largest number it sees. Writers do not
  wait for each other's commits (one of a run waits only behind a reader of that run that is
  waiting for one), and a read waits only for its own run's writers, and only when there is
  something new to read. One lock held exclusively by every writer instead serialized every
  commit's flush (4 workers did less than 2 did). This holds while numbers are drawn in order
  when drawn: the identity keeps PostgreSQL's default ``CACHE 1`` (a session caching numbers
  could commit a lower one after a reader moved past it).
- **Notifications.** ``blade_event()`` sends ``NOTIFY``, which PostgreSQL delivers on commit only
  (a rolled-back transaction's event is never seen), and only while a store listens: a listening
  store is a row of ``blade_listeners``, held by a session lock, and a NOTIFY serializes the
  commits of all notifying transactions. A store listens from its first read of events on, until
  it is closed; a row whose session died without a word keeps NOTIFY on (it costs time, not
  correctness) until the next store that starts listening drops it.
- **Liveness across hosts.** ``attach(owner)`` holds a session advisory lock keyed by a hash of
  the owner on a connection of its own and records the owner; ``alive(owner)`` tries that lock
  from another session: free means the owner's session ended (its process died, on any host,
  or it detached). An owner that never attached is unknown (None: its lease decides), and so
  is one attached before the server last started: a restart (or a failover) ends every
  session, the live ones' too, so a free lock proves nothing until the owner attaches again,
  which its next lease renewal does.
- **Clocks.** ``lease_until`` is epoch seconds of the server's clock: a lease is granted (begin,
  resume, claim, renewal) as ``clock_timestamp()`` plus its length, when the statement has its
  locks, and judged by the server's clock, so workers' clocks never meet leases. A sweep judges
  a lease expired only if it was at its transaction's start (``transaction_timestamp()``, which
  on the store's autocommit connections is when the server received the statement, before any
  lock wait; ``statement_timestamp()`` is reset by the extended protocol's Execute message,
  after the wait), less what the sweep's earlier reads waited; the claim is sent unprepared so
  that its Parse, where the wait happens, starts that transaction. A sweep that waited longer
  than ``patience(lease_s)`` judges no lease at all: the owners' renewals queued behind the same
  lock are granted with it, and either statement may lock the rows first. ``expires_at`` (an
  action's deadline) is the runtime's ``store.clock()``, as it computes it, so hosts' clocks
  must agree to well within a deadline.
- **JSON as text.** Payloads are stored as the same compact JSON text as in SQLite, not jsonb:
  jsonb reorders keys, drops duplicate keys and refuses ``\\u0000``, and the store never queries
  inside a payload (filters are on plain columns), so text round-trips exactly and costs no
  parse on insert. ``payload::jsonb`` still works for an operator's ad-hoc query.
- **Migrations.** ``blade_schema_version`` holds the version; ``MIGRATIONS[n]`` takes n to n+1,
  in one transaction under an advisory lock, so processes opening a new database at once migrate
  it once. A database of a newer version is refused (``StoreUnavailable``), and nothing is written.

Tables are prefixed ``blade_`` so that the store can share a database with an application.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, LiteralString

import psycopg
import psycopg.errors
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool
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
    StoreError,
    StoreUnavailable,
    TriggerRecord,
    UnknownAction,
    clock,
    now,
    patience,
)
from blade_runtime.core.store import dump_json as _dump
from blade_runtime.core.store import load_json as _load
from blade_runtime.stores.sql import ACTION_COLUMNS as _ACTION_COLUMNS
from blade_runtime.stores.sql import CALL_COLUMNS as _CALL_COLUMNS
from blade_runtime.stores.sql import FILE_COLUMNS as _FILE_COLUMNS
from blade_runtime.stores.sql import GRANT_COLUMNS as _GRANT_COLUMNS
from blade_runtime.stores.sql import GRANT_KEY as _GRANT_KEY
from blade_runtime.stores.sql import TRIGGER_COLUMNS as _TRIGGER_COLUMNS
from blade_runtime.stores.sql import (
    Schemas,
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
from blade_runtime.stores.urls import masked, secrets_of

log = logging.getLogger("blade_runtime")

_LOCK_CLASS = 0x626C6164  # "blad": the (int, int) advisory key space of this store
_EVENTS_LOCK = 1  # migration 1's; a run's events lock since migration 2
_MIGRATION_LOCK = 2
_LISTENER_CLASS = _LOCK_CLASS + 1  # (class, key): the session lock of a listening store
_RUN_CLASS = _LOCK_CLASS + 2  # (class, hashtext(run_id)): a run's events lock
CHANNEL = "blade_events"


def _grant_like(
    source: LiteralString, privileges: LiteralString, tables: LiteralString
) -> LiteralString:
    """A migration statement: every role that may insert into ``source`` (other than its owner)
    gets ``privileges`` on the new ``tables``, so an application role that uses the earlier
    tables keeps working after the upgrade."""
    return f"""
        DO $$
        DECLARE
            grantee_name text;
        BEGIN
            FOR grantee_name IN
                SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                    ELSE quote_ident(pg_get_userbyid(a.grantee)) END
                FROM pg_class c, aclexplode(c.relacl) a
                WHERE c.oid = '{source}'::regclass AND a.privilege_type = 'INSERT'
                    AND a.grantee <> c.relowner
            LOOP
                EXECUTE 'GRANT {privileges} ON {tables} TO ' || grantee_name;
            END LOOP;
        END
        $$
        """


MIGRATIONS: tuple[tuple[LiteralString, ...], ...] = (
    (  # 1: the first release
        """
        CREATE TABLE blade_calls (
            call_id text PRIMARY KEY,
            run_id text NOT NULL,
            name text NOT NULL,
            spec_id text NOT NULL,
            side_effect text NOT NULL,
            execution text NOT NULL,
            input text NOT NULL,
            state text NOT NULL,
            started_at text NOT NULL,
            owner text NOT NULL,
            entry text,
            result text,
            lease_until double precision NOT NULL DEFAULT 0,
            tenant text NOT NULL DEFAULT '',
            context text
        )
        """,
        # Sweeps read only the calls that may need a runtime: a partial index stays small.
        "CREATE INDEX blade_calls_open ON blade_calls (state, lease_until) "
        "WHERE state IN ('running', 'resumable')",
        "CREATE INDEX blade_calls_run ON blade_calls (run_id)",
        """
        CREATE TABLE blade_actions (
            action_id text PRIMARY KEY,
            call_id text NOT NULL,
            run_id text NOT NULL,
            name text NOT NULL,
            spec_id text NOT NULL,
            point text,
            payload text NOT NULL,
            submit_schema text NOT NULL,
            suspended_at text NOT NULL,
            state text NOT NULL,
            resume text,
            resolved_at text,
            reason text,
            tenant text NOT NULL DEFAULT '',
            expires_at double precision
        )
        """,
        "CREATE INDEX blade_actions_pending ON blade_actions (run_id, name) "
        "WHERE state = 'pending'",
        "CREATE INDEX blade_actions_call ON blade_actions (call_id)",
        "CREATE INDEX blade_actions_expiring ON blade_actions (expires_at) "
        "WHERE state = 'pending' AND expires_at IS NOT NULL",
        """
        CREATE TABLE blade_data (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            call_id text NOT NULL,
            channel text NOT NULL,
            item_id text NOT NULL,
            value text NOT NULL,
            updated_at text NOT NULL,
            UNIQUE (call_id, channel, item_id)
        )
        """,
        """
        CREATE TABLE blade_events (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            run_id text NOT NULL,
            call_id text NOT NULL,
            kind text NOT NULL,
            payload text NOT NULL,
            at text NOT NULL
        )
        """,
        "CREATE INDEX blade_events_run ON blade_events (run_id, seq)",
        """
        CREATE TABLE blade_runtimes (
            owner text PRIMARY KEY,
            attached_at text NOT NULL
        )
        """,
        # The one way events are appended (migration 2 replaces it).
        f"""
        CREATE FUNCTION blade_event(
            p_run_id text, p_call_id text, p_kind text, p_payload text, p_at text
        ) RETURNS bigint LANGUAGE plpgsql AS $$
        DECLARE
            numbered bigint;
        BEGIN
            PERFORM pg_advisory_xact_lock({_LOCK_CLASS}, {_EVENTS_LOCK});
            INSERT INTO blade_events (run_id, call_id, kind, payload, at)
                VALUES (p_run_id, p_call_id, p_kind, p_payload, p_at)
                RETURNING seq INTO numbered;
            PERFORM pg_notify('{CHANNEL}', numbered::text);
            RETURN numbered;
        END
        $$
        """,
    ),
    (  # 2: writers no longer wait for each other's commits; NOTIFY only while someone listens
        # The stores that LISTEN, each by the session lock it holds (a free lock: it is gone).
        "CREATE TABLE blade_listeners (key integer PRIMARY KEY, since text NOT NULL)",
        # Every event append reads it: a role that may append events (granted on the tables of
        # the first release) may read it, and list itself as a listener.
        _grant_like("blade_events", "SELECT, INSERT, DELETE", "blade_listeners"),
        # Appending an event takes its run's lock SHARED before its number is drawn, and holds
        # it to the commit: writers do not wait for each other's commits, and a reader that
        # takes it exclusively waits out every event of the run numbered but not committed.
        f"""
        CREATE OR REPLACE FUNCTION blade_event(
            p_run_id text, p_call_id text, p_kind text, p_payload text, p_at text
        ) RETURNS bigint LANGUAGE plpgsql AS $$
        DECLARE
            numbered bigint;
        BEGIN
            PERFORM pg_advisory_xact_lock_shared({_RUN_CLASS}, hashtext(p_run_id));
            INSERT INTO blade_events (run_id, call_id, kind, payload, at)
                VALUES (p_run_id, p_call_id, p_kind, p_payload, p_at)
                RETURNING seq INTO numbered;
            IF EXISTS (SELECT 1 FROM blade_listeners) THEN
                PERFORM pg_notify('{CHANNEL}', numbered::text);
            END IF;
            RETURN numbered;
        END
        $$
        """,
        # A run's events read under its run's lock, held exclusively: none of them is between
        # its number and its commit, so what the query sees (its snapshot is taken after the
        # lock) is every event of the run that will ever have a number up to the largest it
        # sees. Nothing new seen before the lock, nothing is locked: a subscriber woken by
        # another run's event does not stop that run's writers. The lock ends with the
        # transaction (with the statement, on the store's autocommit connections).
        f"""
        CREATE FUNCTION blade_events_after(p_run_id text, p_after bigint)
        RETURNS TABLE (run_id text, call_id text, kind text, payload text, at text, seq bigint)
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NOT EXISTS (
                SELECT 1 FROM blade_events e WHERE e.run_id = p_run_id AND e.seq > p_after
            ) THEN
                RETURN;
            END IF;
            PERFORM pg_advisory_xact_lock({_RUN_CLASS}, hashtext(p_run_id));
            RETURN QUERY SELECT e.run_id, e.call_id, e.kind, e.payload, e.at, e.seq
                FROM blade_events e WHERE e.run_id = p_run_id AND e.seq > p_after
                ORDER BY e.seq;
        END
        $$
        """,
        # Where a new subscription to a run starts: the last number, read under the run's lock
        # (the run's events that commit later are numbered after it).
        f"""
        CREATE FUNCTION blade_events_head(p_run_id text) RETURNS bigint LANGUAGE plpgsql AS $$
        BEGIN
            IF p_run_id IS NOT NULL THEN
                PERFORM pg_advisory_xact_lock({_RUN_CLASS}, hashtext(p_run_id));
            END IF;
            RETURN (SELECT COALESCE(max(seq), 0) FROM blade_events);
        END
        $$
        """,
    ),
    (  # 3: files tools saved, and triggers to deliver
        """
        CREATE TABLE blade_files (
            file_id text PRIMARY KEY,
            tenant text NOT NULL,
            name text NOT NULL,
            media_type text NOT NULL,
            size bigint NOT NULL,
            sha256 text NOT NULL,
            created_at text NOT NULL,
            call_id text NOT NULL,
            run_id text NOT NULL,
            creator text,
            thread_id text,
            content bytea NOT NULL
        )
        """,
        """
        CREATE TABLE blade_triggers (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            trigger_id text NOT NULL UNIQUE,
            call_id text NOT NULL,
            run_id text NOT NULL,
            name text NOT NULL,
            tenant text NOT NULL,
            input text NOT NULL,
            created_at text NOT NULL,
            context text,
            thread_id text,
            state text NOT NULL,
            owner text NOT NULL,
            claimed_until double precision NOT NULL,
            finished_at text,
            error text
        )
        """,
        # Deliveries read only the triggers not yet delivered.
        "CREATE INDEX blade_triggers_open ON blade_triggers (seq) "
        "WHERE state IN ('pending', 'claimed')",
        # A role that may use the first release's tables may use these.
        _grant_like("blade_calls", "SELECT, INSERT, UPDATE", "blade_files, blade_triggers"),
    ),
    (  # 4: a call's narrowed kind and its fencing token; standing permission grants
        "ALTER TABLE blade_calls ADD COLUMN kind text",
        "ALTER TABLE blade_calls ADD COLUMN fence bigint NOT NULL DEFAULT 0",
        """
        CREATE TABLE blade_grants (
            grant_id text PRIMARY KEY,
            tenant text NOT NULL,
            principal text NOT NULL,
            tool text NOT NULL,
            subject text NOT NULL,
            created_at text NOT NULL,
            action_id text,
            spec_id text NOT NULL,
            point text NOT NULL,
            UNIQUE (tenant, principal, tool, spec_id, point, subject)
        )
        """,
        # A role that may use the first release's tables may use this one.
        _grant_like("blade_calls", "SELECT, INSERT, UPDATE, DELETE", "blade_grants"),
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)

_CALLS_PREFIXED: LiteralString = (
    "blade_calls.call_id, run_id, name, spec_id, side_effect, execution, input, "
    "blade_calls.state, started_at, owner, entry, result, lease_until, tenant, context, "
    "blade_calls.kind, blade_calls.fence"
)
_CALL_VALUES: LiteralString = (
    "%(call_id)s, %(run_id)s, %(name)s, %(spec_id)s, %(side_effect)s, %(execution)s, %(input)s, "
    "%(state)s, %(started_at)s, %(owner)s, %(entry)s, %(result)s, %(lease_until)s, %(tenant)s, "
    "%(context)s, %(kind)s, %(fence)s"
)
_ACTION_VALUES: LiteralString = (
    "%(action_id)s, %(a_call_id)s, %(a_run_id)s, %(a_name)s, %(a_spec_id)s, %(point)s, "
    "%(payload)s, %(submit_schema)s, %(suspended_at)s, %(a_state)s, %(resume)s, "
    "%(resolved_at)s, %(reason)s, %(a_tenant)s, %(expires_at)s"
)
_EVENT: LiteralString = (
    "blade_event(%(e_run_id)s, %(e_call_id)s, %(e_kind)s, %(e_payload)s, %(e_at)s)"
)
# The server's clock, as leases are granted: when the statement runs (its locks taken).
_NOW: LiteralString = "extract(epoch from clock_timestamp())::float8"
# The server's clock when the statement reached it, before any wait for a lock (see Clocks).
_BEFORE_WAIT: LiteralString = "extract(epoch from transaction_timestamp())::float8"
_BEGIN_VALUES: LiteralString = _CALL_VALUES.replace(
    "%(lease_until)s", f"COALESCE({_NOW} + %(lease_s)s, %(lease_until)s)"
)
_RENEW: LiteralString = (
    f"UPDATE blade_calls SET lease_until = {_NOW} + %s WHERE owner = %s AND state = 'running' "
    "RETURNING call_id"
)
_TRIGGER_VALUES: LiteralString = (
    "%(trigger_id)s, %(t_call_id)s, %(t_run_id)s, %(t_name)s, %(t_tenant)s, %(t_input)s, "
    "%(created_at)s, %(t_context)s, %(thread_id)s, %(t_state)s, %(t_owner)s, "
    "%(claimed_until)s, %(finished_at)s, %(error)s"
)
_TRIGGER_KEYS = tuple(name.strip()[2:-2] for name in _TRIGGER_VALUES.split(","))
# The call's and action's parameter names, in CALL_COLUMNS' and ACTION_COLUMNS' order.
_CALL_KEYS = tuple(name.strip() for name in _CALL_COLUMNS.split(","))
_ACTION_KEYS = tuple(name.strip()[2:-2] for name in _ACTION_VALUES.replace("%(", " %(").split(","))


def owner_key(owner: str) -> int:
    """The session advisory lock key (bigint key space) that an attached ``owner`` holds."""
    digest = hashlib.blake2b(owner.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _one_line(error: BaseException, hidden: list[str]) -> str:
    """A driver error as one line, without the passwords (libpq never prints one; be sure)."""
    text = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
    for secret in hidden:
        text = text.replace(secret, "***")
    return text or type(error).__name__


def _event_params(event: Event) -> dict[str, Any]:
    return {
        "e_run_id": event.run_id,
        "e_call_id": event.call_id,
        "e_kind": event.kind,
        "e_payload": _dump(event.payload),
        "e_at": event.at,
    }


def _call_params(call: CallRecord, lease_until: float) -> dict[str, Any]:
    return dict(zip(_CALL_KEYS, call_values(call, lease_until), strict=True))


def _action_params(action: ActionRecord, schemas: Schemas) -> dict[str, Any]:
    return dict(zip(_ACTION_KEYS, action_values(action, schemas), strict=True))


class PostgresStore(SQLStore):
    """A durable store in a PostgreSQL database, shared by processes on any number of hosts."""

    _mark = "%s"
    _holds_nul = False  # text holds no U+0000
    _calls, _actions, _data = "blade_calls", "blade_actions", "blade_data"
    _files, _triggers = "blade_files", "blade_triggers"
    _grants = "blade_grants"

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        connect_timeout_s: float = 10.0,
        pool_timeout_s: float = 30.0,
        create: bool = True,
    ) -> None:
        """``create=False``: only a store a runtime has made is opened (see ``open_store``)."""
        super().__init__()
        self.url = masked(url)
        self._create = create
        self.listen_retry_s = 1.0  # how soon a lost LISTEN connection is made again
        self._dsn = url
        self._secrets = secrets_of(url)
        self._connect_timeout = max(1, round(connect_timeout_s))
        self._closed = False
        self._attached: dict[str, psycopg.Connection[TupleRow]] = {}
        self._attached_lock = threading.Lock()
        self._renewers: weakref.WeakSet[PostgresRenewer] = weakref.WeakSet()
        # Events: the LISTEN thread counts notifications; each task remembers the count it saw.
        self._generation = 0
        # A cell of the task, not the count itself: a read run in a worker thread
        # (asyncio.to_thread runs it in a copy of the task's context) updates the task's cell,
        # and a task made by another (which copies its context) makes a cell of its own.
        self._seen: contextvars.ContextVar[tuple[asyncio.Task[Any] | None, list[int]]] = (
            contextvars.ContextVar(f"blade_postgres_seen_{id(self)}")
        )
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()
        self._waiters_lock = threading.Lock()
        self._listener: threading.Thread | None = None
        self._listening = threading.Event()
        self._stop = threading.Event()
        try:
            with self._connect() as connection:
                self._migrate(connection)
        except psycopg.Error as error:
            raise self._unavailable(error) from None
        self._pool: ConnectionPool[psycopg.Connection[TupleRow]] = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True, "connect_timeout": self._connect_timeout},
            open=False,
            timeout=pool_timeout_s,
            name="blade-runtime",
            # A server restart leaves every pooled connection dead without a sign; checked as it
            # is handed out, a dead one is replaced instead of failing the statement that follows.
            check=ConnectionPool.check_connection,
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except psycopg.Error as error:
            self._pool.close()
            raise self._unavailable(error) from None

    # -- connections ---------------------------------------------------------------------------

    def _unavailable(self, error: BaseException) -> StoreUnavailable:
        return StoreUnavailable(f"{self.url}: {_one_line(error, self._secrets)}")

    def _connect(self) -> psycopg.Connection[TupleRow]:
        """A connection of its own (migrations, an owner's lock, LISTEN), outside the pool."""
        return psycopg.connect(self._dsn, autocommit=True, connect_timeout=self._connect_timeout)

    @contextmanager
    def _db(self) -> Iterator[psycopg.Connection[TupleRow]]:
        """A pooled autocommit connection: each statement on it is its own transaction. A lost
        server is ``StoreUnavailable``, a value the database cannot hold a ``StoreError``;
        deadlocks and serialization failures stay themselves (none is expected: a bug)."""
        if self._closed:
            raise StoreUnavailable(f"{self.url}: the store is closed")
        try:
            with self._pool.connection() as connection:
                yield connection
        except psycopg.errors.TransactionRollback:
            raise
        except psycopg.errors.ProgramLimitExceeded as error:  # a value too large to index
            raise StoreError(f"{self.url}: {_one_line(error, self._secrets)}") from None
        except psycopg.OperationalError as error:
            raise self._unavailable(error) from None
        except psycopg.DataError as error:  # a value PostgreSQL cannot hold (text with NUL)
            raise StoreError(f"{self.url}: {_one_line(error, self._secrets)}") from None

    def _migrate(self, db: psycopg.Connection[TupleRow]) -> None:
        """Bring the schema to ``SCHEMA_VERSION``. An up-to-date database is only read (a role
        without CREATE may use it); migrating takes an advisory lock and reads again, so of
        several processes opening a new database at once one migrates it."""
        version = self._version(db)
        if version == SCHEMA_VERSION:
            return
        if version == 0 and not self._create:
            raise self._not_made()
        # A session lock taken before the transaction begins: the transaction then reads the
        # catalog as another migrator committed it (a lock taken inside it may not).
        db.execute("SELECT pg_advisory_lock(%s, %s)", (_LOCK_CLASS, _MIGRATION_LOCK))
        try:
            with db.transaction():
                version = self._version(db)
                if version == SCHEMA_VERSION:
                    return
                if version == 0:
                    db.execute(
                        "CREATE TABLE IF NOT EXISTS blade_schema_version (version integer NOT NULL)"
                    )
                self._migrate_from(
                    version,
                    MIGRATIONS,
                    db.execute,
                )
                db.execute("DELETE FROM blade_schema_version")
                db.execute(
                    "INSERT INTO blade_schema_version (version) VALUES (%s)", (SCHEMA_VERSION,)
                )
        finally:
            db.execute("SELECT pg_advisory_unlock(%s, %s)", (_LOCK_CLASS, _MIGRATION_LOCK))

    def _version(self, db: psycopg.Connection[TupleRow]) -> int:
        """The schema version of the database (0: none yet); a newer one is refused."""
        row = db.execute("SELECT to_regclass('blade_schema_version') IS NOT NULL").fetchone()
        if not row or not row[0]:
            return 0
        found = db.execute("SELECT max(version) FROM blade_schema_version").fetchone()
        version = int(found[0]) if found and found[0] is not None else 0
        self._refuse_newer(version, SCHEMA_VERSION)
        return version

    # -- the Store interface -------------------------------------------------------------------

    def _fetch(self, query: str, values: Sequence[Any]) -> list[tuple[Any, ...]]:
        # The base builds its queries from constants and markers only (values are parameters).
        with self._db() as db:
            return db.execute(query, values).fetchall()

    def nowait(self) -> contextlib.AbstractContextManager[None]:
        """A no-op: the runtime runs PostgreSQL operations in threads, never on its loop."""
        return contextlib.nullcontext()

    def renewer(self) -> PostgresRenewer:
        renewer = PostgresRenewer(self)
        with self._attached_lock:
            self._renewers.add(renewer)
        return renewer

    def begin(self, call: CallRecord, event: Event, *, lease_s: float = DEFAULT_LEASE_S) -> None:
        params = _call_params(call, call.lease_until) | _event_params(event)
        params["lease_s"] = lease_s if call.state == "running" else None
        try:
            with self._db() as db:
                row = db.execute(
                    f"WITH c AS (INSERT INTO blade_calls ({_CALL_COLUMNS}) "
                    f"VALUES ({_BEGIN_VALUES}) RETURNING call_id, lease_until) "
                    f"SELECT {_EVENT}, c.lease_until FROM c",
                    params,
                ).fetchone()
        except psycopg.errors.UniqueViolation:
            raise DuplicateCall(call.call_id) from None
        if row:
            event.seq, call.lease_until = int(row[0]), float(row[1])

    def suspend(
        self, call: CallRecord, action: ActionRecord, event: Event, *, known: bool = False
    ) -> None:
        params = (
            _call_params(call, call.lease_until)
            | _event_params(event)
            | _action_params(action, self._schemas)
        )
        if known:  # the call is there, running under call.owner: it becomes suspended/pending
            query: LiteralString = (
                "WITH c AS (UPDATE blade_calls SET state = %(state)s WHERE call_id = %(call_id)s "
                "AND owner = %(owner)s AND state = 'running' RETURNING call_id), "
                f"a AS (INSERT INTO blade_actions ({_ACTION_COLUMNS}) SELECT {_ACTION_VALUES} "
                f"FROM c RETURNING action_id) SELECT {_EVENT} FROM a"
            )
        else:
            query = (
                f"WITH c AS (INSERT INTO blade_calls ({_CALL_COLUMNS}) VALUES ({_CALL_VALUES}) "
                "RETURNING call_id), "
                f"a AS (INSERT INTO blade_actions ({_ACTION_COLUMNS}) SELECT {_ACTION_VALUES} "
                f"FROM c RETURNING action_id) SELECT {_EVENT} FROM a"
            )
        try:
            with self._db() as db:
                row = db.execute(query, params).fetchone()
        except psycopg.errors.UniqueViolation as error:
            raise StoreError(
                f"call {call.call_id!r} or action {action.action_id!r} is already recorded "
                f"({_one_line(error, [])})"
            ) from None
        if row is None:
            raise LeaseLost(call.call_id, call.owner)
        event.seq = int(row[0])

    def resolve(self, action_id: str, resolution: Resolution, event: Event) -> Resolved:
        expiry: LiteralString = " AND expires_at <= %(now)s" if resolution.only_if_expired else ""
        # The call's update is joined before blade_event() runs, so every row lock this
        # statement takes is taken before its run's events lock: it never waits for a row while
        # a reader waits for that lock (no deadlock with sweeps and readers).
        query: LiteralString = (
            "WITH a AS (UPDATE blade_actions SET state = %(state)s, resume = %(resume)s, "
            "resolved_at = %(resolved_at)s, reason = %(reason)s "
            f"WHERE action_id = %(action_id)s AND state = 'pending'{expiry} "
            f"RETURNING {_ACTION_COLUMNS}), "
            "c AS (UPDATE blade_calls SET state = %(call_state)s, entry = %(entry)s, "
            "result = %(result)s, owner = COALESCE(%(call_owner)s, blade_calls.owner), "
            "input = COALESCE(%(call_input)s, blade_calls.input), "
            "kind = COALESCE(%(call_kind)s, blade_calls.kind), "
            "side_effect = COALESCE(%(call_side_effect)s, blade_calls.side_effect), "
            f"lease_until = COALESCE({_NOW} + %(lease_s)s, 0), "
            "fence = blade_calls.fence + %(refence)s "
            "FROM a WHERE blade_calls.call_id = a.call_id "
            "RETURNING blade_calls.input, blade_calls.context, blade_calls.fence) "
            f"SELECT a.*, c.input, c.context, c.fence, {_EVENT} FROM a LEFT JOIN c ON true"
        )
        params = _event_params(event) | {
            "state": resolution.state,
            "resume": _dump(resolution.resume),
            "resolved_at": resolution.resolved_at,
            "reason": resolution.reason,
            "action_id": action_id,
            "now": clock(),  # an action's deadline is the runtime's clock
            "call_state": resolution.call_state,
            "entry": _dump(resolution.call_entry),
            "result": _dump(resolution.call_result),
            "call_owner": resolution.call_owner,
            "call_input": None if resolution.call_input is None else _dump(resolution.call_input),
            "call_kind": resolution.call_kind,
            "call_side_effect": resolution.call_side_effect,
            "lease_s": resolution.lease_s if resolution.call_owner else None,
            "refence": 1 if resolution.call_owner else 0,
        }
        with self._db() as db:
            row = db.execute(query, params).fetchone()
            if row is None:  # lost the race, or no such action: say which, and how it went
                found = db.execute(
                    f"SELECT {_ACTION_COLUMNS} FROM blade_actions WHERE action_id = %s",
                    (action_id,),
                ).fetchone()
                if found is None:
                    raise UnknownAction(action_id)
                raise ActionAlreadyResolved(action_record(found, self._schemas))
        event.seq = int(row[-1])
        action = action_record(row[:-4], self._schemas)
        if row[-4] is None:  # no such call (only an action was recorded)
            return Resolved(action, {})
        return Resolved(action, _load(row[-4]), _load(row[-3]), int(row[-2]))

    def settle(self, call_id: str, result: JsonValue, event: Event, *, owner: str) -> None:
        with self._db() as db:
            row = db.execute(
                "WITH c AS (UPDATE blade_calls SET state = 'settled', result = %(result)s "
                "WHERE call_id = %(call_id)s AND owner = %(owner)s AND state = 'running' "
                f"RETURNING call_id) SELECT {_EVENT} FROM c",
                _event_params(event)
                | {"result": _dump(result), "call_id": call_id, "owner": owner},
            ).fetchone()
        if row is None:
            raise LeaseLost(call_id, owner)
        event.seq = int(row[0])

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
        only: LiteralString = " AND call_id = %(only)s" if call_id is not None else ""
        if names is not None:
            only += " AND name = ANY(%(names)s)"
        if isinstance(names, Mapping):
            only += (
                " AND (name, spec_id) IN "
                "(SELECT * FROM unnest(%(names)s::text[], %(specs)s::text[]))"
            )
        # ``picked`` locks its rows (skipping those another sweep holds, and re-checking the
        # WHERE on the committed row for those it had to wait for): the previous state and
        # owner it returns are those the update replaces. A lease counts as expired only if it
        # was when the sweep began (see Clocks), and none does once the sweep waited past its
        # patience: an owner whose renewal waits behind the same lock keeps its calls. The
        # events are appended after the sort, in the order of their runs' lock keys: two sweeps
        # whose calls span the same runs take those locks in one order, so readers queued for
        # them cannot close a cycle (which PostgreSQL would break only after deadlock_timeout).
        # Each distinct run holds a lock to the commit: ``limit`` stays well within
        # max_locks_per_transaction.
        query: LiteralString = (
            "WITH picked AS (SELECT call_id, state AS was, owner AS previous_owner "
            "FROM blade_calls WHERE state IN ('running', 'resumable') AND (state = 'resumable' "
            f"OR (lease_until < {_BEFORE_WAIT} - %(waited)s "
            f"AND {_NOW} - {_BEFORE_WAIT} <= %(patience)s - %(waited)s) "
            f"OR owner = ANY(%(dead)s)){only} "
            "ORDER BY started_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED), "
            "u AS (UPDATE blade_calls SET state = 'running', owner = %(owner)s, "
            f"lease_until = {_NOW} + %(lease_s)s, fence = blade_calls.fence + 1 FROM picked "
            "WHERE blade_calls.call_id = picked.call_id "
            f"RETURNING picked.was, picked.previous_owner, {_CALLS_PREFIXED}) "
            "SELECT u.*, blade_event(u.run_id, u.call_id, 'claimed', "
            "json_build_object('was', u.was, 'previous_owner', u.previous_owner)::text, "
            "%(claimed_at)s) FROM u ORDER BY hashtext(u.run_id), u.started_at"
        )
        params = {
            "dead": list(dead),
            "only": call_id,
            "names": None if names is None else list(names),
            "specs": list(names.values()) if isinstance(names, Mapping) else None,
            "limit": limit,
            "owner": owner,
            "lease_s": float(lease_s),
            "patience": patience(lease_s),
            "waited": float(waited_s),
            "claimed_at": now(),
        }
        with self._db() as db:
            # Unprepared: a prepared statement's transaction starts at its Bind, after the wait.
            rows = db.execute(query, params, prepare=False).fetchall()
        claimed = [Claimed(call_record(row[2:-1]), row[0], row[1]) for row in rows]
        return sorted(claimed, key=lambda c: c.call.started_at)  # oldest first, as picked

    def renew(self, owner: str, lease_s: float) -> set[str]:
        self._still_attached(owner)
        with self._db() as db:
            rows = db.execute(_RENEW, (float(lease_s), owner)).fetchall()
        return {row[0] for row in rows}

    def owners(self) -> set[str]:
        rows = self._fetch(
            "SELECT DISTINCT owner FROM blade_calls WHERE state IN ('running', 'resumable') "
            f"AND state = 'running' AND lease_until >= {_NOW}",
            (),
        )
        return {row[0] for row in rows}

    def alive(self, owner: str) -> bool | None:
        """True while ``owner``'s session holds its lock, False once it is gone (the process
        died or detached), None for an owner that never attached to this database."""
        # A transaction-level try in an autocommit statement: released as the statement ends.
        with self._db() as db:
            row = db.execute(
                "SELECT attached_at::timestamptz < pg_postmaster_start_time(), "
                "pg_try_advisory_xact_lock(%s) FROM blade_runtimes WHERE owner = %s",
                (owner_key(owner), owner),
            ).fetchone()
        if row is None:
            return None
        before_restart, free = row
        if not free:
            return True
        return None if before_restart else False

    def _still_attached(self, owner: str) -> None:
        """Attach ``owner`` again if its lock's session ended under it (the server restarted,
        or cut the connection): until then other runtimes cannot tell it from a dead one. The
        dead connection stays recorded until a new session holds the lock, so a failed try is
        made again at the next renewal."""
        with self._attached_lock:
            connection = self._attached.get(owner)
        if connection is None:
            return  # never attached here
        try:
            connection.execute("SELECT 1")
            return
        except psycopg.Error:
            pass
        log.warning("%s: the session of runtime %s ended; attaching it again", self.url, owner)
        with self._attached_lock:
            if self._attached.get(owner) is not connection:
                return  # detached, or attached again by another thread, meanwhile
            self._attached[owner] = self._locked_session(owner)
        connection.close()

    def attach(self, owner: str) -> None:
        with self._attached_lock:
            if owner not in self._attached:
                self._attached[owner] = self._locked_session(owner)

    def _locked_session(self, owner: str) -> psycopg.Connection[TupleRow]:
        """A connection of its own holding ``owner``'s lock, the owner recorded."""
        try:
            connection = self._connect()
        except psycopg.Error as error:
            raise self._unavailable(error) from None
        try:
            # The lock first, then the record: a recorded owner whose lock is free is gone.
            row = connection.execute(
                "SELECT pg_try_advisory_lock(%s)", (owner_key(owner),)
            ).fetchone()
            if not row or not row[0]:
                raise StoreError(f"owner {owner!r} is attached by another running process")
            # the server's clock, as alive() compares it with the server's start
            connection.execute(
                "INSERT INTO blade_runtimes (owner, attached_at) "
                "VALUES (%s, clock_timestamp()::text) "
                "ON CONFLICT (owner) DO UPDATE SET attached_at = excluded.attached_at",
                (owner,),
            )
        except BaseException:
            connection.close()
            raise
        return connection

    def detach(self, owner: str) -> None:
        with self._attached_lock:
            connection = self._attached.pop(owner, None)
        if connection is None:
            return
        try:
            # The record first, then the lock: from then on the owner is unknown, not dead.
            connection.execute("DELETE FROM blade_runtimes WHERE owner = %s", (owner,))
            connection.execute("SELECT pg_advisory_unlock(%s)", (owner_key(owner),))
        except psycopg.Error:
            pass  # the connection is gone: so is the lock
        finally:
            connection.close()

    def held(self, call_id: str, owner: str, fence: int) -> bool:
        if not (self._holdable(call_id) and self._holdable(owner)):
            return False
        return bool(
            self._fetch(
                "SELECT 1 FROM blade_calls WHERE call_id = %s AND owner = %s AND fence = %s "
                f"AND state = 'running' AND lease_until >= {_NOW}",
                (call_id, owner, fence),
            )
        )

    def add_grant(self, grant: GrantRecord) -> GrantRecord:
        with self._db() as db:
            row = db.execute(
                f"WITH i AS (INSERT INTO blade_grants ({_GRANT_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
                f"ON CONFLICT ({_GRANT_KEY}) DO NOTHING "
                f"RETURNING {_GRANT_COLUMNS}) SELECT * FROM i UNION ALL "
                f"SELECT {_GRANT_COLUMNS} FROM blade_grants WHERE tenant = %s "
                "AND principal = %s AND tool = %s AND spec_id = %s AND point = %s "
                "AND subject = %s LIMIT 1",
                (*grant_values(grant), *grant_key(grant)),
            ).fetchone()
        assert row is not None  # inserted, or the one that was there
        return grant_record(row)

    def revoke_grant(
        self, grant_id: str, *, tenant: str | None = None, principal: str | None = None
    ) -> GrantRecord | None:
        if not self._holdable(grant_id):
            return None
        with self._db() as db:
            row = db.execute(
                "DELETE FROM blade_grants WHERE grant_id = %s "
                "AND (%s::text IS NULL OR tenant = %s) "
                "AND (%s::text IS NULL OR principal = %s) "
                f"RETURNING {_GRANT_COLUMNS}",
                (grant_id, tenant, tenant, principal, principal),
            ).fetchone()
        return None if row is None else grant_record(row)

    def write_data(self, record: DataRecord, event: Event | None) -> None:
        # Same item id: the value and time change, the position (seq) stays.
        upsert: LiteralString = (
            "INSERT INTO blade_data (call_id, channel, item_id, value, updated_at) "
            "VALUES (%(d_call_id)s, %(channel)s, %(item_id)s, %(value)s, %(updated_at)s) "
            "ON CONFLICT (call_id, channel, item_id) DO UPDATE SET "
            "value = excluded.value, updated_at = excluded.updated_at RETURNING seq"
        )
        params: dict[str, Any] = {
            "d_call_id": record.call_id,
            "channel": record.channel,
            "item_id": record.item_id,
            "value": _dump(record.value),
            "updated_at": record.updated_at,
        }
        with self._db() as db:
            if event is None:
                db.execute(upsert, params)
                return
            row = db.execute(
                f"WITH d AS ({upsert}) SELECT {_EVENT} FROM d", params | _event_params(event)
            ).fetchone()
        event.seq = int(row[0]) if row else 0

    # -- files and triggers ----------------------------------------------------------------

    def save_file(
        self, record: FileRecord, content: bytes, *, keep: Callable[[], bool] | None = None
    ) -> None:
        with self._db() as db, db.transaction():
            db.execute(
                f"INSERT INTO blade_files ({_FILE_COLUMNS}, content) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (*file_values(record), content),
            )
            if keep is not None and not keep():  # rolled back: nothing of it is stored
                raise SaveStopped(f"file {record.file_id} was not kept")

    def add_trigger(self, trigger: TriggerRecord, event: Event, *, owner: str | None) -> bool:
        params = dict(zip(_TRIGGER_KEYS, trigger_values(trigger), strict=True))
        params |= _event_params(event) | {"owner": owner}
        if owner is not None:  # the call's row is locked before its run's events lock
            query: LiteralString = (
                "WITH c AS (SELECT call_id FROM blade_calls WHERE call_id = %(t_call_id)s "
                "AND owner = %(owner)s AND state = 'running' "
                f"AND lease_until >= {_NOW} FOR SHARE), "
                f"t AS (INSERT INTO blade_triggers ({_TRIGGER_COLUMNS}) "
                f"SELECT {_TRIGGER_VALUES} FROM c ON CONFLICT (trigger_id) DO NOTHING "
                f"RETURNING trigger_id) SELECT (SELECT count(*) FROM c), (SELECT {_EVENT} FROM t)"
            )
        else:
            query = (
                f"WITH t AS (INSERT INTO blade_triggers ({_TRIGGER_COLUMNS}) "
                f"VALUES ({_TRIGGER_VALUES}) ON CONFLICT (trigger_id) DO NOTHING "
                f"RETURNING trigger_id) SELECT 1, (SELECT {_EVENT} FROM t)"
            )
        with self._db() as db:
            row = db.execute(query, params).fetchone()
        assert row is not None  # one row, always
        if not row[0]:
            raise LeaseLost(trigger.call_id, owner or "")
        if row[1] is None:  # recorded already
            return False
        event.seq = int(row[1])
        return True

    def claim_triggers(
        self, owner: str, lease_s: float, *, limit: int = 100
    ) -> list[TriggerRecord]:
        # Concurrent claims skip the rows another holds and re-check those it committed.
        with self._db() as db:
            rows = db.execute(
                f"UPDATE blade_triggers SET state = 'claimed', owner = %s, "
                f"claimed_until = {_NOW} + %s WHERE seq IN (SELECT seq FROM blade_triggers "
                "WHERE state IN ('pending', 'claimed') AND (state = 'pending' OR "
                f"claimed_until < {_NOW}) ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED) "
                f"RETURNING seq, {_TRIGGER_COLUMNS}",
                (owner, lease_s, limit),
            ).fetchall()
        return [trigger_record(row[1:]) for row in sorted(rows)]

    def finish_trigger(self, trigger_id: str, owner: str, *, error: str | None = None) -> bool:
        with self._db() as db:
            changed = db.execute(
                "UPDATE blade_triggers SET state = %s, finished_at = %s, error = %s "
                "WHERE trigger_id = %s AND owner = %s AND state = 'claimed'",
                ("delivered" if error is None else "failed", now(), error, trigger_id, owner),
            ).rowcount
        return bool(changed)

    def events(self, run_id: str, after: int = 0) -> list[Event]:
        self._watch()  # before the read: a commit after it wakes changed()
        with self._db() as db:
            rows = db.execute(
                "SELECT run_id, call_id, kind, payload, at, seq FROM blade_events_after(%s, %s)",
                (run_id, after),
            ).fetchall()
        return [Event(r[0], r[1], r[2], _load(r[3]), r[4], int(r[5])) for r in rows]

    def head(self, run_id: str | None = None) -> int:
        self._watch()
        with self._db() as db:
            row = db.execute("SELECT blade_events_head(%s)", (run_id,)).fetchone()
        return int(row[0]) if row else 0

    async def changed(self, timeout_s: float) -> None:
        """Return when another commit's NOTIFY arrived since this task last read ``events``,
        ``head`` or returned from here (at once if one did), or after ``timeout_s``."""
        if self._listener is None:
            self._listen()
            self._seen_cell()[0] = self._generation
            return  # commits before LISTEN began were not heard: the caller reads again
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = (loop, future)
        with self._waiters_lock:
            woken = self._generation > self._seen_cell()[0]
            if not woken:
                self._waiters.add(waiter)
        try:
            if not woken:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(future, timeout_s)
        finally:
            with self._waiters_lock:
                self._waiters.discard(waiter)
                self._seen_cell()[0] = self._generation

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._listener is not None:
            self._listener.join(timeout=5)
        with self._attached_lock:
            attached = list(self._attached)
        for owner in attached:
            self.detach(owner)
        with self._attached_lock:
            renewers = list(self._renewers)
        for renewer in renewers:
            renewer.close()
        self._pool.close()

    # -- events across processes ---------------------------------------------------------------

    def _watch(self) -> None:
        """Listen (from the first read on), and note the notifications this task has seen."""
        if self._listener is None:
            self._listen()
        self._seen_cell()[0] = self._generation

    def _seen_cell(self) -> list[int]:
        """The notification count the current task last saw (-1: none yet). In a thread, the
        cell of the task whose context it runs in."""
        found = self._seen.get(None)
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no event loop in this thread
            task = None
        if found is None or (task is not None and found[0] is not task):
            # a task made by another starts from what its maker had seen, as a copy
            found = (task, [-1 if found is None else found[1][0]])
            self._seen.set(found)
        return found[1]

    def _listen(self) -> None:
        """Start the LISTEN thread, and wait until it listens (or has failed once)."""
        with self._waiters_lock:
            if self._listener is not None:
                return
            self._listener = threading.Thread(
                target=self._listen_loop, name="blade-postgres-listen", daemon=True
            )
            self._listener.start()
        self._listening.wait(timeout=self._connect_timeout)

    def _listen_loop(self) -> None:
        failing = False  # said once per outage, not at every retry
        while not self._stop.is_set():
            try:
                with self._connect() as connection:
                    key = self._register_listener(connection)
                    connection.execute(f"LISTEN {CHANNEL}")
                    if failing:
                        log.warning("%s: listening for events again", self.url)
                        failing = False
                    self._listening.set()
                    self._wake()  # anything may have been committed while not listening
                    self._writers_in_flight_done(connection, self._connect_timeout)
                    self._wake()  # and by a writer that saw no listener yet
                    while not self._stop.is_set():
                        for _ in connection.notifies(timeout=0.1):
                            self._wake()
                    connection.execute("DELETE FROM blade_listeners WHERE key = %s", (key,))
            except psycopg.Error as error:
                if not failing and not self._stop.is_set():
                    log.warning(
                        "%s: listening for events failed (retrying every %g s): %s",
                        self.url,
                        self.listen_retry_s,
                        _one_line(error, self._secrets),
                    )
                failing = True
                self._listening.set()
                self._wake()  # let the readers find the error (or the events) themselves
                self._stop.wait(self.listen_retry_s)

    @staticmethod
    def _register_listener(connection: psycopg.Connection[TupleRow]) -> int:
        """Record this LISTEN session in ``blade_listeners`` (writers send NOTIFY only while a
        row is there), under a session lock of its own key, and drop the rows of listeners
        whose lock is free (their session ended without saying so)."""
        while True:
            key = secrets.randbelow(2**31 - 1) + 1
            row = connection.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", (_LISTENER_CLASS, key)
            ).fetchone()
            if row and row[0]:
                break
        connection.execute(
            "INSERT INTO blade_listeners (key, since) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (key, now()),
        )  # first: while reconnecting, the old row of this store may be the only one
        listed = connection.execute("SELECT key FROM blade_listeners WHERE key <> %s", (key,))
        for (gone,) in listed.fetchall():
            row = connection.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", (_LISTENER_CLASS, gone)
            ).fetchone()
            if row and row[0]:
                connection.execute("DELETE FROM blade_listeners WHERE key = %s", (gone,))
                connection.execute("SELECT pg_advisory_unlock(%s, %s)", (_LISTENER_CLASS, gone))
        return key

    def _writers_in_flight_done(
        self, connection: psycopg.Connection[TupleRow], limit_s: float
    ) -> None:
        """Return once the transactions in progress now have ended (or after ``limit_s``): a
        writer that looked for listeners before this store's row was committed sent no NOTIFY,
        and its commit may come after the readers' first look. Meanwhile the notifications that
        do arrive wake the waiters at once (a long transaction elsewhere on the server only
        makes this wait long, not them)."""
        rows = connection.execute("SELECT pg_snapshot_xip(pg_current_snapshot())").fetchall()
        running = [row[0] for row in rows]
        deadline, pause = time.monotonic() + limit_s, 0.005
        while running and time.monotonic() < deadline and not self._stop.is_set():
            for _ in connection.notifies(timeout=pause):
                self._wake()
            pause = min(pause * 2, 0.1)
            rows = connection.execute(
                "SELECT x FROM unnest(%s::xid8[]) AS x WHERE pg_xact_status(x) = 'in progress'",
                (running,),
            ).fetchall()
            running = [row[0] for row in rows]

    def _wake(self) -> None:
        with self._waiters_lock:
            self._generation += 1
            waiters = list(self._waiters)
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop has closed
                loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class PostgresRenewer:
    """``PostgresStore.renewer()``: renewals on one autocommit connection of its own, outside
    the pool (a pool drained by stalled operations does not hold them up), made again after a
    failure; as ``PostgresStore.renew``, it first attaches its owner again if the session of the
    owner's lock ended. Any thread may call it, one at a time."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self._db: psycopg.Connection[TupleRow] | None = None
        self._lock = threading.Lock()
        self._closed = False

    def renew(self, owner: str, lease_s: float) -> set[str]:
        store = self._store
        with self._lock:
            if self._closed or store._closed:
                raise StoreUnavailable(f"{store.url}: the renewer is closed")
            store._still_attached(owner)
            for attempt in (1, 2):  # a connection found dead is made again, once
                fresh = self._db is None
                try:
                    if self._db is None:
                        self._db = store._connect()
                    rows = self._db.execute(_RENEW, (float(lease_s), owner)).fetchall()
                    return {row[0] for row in rows}
                except psycopg.OperationalError as error:
                    self._drop()
                    if fresh or attempt == 2:
                        raise store._unavailable(error) from None
            raise AssertionError("unreachable")

    def _drop(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(psycopg.Error):
                db.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()
