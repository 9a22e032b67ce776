"""Stage 7, write: replace the output package in one step, or leave it as it was.

The new package is written to a staging folder beside the old one, then swapped in with two
renames. A build that fails before the swap leaves the old output untouched; a crash between the two
renames is repaired by the next build (``recover``). Nothing is written outside the output folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

STATE_FILE = ".blade-build.json"


def write_file(path: Path, text: str) -> None:
    """Replace one file in one step (a staging file beside it, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text, "utf-8")
    os.replace(staging, path)


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


def on_disk(target: Path) -> dict[str, str]:
    """Every file under ``target`` (package-relative POSIX path -> text), caches excluded."""
    found: dict[str, str] = {}
    if not target.is_dir():
        return found
    for path in sorted(target.rglob("*")):
        rel = path.relative_to(target)
        if path.is_file() and "__pycache__" not in rel.parts:
            try:
                found[rel.as_posix()] = path.read_text("utf-8")
            except (OSError, UnicodeDecodeError):
                found[rel.as_posix()] = "\0unreadable"
    return found


def write_package(
    target: Path, files: Mapping[str, str], unchanged: AbstractSet[str] = frozenset()
) -> None:
    """Make ``target`` hold exactly ``files``, atomically as seen by the next build.

    Files in ``unchanged`` are already in ``target`` with the same text: they are hard-linked into
    the staging folder instead of written again (the old folder is then removed, so the link is
    the only name left).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    recover(target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
    root = staging.resolve()
    try:
        for rel, text in sorted(files.items()):
            path = staging / rel
            if not path.resolve().is_relative_to(root):
                raise ValueError(f"refusing to write outside the output folder: {rel}")
            path.parent.mkdir(parents=True, exist_ok=True)
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
