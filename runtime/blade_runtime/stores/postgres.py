"""``PostgresStore``: the store shared by workers on many machines (``blade-runtime[postgres]``).

A dialect of ``blade_runtime.stores.sql`` on psycopg 3, with a ``psycopg_pool.ConnectionPool`` of
autocommit connections. Every transition is one transaction of the rules' statements, sent in
one pipelined round trip (BEGIN, the statements, COMMIT): the change, what follows from it and
its event commit together or not at all. A guard (``blade_require()``) raises on the server when
its statement finds no row, so the transaction ends there and nothing queued after it runs.

- **Exactly once.** Resolving an action is ``UPDATE ... WHERE state = 'pending' RETURNING``
  (with ``expires_at <= now`` for an expiry); of many concurrent resolutions one changes the row.
  A runner's write locks its call's row ``FOR SHARE`` to the commit, so a claim never slips in
  between its guard and its commit.
- **Claims.** A sweep selects its candidates ``FOR UPDATE SKIP LOCKED``: concurrent sweeps skip
  the rows another sweep holds and re-check, on the row as committed, those it waited for, so no
  call is claimed twice. Which of them it takes is the one rule every store applies
  (``core.store.claimable``), judged by the server's clocks the statement returns.
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
  a lease by the clock at its transaction's start (``transaction_timestamp()``, before any lock
  wait) and the clock once its rows are locked, as every store does (``lapsed_before``).
  ``expires_at`` (an action's deadline) is the runtime's ``store.clock()``, as it computes it,
  so hosts' clocks must agree to well within a deadline.
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
import functools
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
import psycopg.pq
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolTimeout

from blade_runtime.core.store import (
    Event,
    StoreError,
    StoreUnavailable,
    now,
)
from blade_runtime.core.store import dump_json as _dump
from blade_runtime.stores.postgres_schema import (
    CHANNEL,
    LISTENER_CLASS,
    LOCK_CLASS,
    MIGRATION_LOCK,
    MIGRATIONS,
    SCHEMA_VERSION,
    SLOT_CLASS,
)
from blade_runtime.stores.sql import (
    CALL_COLUMNS,
    EVENT_COLUMNS,
    Candidates,
    SQLStore,
    Tx,
    call_record,
    event_record,
    names_filter,
    pyformat,
)
from blade_runtime.stores.urls import masked, secrets_of

LISTEN_WAIT_S = 2.0
"""How long the listener waits for a notification before it looks at its stop flag again (a
shorter wait polled 10 times a second: 1.2% of a core for an idle stream)."""

log = logging.getLogger("blade_runtime")


# The server's clock, as leases are granted: when the statement runs (its locks taken).
_NOW: LiteralString = "extract(epoch from clock_timestamp())::float8"
# The server's clock when the transaction began, before any wait for a lock (see Clocks).
_BEFORE_WAIT: LiteralString = "extract(epoch from transaction_timestamp())::float8"
_RENEW: LiteralString = (
    f"UPDATE blade_calls SET lease_until = {_NOW} + %s WHERE owner = %s AND state = 'running' "
    "RETURNING call_id"
)
_GUARD_FAILED = "BL001"  # blade_require()'s SQLSTATE


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


@functools.lru_cache(maxsize=512)
def _sql(text: str) -> Any:
    """A statement as psycopg takes it: named ``%(name)s`` parameters, the server's clock."""
    return pyformat(text.replace("{now}", _NOW))


def _forget_prepared(db: psycopg.Connection[TupleRow]) -> None:
    """After a pipeline an error ended: psycopg 3.3 records a statement as prepared when it
    queues its preparation, and when the server skips it (the pipeline was aborted before it)
    never forgets it, so its next use fails ("prepared statement _pg3_N does not exist"). Its
    own way out is the one it takes after a ROLLBACK it sees: forget every prepared statement,
    here and on the server (DEALLOCATE ALL, sent before the next statement). Failing that (a
    psycopg without it), the connection is not used again."""
    prepared = getattr(db, "_prepared", None)
    if prepared is not None and callable(getattr(prepared, "clear", None)):
        prepared.clear()
    else:
        db.close()


