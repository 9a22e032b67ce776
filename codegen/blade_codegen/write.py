"""Stage 7, write: replace the output package in one step, or leave it as it was.

The new package is written to a staging folder beside the old one, then swapped in with two
renames. A build that fails before the swap leaves the old output untouched; a crash between the two
renames is repaired by the next build (``recover``). Nothing is written outside the output folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

STATE_FILE = ".blade-build.json"
# What the build keeps from one run for the next that is not output lives beside the package,
# never in it: OUT/.blade-cache/PACKAGE.pickle, as disposable as bytecode (each entry is checked
# against its spec file's digest before it is used, so a stale or missing one costs a full build).
CACHE_FOLDER = ".blade-cache"
_CACHES = "__pycache__"


def cache_path(target: Path) -> Path:
    """Where the build of the package ``target`` keeps what it reuses next time."""
    return target.parent / CACHE_FOLDER / f"{target.name}.pickle"


def write_file(path: Path, text: str) -> None:
    """Replace one file in one step (a staging file beside it, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    try:
        staging.write_text(text, "utf-8")
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)  # a full disk leaves no half-written staging file
        raise


def new_folder(parent: Path, prefix: str) -> Path:
    """A folder ``parent/<prefix><random>`` that did not exist, with the mode the umask gives new
    folders: ``mkdtemp``'s 0700 would make the output unreadable to the accounts that import it."""
    while True:
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def new_file(parent: Path, prefix: str, suffix: str) -> tuple[int, Path]:
    """A file ``parent/<prefix><random><suffix>`` that did not exist, open for writing, with the
    mode the umask gives new files (``mkstemp``'s is 0600)."""
    while True:
        path = parent / f"{prefix}{secrets.token_hex(4)}{suffix}"
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), path
        except FileExistsError:
            continue


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _backup(target: Path) -> Path:
    return target.with_name(f".{target.name}.old")


def recover(target: Path) -> None:
    """Finish or undo a swap that a crash interrupted, and drop stale staging folders."""
    backup = _backup(target)
    if backup.exists():
        if target.exists():
            shutil.rmtree(backup)
        else:
            backup.rename(target)
    if target.parent.is_dir():
        for stale in target.parent.glob(f".{target.name}.staging-*"):
            shutil.rmtree(stale, ignore_errors=True)


def read_state(disk: Mapping[str, str]) -> dict[str, Any] | None:
    """The last build's record (``STATE_FILE``) from the output as read by ``on_disk``."""
    try:
        state = json.loads(disk.get(STATE_FILE, ""))
    except ValueError:
        return None
    return state if isinstance(state, dict) else None


def previous_modules(
    state: Mapping[str, Any] | None, disk: Mapping[str, str]
) -> dict[str, tuple[str, str]]:
    """What the last build generated: path -> (cache key, text). A file edited by hand since then
    no longer matches its recorded digest and is not reused."""
    keys = state.get("keys") if state else None
    digests = state.get("files") if state else None
    if not isinstance(keys, dict) or not isinstance(digests, dict):
        return {}
    return {
        path: (key, disk[path])
        for path, key in keys.items()
        if path in disk and digest(disk[path]) == digests.get(path)
    }


def state_text(
    files: Mapping[str, str], keys: Mapping[str, str], inputs: Mapping[str, str], version: str
) -> str:
    state = {
        "generator": version,
        "inputs": dict(sorted(inputs.items())),
        "keys": dict(sorted(keys.items())),
        "files": {path: digest(text) for path, text in sorted(files.items())},
    }
    return json.dumps(state, indent=1, sort_keys=True) + "\n"


def _files(folder: str, rel: str, found: list[str]) -> None:
    """POSIX paths (below ``rel``) of the files under ``folder``; links to folders are not
    followed, and ``__pycache__`` folders are left out."""
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name != _CACHES:
                    _files(entry.path, rel + entry.name + "/", found)
            elif entry.name != _CACHES and entry.is_file():
                found.append(rel + entry.name)


def on_disk(target: Path) -> dict[str, str]:
    """Every file under ``target`` (package-relative POSIX path -> text), caches excluded."""
    found: dict[str, str] = {}
    if not target.is_dir():
        return found
    paths: list[str] = []
    _files(str(target), "", paths)
    for rel in sorted(paths):
        try:
            found[rel] = (target / rel).read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            found[rel] = "\0unreadable"
    return found


def read_cache(target: Path) -> bytes | None:
    """What the last build of ``target`` left in its cache, if anything."""
    try:
        return cache_path(target).read_bytes()
    except OSError:
        return None


def write_cache(target: Path, cache: bytes) -> None:
    """Replace the cache of ``target`` in one step; a failure only costs the next build time."""
    path = cache_path(target)
    staging = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging.write_bytes(cache)
        os.replace(staging, path)
    except OSError:
        staging.unlink(missing_ok=True)


def _plain(rel: str) -> bool:
    """A relative path of plain names: below the staging folder whatever the file system does,
    since nothing in that new folder is a link. Anything else is resolved to be sure."""
    return all(
        part not in ("", ".", "..") and "\\" not in part and ":" not in part
        for part in rel.split("/")
    )


def write_package(
    target: Path,
    files: Mapping[str, str],
    unchanged: AbstractSet[str] = frozenset(),
    cache: bytes | None = None,
) -> None:
    """Make ``target`` hold exactly ``files``, atomically as seen by the next build.

    Files in ``unchanged`` are already in ``target`` with the same text: they are hard-linked into
    the staging folder instead of written again (the old folder is then removed, so the link is
    the only name left). ``cache`` goes beside the package (``cache_path``), not into it.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    recover(target)
    staging = new_folder(target.parent, f".{target.name}.staging-")
    root = staging.resolve()
    folders = {staging}
    try:
        for rel, text in sorted(files.items()):
            path = staging / rel
            if not _plain(rel) and not path.resolve().is_relative_to(root):
                raise ValueError(f"refusing to write outside the output folder: {rel}")
            if path.parent not in folders:
                path.parent.mkdir(parents=True, exist_ok=True)
                folders.add(path.parent)
            if rel in unchanged:
                try:
                    os.link(target / rel, path)
                    continue
                except OSError:
                    pass  # a file system without hard links: write it
            path.write_text(text, "utf-8")
        backup = _backup(target)
        if target.exists():
            target.rename(backup)
        staging.rename(target)
        if backup.exists():
            shutil.rmtree(backup)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        recover(target)
        raise
    if cache is not None:
        write_cache(target, cache)
