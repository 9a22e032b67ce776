"""PostgresStore's own behaviour, beyond the conformance suite: its events' numbering and
notifications, migrations, liveness by session, cut connections and its one-line refusals.

A real server (``tests/postgres.py``): a missing one fails these tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import forked
import pytest
import store_workers
from records import begun, ev, kinds, one_line, uid

from blade_runtime.core.store import (
    Store,
    StoreError,
    StoreUnavailable,
)
from blade_runtime.stores.urls import open_store


def test_postgres_a_rolled_back_event_is_never_numbered_nor_notified(postgres_url: str) -> None:
    import psycopg

    store = open_store(postgres_url)
    try:
        call = begun(store)
        head = store.head()

        async def scenario() -> float:
            store.events("run-1")  # it listens from here on
            await asyncio.sleep(0.3)
            mark = store.mark()
            store.events("run-1")
            started = time.monotonic()
            waiting = asyncio.ensure_future(store.changed(1.0, mark))
            await asyncio.sleep(0.05)
            with psycopg.connect(postgres_url) as other:  # not autocommit: a transaction
                other.execute(
                    "SELECT blade_event('run-1', %s, 'ghost', '{}', 'now', '', '', %s)",
                    (call.call_id, call.call_id),
                )
                other.rollback()
            await waiting
            return time.monotonic() - started

        assert asyncio.run(scenario()) >= 0.95  # the NOTIFY of the rollback never came
        assert store.head() == head
        assert kinds(store) == ["started"]
        later = begun(store)
        assert store.head() > head and store.call(later.call_id) is not None
    finally:
        store.close()


def test_postgres_a_reader_waits_for_an_event_numbered_but_not_committed(postgres_url: str) -> None:
    """Writers do not wait for each other, so a later number can commit first; a reader of the
    run then waits for the earlier one instead of returning the later alone (and skipping the
    earlier for good: a subscriber resumes after the last number it saw), and so does the start
    of a new subscription to the run. Readers of another run, and a reader with nothing new to
    read, do not wait."""
    import psycopg

    def waits(read: Callable[[], object]) -> bool:
        done, _ = started(read)
        done.join(2)  # a read that does not wait returns in milliseconds, even on a busy host
        return done.is_alive()

    store = open_store(postgres_url)
    try:
        call = begun(store)
        other = begun(store, run_id="run-2")
        seen = store.events("run-1")[-1].seq
        with psycopg.connect(postgres_url) as open_transaction:  # not autocommit
            early = open_transaction.execute(
                "SELECT blade_event('run-1', %s, 'early', '{}', 'now', '', '', %s)",
                (call.call_id, call.call_id),
            ).fetchone()
            writer, _ = started(lambda: store.settle(call.claim, {"ok": True}, ev(call, "settled")))
            writer.join(2)
            write_waited = writer.is_alive()
            assert not waits(lambda: store.events("run-2"))  # another run's reader
            assert not waits(lambda: store.head("run-2"))
            assert not waits(lambda: store.events("run-1", store.head()))  # nothing new
            reader, read = started(lambda: kinds(store))
            reader.join(0.5)
            reader_waited = reader.is_alive() and read == []
            head, heads = started(lambda: store.head("run-1"))
            head.join(0.5)
            head_waited = head.is_alive() and heads == []
            open_transaction.commit()
        writer.join(5)
        reader.join(5)
        head.join(5)
        assert not write_waited and reader_waited and head_waited  # the write did not wait
        assert read == [["started", "early", "settled"]]
        assert early is not None and [e.seq for e in store.events("run-1")][1] == early[0]
        assert heads == [store.head()] and store.events("run-1", seen)[0].seq == early[0]
        assert [e.call_id for e in store.events("run-2")] == [other.call_id]
    finally:
        store.close()


def test_postgres_notifies_only_while_a_store_listens(postgres_url: str) -> None:
    """A NOTIFY serializes the commits that send one, so none is sent while no store listens;
    a listening store is a row that its session's lock keeps, and a row whose session is gone
    (killed, not closed) is dropped when the next store begins to listen."""
    import psycopg

    from blade_runtime.stores.postgres_schema import LISTENER_CLASS

    def notified(action: Callable[[], object]) -> int:
        with psycopg.connect(postgres_url, autocommit=True) as raw:
            raw.execute("LISTEN blade_events")
            action()
            return len(list(raw.notifies(timeout=0.3)))

    writer = open_store(postgres_url)
    try:
        assert notified(lambda: begun(writer)) == 0
        listener = open_store(postgres_url)
        listener.head()  # a store listens from its first read of events on
        assert notified(lambda: begun(writer)) == 1
        listener.close()
        assert notified(lambda: begun(writer)) == 0
        listener = open_store(postgres_url)
        listener.head()
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            killed = admin.execute(  # the listening session: the one holding its listener lock
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_locks WHERE locktype = "
                "'advisory' AND classid = %s AND objsubid = 2 AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())",
                (LISTENER_CLASS,),
            ).fetchall()
            assert killed == [(True,)]
            listener._stop.set()  # type: ignore[attr-defined]  # it must not listen again
            time.sleep(0.3)
            keys = admin.execute("SELECT key FROM blade_listeners").fetchall()
            assert len(keys) == 1  # the killed session said nothing: its row stayed
            again = open_store(postgres_url)
            again.head()
            assert admin.execute("SELECT key FROM blade_listeners").fetchall() != keys
            assert len(admin.execute("SELECT key FROM blade_listeners").fetchall()) == 1
            again.close()
        listener.close()
        assert notified(lambda: begun(writer)) == 0
    finally:
        writer.close()


def test_postgres_a_database_of_the_first_release_is_migrated_with_its_events(
    postgres_url: str,
) -> None:
    """The owner migrates a first-release database: its events stay, and the workers' role,
    granted rights on the first release's tables only, still appends and reads events and
    listens (the new listeners table is granted to the roles that may append events)."""
    import psycopg

    from blade_runtime.stores.postgres_schema import MIGRATIONS, SCHEMA_VERSION

    with psycopg.connect(postgres_url, autocommit=True) as db, db.transaction():
        db.execute("CREATE TABLE blade_schema_version (version integer NOT NULL)")
        for statement in MIGRATIONS[0]:
            db.execute(statement)
        db.execute("INSERT INTO blade_schema_version (version) VALUES (1)")
        db.execute("SELECT blade_event('run-1', 'c-old', 'started', '{}', 'then')")
    with workers_role(postgres_url) as as_role:
        grant_rows(postgres_url, as_role)  # on the first release's tables
        open_store(postgres_url).close()  # the owner migrates
        store = open_store(as_role)
        try:
            call = begun(store)
            assert kinds(store) == ["started", "started"]  # it listens from this read on
            assert [e.call_id for e in store.events("run-1")] == ["c-old", call.call_id]
            with psycopg.connect(postgres_url, autocommit=True) as db:
                version = db.execute("SELECT version FROM blade_schema_version").fetchall()
                assert version == [(SCHEMA_VERSION,)]
                deadline = time.monotonic() + 5
                while not db.execute("SELECT key FROM blade_listeners").fetchall():
                    assert time.monotonic() < deadline, "the role's store never listened"
                    time.sleep(0.05)
        finally:
            store.close()


def test_postgres_a_store_starting_to_listen_hears_a_writer_that_saw_no_listener(
    postgres_url: str,
) -> None:
    """A writer looked for listeners before this store listed itself (so it sends no NOTIFY)
    and commits after the store's first read: the store still wakes its waiters on that commit,
    not a whole wait later."""
    import psycopg

    store = open_store(postgres_url)
    try:
        with psycopg.connect(postgres_url) as open_transaction:  # not autocommit
            open_transaction.execute(
                "SELECT blade_event('run-1', 'c-1', 'late', '{}', 'now', '', '', 'c-1')"
            )
            store.head()  # the store starts listening now
            committed = threading.Timer(0.3, open_transaction.commit)
            committed.start()

            waited = asyncio.run(seconds_until_events(store, "run-1"))
            committed.join()
        assert kinds(store) == ["late"] and waited < 2.5  # not the 5 s wait
    finally:
        store.close()


def test_postgres_a_long_transaction_elsewhere_does_not_delay_a_new_listener_s_wakeups(
    postgres_url: str,
) -> None:
    """A store starting to listen waits out the transactions in flight (one may be a writer that
    saw no listener); a long one that never appends (an operator's open session) makes that wait
    last, but the notifications of other commits still wake the store's waiters at once."""
    import psycopg

    store, writer = open_store(postgres_url), open_store(postgres_url)
    try:
        with psycopg.connect(postgres_url) as long_running:  # not autocommit
            long_running.execute("SELECT pg_current_xact_id()")  # in progress from now on
            store.head()  # the store starts listening, and waits that transaction out

            async def heard() -> float:
                assert store.events("run-1") == []
                committed = threading.Timer(0.3, lambda: begun(writer))
                committed.start()
                waited = await seconds_until_events(store, "run-1")
                committed.join()
                return waited

            waited = asyncio.run(heard())
            long_running.rollback()
        assert waited < 2.5  # not a whole 5 s wait
    finally:
        store.close()
        writer.close()


def test_postgres_survives_its_connections_being_cut(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server ends every session of the store (a restart, a failover): the pool replaces each
    dead connection as it hands it out, so the next operation succeeds on a new one, and the
    LISTEN thread listens again, saying so once (a warning when listening fails, one when it is
    back), without the password."""
    import logging

    import psycopg

    caplog.set_level(logging.WARNING, logger="blade_runtime")

    store, writer = open_store(postgres_url), open_store(postgres_url)
    try:
        begun(store)
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            store.events("run-1")  # the LISTEN thread is up
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        for _ in range(3):  # every pooled connection was cut: none fails a statement
            assert len(store.calls()) == 1

        async def woken() -> float:
            store.events("run-1")
            await asyncio.sleep(1.5)  # the LISTEN thread reconnects (listen_retry_s)
            mark = store.mark()
            store.events("run-1")
            started = time.monotonic()
            waiting = asyncio.ensure_future(store.changed(5.0, mark))
            await asyncio.sleep(0.1)
            while True:
                try:
                    begun(writer)
                    break
                except StoreUnavailable:
                    continue
            await waiting
            return time.monotonic() - started

        assert asyncio.run(woken()) < 2.0
        said = [r.getMessage() for r in caplog.records if "listening for events" in r.getMessage()]
        assert len(said) == 2 and "failed (retrying every 1 s)" in said[0], said
        assert said[1].endswith("listening for events again"), said
        assert all(urlsplit_password(postgres_url) not in line for line in said)
    finally:
        store.close()
        writer.close()


def test_postgres_processes_opening_a_new_database_migrate_it_once(postgres_url: str) -> None:
    import psycopg

    from blade_runtime.stores.postgres_schema import SCHEMA_VERSION

    opened: list[Store] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def open_one() -> None:
        barrier.wait()
        try:
            opened.append(open_store(postgres_url))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for store in opened:
        store.close()
    assert errors == [] and len(opened) == 4
    with psycopg.connect(postgres_url) as db:
        assert db.execute("SELECT version FROM blade_schema_version").fetchall() == [
            (SCHEMA_VERSION,)
        ]


def test_postgres_a_role_without_create_uses_a_migrated_database(postgres_url: str) -> None:
    """Migrations run as a role that may create tables; the workers' role may only read and
    write rows: it opens an up-to-date store (nothing to create), and is refused, in one line,
    on a database that still needs its tables."""
    with workers_role(postgres_url) as as_role:
        with pytest.raises(StoreUnavailable) as error:  # a new database: it may not migrate
            open_store(as_role)
        assert "permission denied" in one_line(error, urlsplit_password(as_role))
        open_store(postgres_url).close()  # the owner migrates
        grant_rows(postgres_url, as_role)
        store = open_store(as_role)
        try:
            call = begun(store)
            store.settle(call.claim, 1, ev(call, "result"))
            assert kinds(store) == ["started", "result"]
            store.attach("w1")
            assert store.alive("w1") is True
        finally:
            store.close()


def test_postgres_liveness_follows_the_owner_session_across_processes(postgres_url: str) -> None:
    store = open_store(postgres_url)
    try:
        owner = f"other-host:4242:{uid('rt')}"
        assert store.alive(owner) is None  # never attached: the store cannot tell
        context = forked.CONTEXT
        ready = context.Event()
        holder = context.Process(target=store_workers.hold, args=(postgres_url, owner, ready))
        holder.start()
        try:
            assert ready.wait(60)
            assert store.alive(owner) is True
            assert store.alive(owner) is True  # asking does not take the lock away
            os.kill(holder.pid or 0, signal.SIGKILL)
            holder.join(10)
            deadline = time.monotonic() + 10
            while store.alive(owner) is not False and time.monotonic() < deadline:
                time.sleep(0.02)
            assert store.alive(owner) is False
        finally:
            if holder.is_alive():
                holder.kill()
        mine = f"this-host:{os.getpid()}:{uid('rt')}"
        store.attach(mine)
        assert store.alive(mine) is True
        second = open_store(postgres_url)
        try:
            with pytest.raises(StoreError, match="attached by another"):
                second.attach(mine)
            assert second.alive(mine) is True
            store.detach(mine)
            assert second.alive(mine) is None  # detached: not dead, unknown
            second.attach(mine)  # the owner may come back
            assert store.alive(mine) is True
        finally:
            second.close()
        assert store.alive(mine) is None  # close detaches
    finally:
        store.close()


def test_an_unreachable_server_is_one_line_with_the_password_masked() -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as error:
        open_store(f"postgresql://blade:s3cr3t-pw@127.0.0.1:{port}/blade")
    message = one_line(error, "s3cr3t-pw")
    assert message.startswith(f"postgresql://blade:***@127.0.0.1:{port}/blade: ")
    assert "refused" in message.lower()
    assert time.monotonic() - started < 10


def test_postgres_bad_credentials_are_one_line_without_the_password(postgres_url: str) -> None:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(postgres_url)
    wrong = urlunsplit(
        parts._replace(
            netloc=f"{parts.username}:not-the-pw-{uid('x')}@{parts.hostname}:{parts.port}"
        )
    )
    with pytest.raises(StoreUnavailable) as error:
        open_store(wrong)
    message = one_line(error, "not-the-pw-")
    assert "***" in message and "password authentication failed" in message
    assert parts.password is None or parts.password not in message


def test_postgres_a_newer_schema_version_is_refused_and_nothing_written(postgres_url: str) -> None:
    import psycopg

    open_store(postgres_url).close()
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute("UPDATE blade_schema_version SET version = 99")
        before = db.execute("SELECT count(*) FROM blade_events").fetchone()
    with pytest.raises(StoreUnavailable) as error:
        open_store(postgres_url)
    message = one_line(error, urlsplit_password(postgres_url))
    assert "schema version 99 is newer" in message and "***" in message
    with psycopg.connect(postgres_url, autocommit=True) as db:
        assert db.execute("SELECT version FROM blade_schema_version").fetchall() == [(99,)]
        assert db.execute("SELECT count(*) FROM blade_events").fetchone() == before


def test_a_runtime_whose_lock_session_ended_attaches_again_even_after_a_failed_try(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server ends an attached owner's lock session (pg_terminate_backend here; a restart
    does it to all): the owner's next renewal attaches it again, and one that fails to (the
    server still down) leaves it to be tried at the next, not forgotten for good."""
    import psycopg

    from blade_runtime.stores.postgres import PostgresStore, owner_key

    store, other = PostgresStore(postgres_url), PostgresStore(postgres_url)
    owner = "host-a:1:cut"
    store.attach(owner)
    assert other.alive(owner) is True
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
            "AND objid = (%s::bigint & 4294967295)::oid",
            (owner_key(owner),),
        )
    # pg_terminate_backend only signals the session: it ends (and its lock goes) a moment later
    deadline = time.monotonic() + 30
    while other.alive(owner) is not False:  # the session is gone: it reads as dead until...
        assert time.monotonic() < deadline, "the terminated session still holds its lock"
        time.sleep(0.02)
    failing = {"left": 1}
    connect = store._connect

    def flaky() -> Any:
        if failing["left"]:
            failing["left"] -= 1
            raise psycopg.OperationalError("the server is still starting")
        return connect()

    monkeypatch.setattr(store, "_connect", flaky)
    with pytest.raises(StoreUnavailable):
        store.renew(owner, 5.0)  # the first try fails
    assert store.renew(owner, 5.0) == set()  # the next attaches it again
    assert other.alive(owner) is True
    store.detach(owner)
    store.close()
    other.close()


@contextlib.contextmanager
def workers_role(postgres_url: str) -> Iterator[str]:
    """A new login role that owns nothing (as workers run), as the URL of ``postgres_url``'s
    database for it; its grants and the role are dropped afterwards."""
    from urllib.parse import quote, urlsplit, urlunsplit

    import psycopg
    from psycopg.sql import SQL, Identifier, Literal

    role, password = uid("blade_app").replace("-", "_"), uid("pw")
    where = urlsplit(postgres_url)
    netloc = f"{role}:{quote(password)}@{where.hostname}:{where.port}"
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute(
            SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(Identifier(role), Literal(password))
        )
    try:
        yield urlunsplit(where._replace(netloc=netloc))
    finally:  # its grants go first (roles are server-wide, grants per database)
        with psycopg.connect(postgres_url, autocommit=True) as db:
            db.execute(SQL("DROP OWNED BY {}").format(Identifier(role)))
            db.execute(SQL("DROP ROLE {}").format(Identifier(role)))


def grant_rows(postgres_url: str, role_url: str) -> None:
    """Grant the role of ``role_url`` the rows of every table there is now (not DDL)."""
    from urllib.parse import urlsplit

    import psycopg
    from psycopg.sql import SQL, Identifier

    role = Identifier(urlsplit(role_url).username or "")
    with psycopg.connect(postgres_url, autocommit=True) as db:
        for grant in (
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}",
            "GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {}",
        ):
            db.execute(SQL(grant).format(role))