class _Rows:
    """A pipelined statement's rows: there once the round trip has ended (asking before then
    ends it early, within the transaction)."""

    __slots__ = ("_cursor", "_rows", "_tx")

    def __init__(self, tx: _Tx, cursor: psycopg.Cursor[TupleRow] | None) -> None:
        self._tx = tx
        self._cursor = cursor  # None: not run (an earlier statement failed)
        self._rows: list[tuple[Any, ...]] | None = None

    def all(self) -> list[tuple[Any, ...]]:
        if self._rows is None:
            cursor = self._cursor
            if cursor is not None and cursor.pgresult is None:  # not received yet
                self._tx.sync()
            if self._tx.error is not None and (cursor is None or cursor.pgresult is None):
                raise self._tx.error
            assert cursor is not None
            self._rows = cursor.fetchall() if cursor.description else []
        return self._rows

    def one(self) -> tuple[Any, ...] | None:
        rows = self.all()
        return rows[0] if rows else None


class _Tx:
    """One transaction, pipelined: BEGIN, its statements and COMMIT reach the server in one round
    trip. A guard's statement raises on the server when it finds no row, which ends the
    transaction there (nothing after it runs); its failure is raised here after the rollback.
    A statement's error that psycopg reports while later ones are still being queued is kept
    (``error``) and the rest is not sent: it is raised when the pipeline has ended."""

    __slots__ = ("_db", "_pipeline", "error", "failures")

    def __init__(self, db: psycopg.Connection[TupleRow], pipeline: psycopg.Pipeline) -> None:
        self._db = db
        self._pipeline = pipeline
        self.error: psycopg.Error | None = None
        self.failures: list[Callable[[], StoreError]] = []

    def run(self, sql: str, params: Mapping[str, Any] | None = None) -> _Rows:
        if self.error is not None:
            return _Rows(self, None)
        cursor = self._db.cursor()
        try:
            cursor.execute(_sql(sql), params or {})
        except psycopg.Error as error:
            self.error = error
            return _Rows(self, None)
        return _Rows(self, cursor)

    def sync(self) -> None:
        """Have what was sent answered (within the transaction)."""
        if self.error is None:
            try:
                self._pipeline.sync()
            except psycopg.Error as error:
                self.error = error

    def require(
        self, sql: str, params: Mapping[str, Any], failure: Callable[[], StoreError]
    ) -> _Rows:
        tag = len(self.failures)
        self.failures.append(failure)
        return self.run(
            f"WITH g AS ({sql}), r AS (SELECT blade_require((SELECT count(*) FROM g), {tag})) "
            "SELECT g.* FROM r LEFT JOIN g ON true",
            params,
        )

    def append(self, event: Event, root_id: str) -> _Rows:
        return self.run(
            "SELECT blade_event(:run_id, :call_id, :kind, :payload, :at, :tenant, :principal, "
            ":root_id)",
            {
                "run_id": event.run_id,
                "call_id": event.call_id,
                "kind": event.kind,
                "payload": _dump(event.payload),
                "at": event.at,
                "tenant": event.tenant,
                "principal": event.principal,
                "root_id": root_id,
            },
        )


