"""What a ``$ref`` in a spec tree may point at, and where that is.

References stay inside the spec tree: ``#/...`` means the root of the schema slot that holds it;
a relative path names a shared ``*.schema.json`` file, with an optional pointer fragment.
``blade:DIST/PATH#/pointer`` names a shared file that the installed spec package ``DIST`` ships;
such files sit in the tree under ``@DIST/PATH``. Nothing is ever fetched.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from blade_codegen.load import SHARED_SUFFIX


@dataclass(frozen=True, slots=True)
class RefTarget:
    """``file`` is the shared file's path relative to the spec root, or "" for the same document."""

    file: str
    fragment: str  # a JSON pointer, "" for the document root


@dataclass(frozen=True, slots=True)
class RefError:
    message: str
    hint: str


PACKAGE_SCHEME = "blade"
DEPENDENCY = "@"  # rel paths of files shipped by an installed spec package start with "@DIST/"
_DIST = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def dependency_of(rel: str) -> str | None:
    """The spec package whose shipped file ``rel`` is, or None for the project's own files."""
    return rel[1:].partition("/")[0] if rel.startswith(DEPENDENCY) else None


def parse_ref(ref: str, from_file: str) -> RefTarget | RefError:
    """Where ``ref``, written in the file at ``from_file``, points."""
    parts = urlsplit(ref)
    if parts.scheme == PACKAGE_SCHEME:
        return _package_ref(ref, parts.path, unquote(parts.fragment))
    if parts.scheme or ref.startswith("//"):
        return RefError(
            f"reference {ref!r} names a URL: nothing is fetched",
            "copy the schema into a *.schema.json file of the spec tree and reference it by path",
        )
    fragment = unquote(parts.fragment)
    if fragment and not fragment.startswith("/"):
        return RefError(
            f"reference {ref!r} uses a plain-name fragment",
            "use a JSON pointer fragment such as #/$defs/Name",
        )
    if not parts.path:
        return RefTarget("", fragment)
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(from_file), unquote(parts.path)))
    if joined == ".." or joined.startswith("../") or joined.startswith("/"):
        return RefError(
            f"reference {ref!r} leaves the spec tree", "keep shared schemas inside the spec folder"
        )
    owner = dependency_of(from_file)
    if dependency_of(joined) != owner:
        where = "its spec package" if owner else "the spec tree"
        return RefError(
            f"reference {ref!r} leaves {where}",
            f"name a spec package's schema as {PACKAGE_SCHEME}:DIST/path{SHARED_SUFFIX}",
        )
    return _shared(ref, joined, fragment)


def _package_ref(ref: str, path: str, fragment: str) -> RefTarget | RefError:
    dist, _, inner = unquote(path).partition("/")
    example = f"{PACKAGE_SCHEME}:blade-tool-crm/common/money{SHARED_SUFFIX}#/$defs/Money"
    if not _DIST.fullmatch(dist) or not inner:
        return RefError(
            f"reference {ref!r} does not name a spec package and a file in it",
            f"write it as {example}",
        )
    if fragment and not fragment.startswith("/"):
        return RefError(
            f"reference {ref!r} uses a plain-name fragment",
            "use a JSON pointer fragment such as #/$defs/Name",
        )
    inner = posixpath.normpath(inner)
    if inner == ".." or inner.startswith("../") or inner.startswith("/"):
        return RefError(f"reference {ref!r} leaves the spec package {dist}", f"e.g. {example}")
    return _shared(ref, f"{DEPENDENCY}{dist}/{inner}", fragment)


def _shared(ref: str, joined: str, fragment: str) -> RefTarget | RefError:
    if not joined.endswith(SHARED_SUFFIX):
        return RefError(
            f"reference {ref!r} does not name a shared schema file",
            f"only files named *{SHARED_SUFFIX} can be referenced; move the schema into one",
        )
    return RefTarget(joined, fragment)
