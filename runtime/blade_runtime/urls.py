"""``open_store(url)``: one way to open any store, in code and on the command line.

    memory:                                   MemoryStore (this process only)
    sqlite:///relative/path.db                SQLiteStore (three slashes: a relative path)
    sqlite:////absolute/path.db               SQLiteStore (four: an absolute one)
    path/to/file.db                           SQLiteStore (a plain path)
    postgresql://user:password@host/db        PostgresStore (``blade-runtime[postgres]``)

Every failure is a ``StoreUnavailable`` whose one-line message names the URL with any password
masked, and says what to do.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from blade_runtime.store import Store, StoreUnavailable

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
SCHEMES = ("memory", "sqlite", "postgresql", "postgres")


def masked(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: safe for logs and messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def sqlite_path(url: str | Path) -> Path | None:
    """The file a SQLite URL or plain path names (None: another kind of store)."""
    text = str(url)
    scheme = _SCHEME.match(text)
    if isinstance(url, Path) or scheme is None or len(scheme.group(1)) == 1:  # C:\\ on Windows
        return Path(text)
    if scheme.group(1).lower() == "sqlite" and text.startswith("sqlite:///"):
        return Path(text[len("sqlite:///") :])
    return None


def open_store(url: str | Path) -> Store:
    """The store ``url`` names (see the module's doc for the forms it takes)."""
    text = str(url)
    scheme = _SCHEME.match(text)
    if isinstance(url, Path) or scheme is None or len(scheme.group(1)) == 1:  # C:\\ on Windows
        return _sqlite(Path(text), text)
    name = scheme.group(1).lower()
    if name == "memory":
        from blade_runtime.memory import MemoryStore

        return MemoryStore()
    if name == "sqlite":
        path = text[len("sqlite:") :]
        if not path.startswith("///"):
            raise StoreUnavailable(
                f"{masked(text)}: a SQLite URL is sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db"
            )
        return _sqlite(Path(path[3:]), text)
    if name in ("postgresql", "postgres"):
        try:
            from blade_runtime.postgres import PostgresStore
        except ImportError as error:
            raise StoreUnavailable(
                f"{masked(text)}: the PostgreSQL store needs psycopg; "
                f"pip install 'blade-runtime[postgres]' ({error})"
            ) from None
        return PostgresStore(text)
    raise StoreUnavailable(
        f"{masked(text)}: unknown store scheme {name!r}; use one of "
        "memory:, sqlite:///PATH, postgresql://..., or a file path"
    )


def _sqlite(path: Path, url: str) -> Store:
    from blade_runtime.sqlite import SQLiteStore

    if path.is_dir():
        raise StoreUnavailable(f"{url}: is a folder; name a database file in it")
    if not path.parent.is_dir():
        raise StoreUnavailable(f"{url}: the folder {path.parent} does not exist")
    return SQLiteStore(path)