def started(run: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``run()`` on a thread of its own, started; the list its result is put in."""
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(run()))
    thread.start()
    return thread, results


def urlsplit_password(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).password or "\0"


async def seconds_until_events(store: Store, run_id: str, limit_s: float = 15) -> float:
    """How long until ``store`` has events of ``run_id``, looking each time ``changed`` wakes
    (or its 5 s wait ends)."""
    begin = time.monotonic()
    while True:
        mark = store.mark()
        if store.events(run_id):
            return time.monotonic() - begin
        assert time.monotonic() - begin < limit_s
        await store.changed(5.0, mark)


def test_postgres_a_listening_store_closes_without_waiting_out_its_listener(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener waits for notifications seconds at a time, so that an idle store costs no
    CPU; close() wakes it with a NOTIFY of its own instead of waiting that out."""
    from blade_runtime.stores import postgres

    monkeypatch.setattr(postgres, "LISTEN_WAIT_S", 120.0)
    store = open_store(postgres_url)
    store.head()  # it listens from its first read of events on
    listener = store._listener  # type: ignore[attr-defined]
    assert listener is not None and store._listening.wait(30)  # type: ignore[attr-defined]
    started = time.monotonic()
    store.close()
    assert not listener.is_alive()
    assert time.monotonic() - started < 60  # far under the listener's 120 s wait
