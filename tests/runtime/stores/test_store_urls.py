"""Stores from URLs on the operators' command line: bad input is one line, exit 3, nothing made."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blade_runtime.core.store import StoreUnavailable
from blade_runtime.serving.cli import EXIT_STORE, main
from blade_runtime.stores.urls import masked, open_store, secrets_of, sqlite_path


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again when the block ends


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "url, said",
    [
        ("redis://user:hunter2@127.0.0.1/0", "unknown store scheme 'redis'"),
        ("postgresql://ops:hunter2@127.0.0.1:{port}/blade", "127.0.0.1"),
        ("sqlite:/relative.db", "sqlite:///relative/path.db"),
        ("postgresql://ops@127.0.0.1:{port}/blade?password=hunter2", "127.0.0.1"),
        ("postgresql://ops:hunter2@127.0.0.1:port/blade", "port"),
        ("postgresql://ops:hunter2@[::1/blade", "IPv6"),
        ("postgresql://ops:hunter2@127.0.0.1:{port},127.0.0.1:{port}/blade", "127.0.0.1"),
    ],
    ids=[
        "unknown-scheme",
        "unreachable-server",
        "malformed-sqlite",
        "password-in-query",
        "port-not-a-number",
        "unclosed-bracket",
        "two-hosts",
    ],
)
def test_a_bad_store_url_is_one_line_exit_3_with_the_password_masked(
    url: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = url.format(port=closed_port())  # here, not at collection: every worker collects
    assert main(["pending", "list", "--store", url]) == EXIT_STORE
    err = one_line(capsys)
    assert said in err and "hunter2" not in err


def test_a_missing_sqlite_file_is_refused_and_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo.db"
    assert main(["pending", "list", "--store", f"sqlite:///{missing}"]) == EXIT_STORE
    assert "no store there" in one_line(capsys)
    assert not missing.exists()


def test_a_file_that_is_not_a_store_is_refused_and_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.db"
    notes.write_text("not a database, just notes\n")
    assert main(["pending", "list", "--store", str(notes)]) == EXIT_STORE
    assert "not a blade-runtime store" in one_line(capsys)
    assert notes.read_text() == "not a database, just notes\n"


def test_a_store_of_a_newer_schema_is_refused_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "future.db"
    open_store(path).close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    assert main(["pending", "list", "--store", f"sqlite:///{path}"]) == EXIT_STORE
    assert "newer" in one_line(capsys)


@pytest.mark.parametrize(
    "url, shown",
    [
        ("postgresql://a:secret@h:5/db", "postgresql://a:***@h:5/db"),
        ("postgresql://h/db", "postgresql://h/db"),
        ("postgresql://a@h/db?password=secret", "postgresql://a@h/db?password=***"),
        (
            "postgresql://a@h/db?sslmode=require&sslpassword=s%40cret&application_name=x#f",
            "postgresql://a@h/db?sslmode=require&sslpassword=***&application_name=x#f",
        ),
        ("postgresql://a:secret@h1:1,h2:2/db", "postgresql://a:***@h1:1,h2:2/db"),
        ("postgresql://a:secret@h:port/db", "postgresql://a:***@h:port/db"),
        ("postgresql://a:secret@[::1/db", "postgresql://a:***@[::1/db"),
        ("postgresql://a:p@ss@h/db", "postgresql://a:***@ss@h/db"),  # libpq: password "p"
        ("postgresql://ann:se?cr#et@h/db?x=1", "postgresql://ann:***@h/db?x=1"),
        ("sqlite:///a.db", "sqlite:///a.db"),
        ("memory:", "memory:"),
    ],
)
def test_every_password_is_masked(url: str, shown: str) -> None:
    assert masked(url) == shown


@given(
    password=st.text(
        st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="@/?#&"),
        min_size=6,
    ),
    form=st.sampled_from(
        [
            "postgresql://ops:{q}@db.internal:5432/blade",
            "postgresql://ops@db.internal/blade?password={q}",
            "postgresql://ops:{q}@h1:1,h2:2/blade?sslmode=require",
            "postgresql://ops@h/blade?application_name=a&sslpassword={q}",
        ]
    ),
)
def test_no_password_survives_masking_in_either_spelling(password: str, form: str) -> None:
    quoted = quote(password, safe="")
    url = form.format(q=quoted)
    shown = masked(url)
    assert quoted not in shown and password not in shown.replace("***", "")
    assert password in secrets_of(url) and quoted in secrets_of(url)


@given(
    password=st.text(
        st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="@/"), min_size=6
    )
)
def test_a_password_written_raw_in_the_user_info_is_masked_as_libpq_reads_it(
    password: str,
) -> None:
    """libpq takes the user info up to the first @ before any /: a raw password may hold ?, #,
    : or & there (it once ended at ? or #, and such a password was shown whole)."""
    url = f"postgresql://ops:{password}@db.internal:5432/blade?sslmode=require"
    shown = masked(url)
    assert shown == "postgresql://ops:***@db.internal:5432/blade?sslmode=require"
    assert password in secrets_of(url)


def test_url_forms() -> None:
    assert sqlite_path("sqlite:////abs/x.db") == Path("/abs/x.db")
    assert sqlite_path("sqlite:///rel/x.db") == Path("rel/x.db")
    assert sqlite_path("plain.db") == Path("plain.db")
    assert sqlite_path("postgresql://h/db") is None
    assert open_store("memory:").durable is False


@pytest.mark.parametrize("content", ["other-app", "empty"])
def test_the_operators_cli_adds_nothing_to_a_database_a_runtime_did_not_make(
    content: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "theirs.db"
    if content == "other-app":
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE invoices (id integer PRIMARY KEY, total integer)")
            db.execute("INSERT INTO invoices (total) VALUES (1250)")
        db.close()
    else:
        path.touch()
    before = path.read_bytes()
    for verb in (["list"], ["show", "act_x"], ["cancel", "act_x"]):
        assert main(["pending", *verb, "--store", str(path)]) == EXIT_STORE
        assert "not a blade-runtime store" in one_line(capsys)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs.db"]  # no -wal, no -shm
    with pytest.raises(StoreUnavailable, match="not a blade-runtime store"):
        open_store(path, create=False)
    open_store(path).close()  # a runtime (create=True, the default) makes its tables there


def test_the_operators_cli_creates_no_table_on_postgresql(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import psycopg

    assert main(["pending", "list", "--store", postgres_url]) == EXIT_STORE
    assert "not a blade-runtime store" in one_line(capsys)
    with psycopg.connect(postgres_url) as db:
        tables = db.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
    assert tables == (0,)
    open_store(postgres_url).close()
    assert main(["pending", "list", "--store", postgres_url]) == 0


@pytest.mark.parametrize("port", ["99999", "-1", "http", "8o8o"])
def test_serve_refuses_a_port_that_is_not_one(
    port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "app:make", "--store", "memory:", "--allow-anonymous", "--port", port])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "is not a port" in err and "Traceback" not in err