class PostgresStore(SQLStore):
    """A durable store in a PostgreSQL database, shared by processes on any number of hosts."""

    _holds_nul = False  # text holds no U+0000
    _NOW = _NOW
    _BEFORE_WAIT = _BEFORE_WAIT
    _SHARE = " FOR SHARE"
    _SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    _LAST_EVENT = "currval(pg_get_serial_sequence('blade_events', 'seq'))"  # this session's

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
        self._generation = 0  # NOTIFYs heard (see mark())
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()
        self._waiters_lock = threading.Lock()
        self._listener: threading.Thread | None = None
        self._listening = threading.Event()
        self._stop = threading.Event()
        # The listener waits for notifications seconds at a time (an idle store costs no CPU);
        # close() wakes it at once with a NOTIFY on a channel of this store's own.
        self._close_channel = f"blade_close_{secrets.token_hex(8)}"
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
        db.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, MIGRATION_LOCK))
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
            db.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, MIGRATION_LOCK))

    def _version(self, db: psycopg.Connection[TupleRow]) -> int:
        """The schema version of the database (0: none yet); a newer one is refused."""
        row = db.execute("SELECT to_regclass('blade_schema_version') IS NOT NULL").fetchone()
        if not row or not row[0]:
            return 0
        found = db.execute("SELECT max(version) FROM blade_schema_version").fetchone()
        version = int(found[0]) if found and found[0] is not None else 0
        self._refuse_newer(version, SCHEMA_VERSION)
        return version

    # -- transactions and reads ------------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[_Tx]:
        failure: Callable[[], StoreError] | None = None
        with self._db() as db:
            tx: _Tx | None = None
            try:
                try:
                    with db.pipeline() as pipeline:
                        tx = _Tx(db, pipeline)
                        tx.run("BEGIN")
                        yield tx
                        tx.run("COMMIT")
                except psycopg.Error as ended:  # at the pipeline's end: what ended it first
                    raise ended if tx is None or tx.error is None else tx.error from None
                if tx.error is not None:
                    raise tx.error
            except BaseException as error:
                if db.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        db.execute("ROLLBACK")
                if isinstance(error, psycopg.Error):
                    _forget_prepared(db)
                    if error.sqlstate == _GUARD_FAILED and tx is not None:
                        failure = tx.failures[int(str(error.diag.message_primary))]
                if failure is None:
                    raise
        if failure is not None:
            raise failure()  # made once the connection is back: it may read the store

    def _fetch(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        with self._db() as db:
            return db.execute(_sql(sql), params or {}).fetchall()

    def _duplicate(self, error: BaseException) -> bool:
        return isinstance(error, psycopg.errors.UniqueViolation)

    def nowait(self) -> contextlib.AbstractContextManager[None]:
        """A no-op: the runtime runs PostgreSQL operations in threads, never on its loop."""
        return contextlib.nullcontext()

    def renewer(self) -> PostgresRenewer:
        renewer = PostgresRenewer(self)
        with self._attached_lock:
            self._renewers.add(renewer)
        return renewer

    # -- claims and leases -----------------------------------------------------------------------

    def _lock_slots(self, tx: Tx, keys: Sequence[str]) -> None:
        # Transaction locks, in one order: two acquirers sharing a key never deadlock.
        for key in keys:
            tx.run(
                "SELECT pg_advisory_xact_lock(:cls, hashtext(:key))",
                {"cls": SLOT_CLASS, "key": key},
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
        # Locks its rows, skipping those another sweep holds and re-checking the WHERE on the
        # committed row of those it had to wait for: no call is claimed twice. The lock keys of
        # the calls' runs order their events (see SQLStore.claim). The clock when the
        # transaction began is before any wait (see Clocks).
        only, values = names_filter(names)
        if call_id is not None:
            only += " AND call_id = :only"
            values["only"] = call_id
        rows = tx.run(
            f"SELECT {CALL_COLUMNS}, hashtext(run_id), {_BEFORE_WAIT}, {{now}} FROM blade_calls "
            "WHERE state IN ('running', 'resumable') AND (state = 'resumable' "
            "OR lease_until < {now} OR owner = ANY(:dead))"
            f"{only} ORDER BY started_at LIMIT :limit FOR UPDATE SKIP LOCKED",
            values | {"dead": list(dead), "limit": limit},
        ).all()
        if not rows:
            return Candidates([], 0.0, 0.0)
        return Candidates(
            [(call_record(row), int(row[-3])) for row in rows], float(rows[0][-2]), rows[0][-1]
        )

    def renew(self, owner: str, lease_s: float) -> set[str]:
        self._still_attached(owner)
        with self._db() as db:
            rows = db.execute(_RENEW, (float(lease_s), owner)).fetchall()
        return {row[0] for row in rows}

    def owners(self) -> set[str]:
        rows = self._fetch(
            "SELECT DISTINCT owner FROM blade_calls WHERE state IN ('running', 'resumable') "
            "AND state = 'running' AND lease_until >= {now}"
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

    # -- events ----------------------------------------------------------------------------------

    def events(
        self,
        run_id: str,
        after: int = 0,
        *,
        limit: int | None = None,
        tenant: str | None = None,
        principal: str | None = None,
    ) -> list[Event]:
        if not self._holdable(run_id):
            return []
        self._watch()  # before the read: a commit after it moves the mark
        rows = self._fetch(
            f"SELECT {EVENT_COLUMNS} FROM blade_events_page(:run, :after, :limit, :tenant, "
            ":principal)",
            {
                "run": run_id,
                "after": int(after),
                "limit": limit,
                "tenant": tenant,
                "principal": principal,
            },
        )
        return [event_record(row) for row in rows]

    def head(self, run_id: str | None = None) -> int:
        self._watch()
        rows = self._fetch("SELECT blade_events_head(:run)", {"run": run_id})
        return int(rows[0][0]) if rows else 0

    def mark(self) -> int:
        self._listen(wait=False)  # on the event loop: the thread starts listening by itself
        return self._generation

    async def changed(self, timeout_s: float, mark: int) -> None:
        """Return once a NOTIFY came after ``mark`` (at once if one did), or after
        ``timeout_s``."""
        self._listen(wait=False)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = (loop, future)
        with self._waiters_lock:
            if self._generation > mark:
                return
            self._waiters.add(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, timeout_s)
        finally:
            with self._waiters_lock:
                self._waiters.discard(waiter)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._listener is not None:
            if self._listener.is_alive():
                with (
                    contextlib.suppress(psycopg.Error, PoolTimeout),
                    self._pool.connection(timeout=1) as connection,
                ):
                    connection.execute(f"NOTIFY {self._close_channel}")
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
        """Listen, from the first read of events on."""
        if self._listener is None:
            self._listen()

    def _listen(self, *, wait: bool = True) -> None:
        """Start the LISTEN thread; ``wait``: until it listens (or has failed once). Once it
        listens it wakes every waiter: a commit no NOTIFY told of is then read anyway."""
        with self._waiters_lock:
            if self._listener is None:
                self._listener = threading.Thread(
                    target=self._listen_loop, name="blade-postgres-listen", daemon=True
                )
                self._listener.start()
        if wait:
            self._listening.wait(timeout=self._connect_timeout)

    def _listen_loop(self) -> None:
        failing = False  # said once per outage, not at every retry
        while not self._stop.is_set():
            try:
                with self._connect() as connection:
                    key = self._register_listener(connection)
                    connection.execute(f"LISTEN {CHANNEL}")
                    connection.execute(f"LISTEN {self._close_channel}")
                    if failing:
                        log.warning("%s: listening for events again", self.url)
                        failing = False
                    self._listening.set()
                    self._wake()  # anything may have been committed while not listening
                    self._writers_in_flight_done(connection, self._connect_timeout)
                    self._wake()  # and by a writer that saw no listener yet
                    while not self._stop.is_set():
                        for _ in connection.notifies(timeout=LISTEN_WAIT_S):
                            self._wake()
                            if self._stop.is_set():  # close()'s own NOTIFY
                                break
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
                "SELECT pg_try_advisory_lock(%s, %s)", (LISTENER_CLASS, key)
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
                "SELECT pg_try_advisory_lock(%s, %s)", (LISTENER_CLASS, gone)
            ).fetchone()
            if row and row[0]:
                connection.execute("DELETE FROM blade_listeners WHERE key = %s", (gone,))
                connection.execute("SELECT pg_advisory_unlock(%s, %s)", (LISTENER_CLASS, gone))
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
