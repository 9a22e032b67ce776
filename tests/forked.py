"""Worker processes for the multi-process tests, forked from a server that imported the runtime
once (multiprocessing's forkserver, with preloading).

Each is a real process of its own: its own pid, store connections, leases and event loop, killed
by SIGKILL or stopped by SIGSTOP like any other. What it does not do is start an interpreter and
import blade_runtime and pydantic again: that was about 0.6 s of CPU per worker, most of the CPU
of tests/test_workers.py (some 70 workers). It inherits what the server had when it started:
those imports and the environment variables of that moment (a test's later ``setenv`` does not
reach it); it gets the ``sys.path`` and working directory of the test that starts it. The server
starts no store, loop or thread. A failure before the process's output is redirected
(unpickling its function) is printed on the server's stderr, not in the process's file.

``start(folder, function, *args)`` runs ``function(*args)`` in such a process, its stdout and
stderr in files in ``folder``, and returns a handle with the parts of ``subprocess.Popen`` that
the tests use.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# What the server imports once (multiprocessing skips a module that fails to import, so
# test_workers checks that each of these imports).
PRELOAD = [
    "blade_runtime",
    "blade_runtime.runtime",
    "blade_runtime.stores.urls",
    "blade_runtime.stores.sqlite",
    "blade_runtime.stores.postgres",
    "process_worker",
    "store_workers",
]
# Also for tests that start multiprocessing's processes, queues and barriers themselves.
CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(PRELOAD)


def _main(function: Callable[..., Any], args: tuple[Any, ...], out: str, err: str) -> None:
    """In the new process: its output to its own files (the server's descriptors are whatever
    the test that started it had), then the work."""
    for path, fd in ((out, 1), (err, 2)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    try:
        function(*args)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


class Forked:
    """A running worker: ``pid``, ``poll()``, ``communicate(timeout)``, ``returncode``,
    ``kill()``, as on ``subprocess.Popen`` (a signal's death is its negative number)."""

    def __init__(self, folder: Path, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._folder = Path(tempfile.mkdtemp(prefix="forked-", dir=folder))
        self._out, self._err = self._folder / "stdout", self._folder / "stderr"
        self._process = CONTEXT.Process(
            target=_main, args=(function, args, str(self._out), str(self._err)), daemon=True
        )
        self._process.start()
        self.args = (function.__qualname__, *args)

    @property
    def pid(self) -> int:
        pid = self._process.pid
        assert pid is not None
        return pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the end (``subprocess.TimeoutExpired`` after ``timeout``); its output."""
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(str(self.args), timeout or 0.0)
        found = [
            path.read_text("utf-8", "replace") if path.exists() else ""
            for path in (self._out, self._err)
        ]
        return found[0], found[1]


def start(folder: Path, function: Callable[..., Any], *args: Any) -> Forked:
    """``function(*args)`` in a new process, its output kept in a new folder in ``folder``."""
    return Forked(folder, function, args)
