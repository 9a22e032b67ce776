"""What a ``$ref`` in a spec tree may point at, and where that is.

References stay inside the spec tree: ``#/...`` means the root of the schema slot that holds it;
a relative path names a shared ``*.schema.json`` file, with an optional pointer fragment.
Nothing is ever fetched.
"""

from __future__ import annotations

import posixpath
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


def parse_ref(ref: str, from_file: str) -> RefTarget | RefError:
    """Where ``ref``, written in the file at ``from_file``, points."""
    parts = urlsplit(ref)
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
    if not joined.endswith(SHARED_SUFFIX):
        return RefError(
            f"reference {ref!r} does not name a shared schema file",
            f"only files named *{SHARED_SUFFIX} can be referenced; move the schema into one",
        )
    return RefTarget(joined, fragment)
