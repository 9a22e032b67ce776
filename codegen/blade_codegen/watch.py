"""``blade-codegen build --watch``: build again whenever the spec tree (or the lock) changes.

The tree is polled with the standard library: every ``interval`` seconds each file's size and
modification time are read. A spec tree is small (the 312-tool MCP corpus is one stat a file, a
few milliseconds a poll), so polling costs nothing noticeable, needs no watcher dependency
(watchfiles would bring a compiled extension for this one feature), and behaves the same on every
platform and on mounted or container file systems where change events do not arrive. A change is
built once the tree has stopped changing for ``settle`` seconds, so an editor's save in several
writes gives one build.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

Snapshot = dict[str, tuple[int, int]]


def snapshot(roots: Iterable[Path]) -> Snapshot:
    """Size and mtime (ns) of every file under ``roots`` (a root may be a file, or missing);
    hidden folders are skipped, as the build skips them."""
    found: Snapshot = {}
    for root in roots:
        paths = [root] if root.is_file() else root.rglob("*") if root.is_dir() else []
        for path in paths:
            if any(part.startswith(".") for part in path.relative_to(root).parts):
                continue
            try:
                stat = path.stat()
            except OSError:
                continue  # removed while listing: the next poll sees it gone
            if path.is_file():
                found[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return found


def watch(
    roots: list[Path],
    rebuild: Callable[[], None],
    *,
    interval: float = 0.5,
    settle: float = 0.2,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Run ``rebuild`` now and after every change under ``roots``, until ``stop()`` is true (or
    KeyboardInterrupt). Each snapshot is taken before the build it starts, so a change made
    while a build runs starts another one."""
    seen = snapshot(roots)
    rebuild()
    while not stop():
        time.sleep(interval)
        now = snapshot(roots)
        if now == seen:
            continue
        while True:  # wait for the writes to end
            time.sleep(settle)
            again = snapshot(roots)
            if again == now:
                break
            now = again
        seen = now
        rebuild()
