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
from urllib.parse import unquote

from blade_runtime.core.store import Store, StoreUnavailable

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
SCHEMES = ("memory", "sqlite", "postgresql", "postgres")


# libpq's parameters that hold a secret, as a URL's query may carry them (``?password=...``).
_SECRET_PARAMETERS = frozenset({"password", "sslpassword"})
_SCHEME_SLASHES = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _parts(url: str) -> tuple[str, str | None, str, str | None, str]:
    """``url`` as (up to its user info, the user info or None, then up to its query, the
    query or None, the fragment), read as libpq reads it: the user info runs to the first
    ``@`` before any ``/`` (a password may hold ``?``, ``#`` or ``:``). Any text splits, even
    one urlsplit refuses and a driver's message quotes whole (an unclosed IPv6 bracket)."""
    scheme = _SCHEME_SLASHES.match(url)
    start = 0 if scheme is None else scheme.end()
    stop = next((i for i in range(start, len(url)) if url[i] in "@/"), len(url))
    head, user, rest = url[:start], None, url[start:]
    if scheme is not None and url[stop : stop + 1] == "@":
        user, rest = url[start:stop], url[stop:]
    rest, hashed, fragment = rest.partition("#")
    before, asked, query = rest.partition("?")
    return head, user, before, query if asked else None, hashed + fragment


def masked(url: str) -> str:
    """``url`` with every password replaced by ``***`` (the user info's, and a ``password`` or
    ``sslpassword`` query parameter's): safe for logs and messages, whatever its form (several
    hosts, a port that is not a number, a text that is not quite a URL)."""
    head, user, before, query, fragment = _parts(url)
    if user is not None and ":" in user:
        user = f"{user.partition(':')[0]}:***"
    if query:
        query = "&".join(
            f"{piece.partition('=')[0]}=***" if _is_secret(piece) else piece
            for piece in query.split("&")
        )
    shown_query = "" if query is None else f"?{query}"
    return f"{head}{'' if user is None else user}{before}{shown_query}{fragment}"


def secrets_of(url: str) -> list[str]:
    """The passwords ``url`` carries, as written and decoded (what a driver's message might
    repeat), longest first."""
    _, user, _, query, _ = _parts(url)
    found = [user.partition(":")[2]] if user is not None and ":" in user else []
    found += [piece.partition("=")[2] for piece in (query or "").split("&") if _is_secret(piece)]
    every = {text for value in found for text in (value, unquote(value)) if text}
    return sorted(every, key=lambda text: (-len(text), text))


def _is_secret(piece: str) -> bool:
    return unquote(piece.partition("=")[0]) in _SECRET_PARAMETERS


def sqlite_path(url: str | Path) -> Path | None:
    """The file a SQLite URL or plain path names (None: another kind of store)."""
    text = str(url)
    scheme = _SCHEME.match(text)
    if isinstance(url, Path) or scheme is None or len(scheme.group(1)) == 1:  # C:\\ on Windows
        return Path(text)
    if scheme.group(1).lower() == "sqlite" and text.startswith("sqlite:///"):
        return Path(text[len("sqlite:///") :])
    return None


def open_store(url: str | Path, *, create: bool = True) -> Store:
    """The store ``url`` names (see the module's doc for the forms it takes). ``create=False``
    opens only a store a runtime has made: a database without blade-runtime's tables (another
    application's, an empty file) is refused and left exactly as it was."""
    text = str(url)
    scheme = _SCHEME.match(text)
    if isinstance(url, Path) or scheme is None or len(scheme.group(1)) == 1:  # C:\\ on Windows
        return _sqlite(Path(text), text, create)
    name = scheme.group(1).lower()
    if name == "memory":
        from blade_runtime.stores.memory import MemoryStore

        return MemoryStore()
    if name == "sqlite":
        path = text[len("sqlite:") :]
        if not path.startswith("///"):
            raise StoreUnavailable(
                f"{masked(text)}: a SQLite URL is sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db"
            )
        return _sqlite(Path(path[3:]), text, create)
    if name in ("postgresql", "postgres"):
        try:
            from blade_runtime.stores.postgres import PostgresStore
        except ImportError as error:
            raise StoreUnavailable(
                f"{masked(text)}: the PostgreSQL store needs psycopg; "
                f"pip install 'blade-runtime[postgres]' ({error})"
            ) from None
        return PostgresStore(text, create=create)
    raise StoreUnavailable(
        f"{masked(text)}: unknown store scheme {name!r}; use one of "
        "memory:, sqlite:///PATH, postgresql://..., or a file path"
    )


def _sqlite(path: Path, url: str, create: bool) -> Store:
    from blade_runtime.stores.sqlite import SQLiteStore

    if path.is_dir():
        raise StoreUnavailable(f"{url}: is a folder; name a database file in it")
    if not path.parent.is_dir():
        raise StoreUnavailable(f"{url}: the folder {path.parent} does not exist")
    return SQLiteStore(path, create=create)
