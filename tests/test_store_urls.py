"""Stores from URLs on the operators' command line: bad input is one line, exit 3, nothing made."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import pytest

from blade_runtime.cli import EXIT_STORE, main
from blade_runtime.urls import masked, open_store, sqlite_path


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
    ],
    ids=["unknown-scheme", "unreachable-server", "malformed-sqlite"],
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


def test_url_forms() -> None:
    assert masked("postgresql://a:secret@h:5/db") == "postgresql://a:***@h:5/db"
    assert masked("postgresql://h/db") == "postgresql://h/db"
    assert sqlite_path("sqlite:////abs/x.db") == Path("/abs/x.db")
    assert sqlite_path("sqlite:///rel/x.db") == Path("rel/x.db")
    assert sqlite_path("plain.db") == Path("plain.db")
    assert sqlite_path("postgresql://h/db") is None
    assert open_store("memory:").durable is False
