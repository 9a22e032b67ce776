"""The format stage lays out a large build in forked worker processes, with the same result as
in one process, and only where forking is safe."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from blade_codegen import format as stage

# Where recording_layout notes the pid of each process that laid a file out (a forked worker
# inherits it with the module).
RECORD: list[Path] = []


def recording_layout(code: str) -> str:
    """black_layout, noting which process ran it (module level: the pool pickles it by name)."""
    with RECORD[0].open("a", encoding="utf-8") as record:
        record.write(f"{os.getpid()}\n")
    return REAL_LAYOUT(code)


REAL_LAYOUT = stage.black_layout


def module(i: int) -> str:
    """Unformatted code of varied size, with a literal longer than a line."""
    fields = "".join(f"    f{j} :int=  {j}\n" for j in range(i * 7 + 1))
    text = "x" * (120 + i)
    return f"class M{i}( object ) :\n{fields}\nLONG='{text}'\n"


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    RECORD[:] = [tmp_path / "pids"]
    monkeypatch.setattr(stage, "black_layout", recording_layout)
    monkeypatch.setattr(stage, "PARALLEL_LINES", 0)  # every build counts as large
    yield RECORD[0]
    RECORD.clear()


@pytest.fixture
def may_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test process may fork, whatever idle threads earlier tests left in it (anyio's
    worker threads outlive their test): whether a process may fork is tested on its own."""
    monkeypatch.setattr(stage, "_may_fork", lambda: True)


def pids(record: Path) -> set[int]:
    return {int(line) for line in record.read_text("utf-8").split()}


TEXTS = {f"t/m{i}_v1.py": module(i) for i in range(12)}


def test_a_large_build_is_laid_out_in_worker_processes_exactly_as_in_one(
    recorded: Path, may_fork: None
) -> None:
    alone = stage.laid_out(TEXTS, 1)
    assert pids(recorded) == {os.getpid()}
    recorded.unlink()
    shared = stage.laid_out(TEXTS, 2)
    assert shared == alone
    assert set(shared) == set(TEXTS)
    assert os.getpid() not in pids(recorded) and len(pids(recorded)) >= 1
    lines = [line for text in alone.values() for line in text.split("\n")]
    assert max(map(len, lines)) <= stage.LINE_LENGTH  # the long literals were wrapped
    assert alone == {path: REAL_LAYOUT(code) for path, code in TEXTS.items()}


def test_a_process_running_another_thread_never_forks(recorded: Path) -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        shared = stage.laid_out(TEXTS, 2)
    finally:
        stop.set()
        other.join()
    assert pids(recorded) == {os.getpid()}
    assert shared == {path: REAL_LAYOUT(code) for path, code in TEXTS.items()}


def test_a_fresh_process_may_fork_and_one_running_another_thread_may_not() -> None:
    fresh = subprocess.run(
        [sys.executable, "-c", "from blade_codegen.format import _may_fork; print(_may_fork())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert fresh.stdout.strip() == str(sys.platform != "darwin")
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not stage._may_fork()
    finally:
        stop.set()
        other.join()


def test_a_pool_that_cannot_start_leaves_the_work_to_this_process(
    recorded: Path, may_fork: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing

    asked: list[str] = []

    def no_semaphores(method: str) -> NoReturn:
        asked.append(method)
        raise OSError("no process semaphores on this platform")

    monkeypatch.setattr(multiprocessing, "get_context", no_semaphores)
    assert stage.laid_out(TEXTS, 2) == {path: REAL_LAYOUT(code) for path, code in TEXTS.items()}
    assert asked == ["fork"]
    assert pids(recorded) == {os.getpid()}
