"""`blade-codegen build --watch`: a build on start and after every change, problems as they
appear, and the previous output kept when a build fails."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import EXAMPLE_SPECS, run_cli

from blade_codegen.watch import snapshot

BIN = Path(sys.executable).parent


def test_snapshot_sees_edits_additions_and_removals(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "index").write_text("x")
    first = snapshot([tmp_path, tmp_path / "missing.lock"])
    assert list(first) == [str(tmp_path / "a.json")]  # hidden folders are not watched
    (tmp_path / "a.json").write_text('{"a": 1}')
    second = snapshot([tmp_path])
    assert second != first
    (tmp_path / "b.json").write_text("{}")
    third = snapshot([tmp_path])
    assert set(third) == {str(tmp_path / "a.json"), str(tmp_path / "b.json")}
    (tmp_path / "b.json").unlink()
    assert snapshot([tmp_path]) == second


def _lines(stream: subprocess.Popen[str]) -> queue.Queue[str]:
    found: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert stream.stderr is not None
        for line in stream.stderr:
            found.put(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    return found


def _until(lines: queue.Queue[str], text: str, timeout: float = 60) -> list[str]:
    """The lines read up to the first one holding ``text``."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=deadline - time.monotonic())
        except queue.Empty:
            break
        seen.append(line)
        if text in line:
            return seen
    pytest.fail(f"no line with {text!r} within {timeout} s; read: {seen}")


def test_watch_rebuilds_on_change_and_prints_problems_as_they_appear(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    shutil.copytree(EXAMPLE_SPECS, specs)
    out = tmp_path / "out"
    process = subprocess.Popen(
        [str(BIN / "blade-codegen"), "build", str(specs), "--out", str(out), "--watch"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = _lines(process)
        _until(lines, "watching")
        module = out / "blade_specs" / "crm" / "lookup_customer_v1.py"
        assert module.is_file()
        built = module.read_text()
        path = specs / "crm" / "lookup-customer.v1.json"
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "kind": "sometimes"}))
        seen = _until(lines, "watching")
        assert any(line.startswith("crm/lookup-customer.v1.json:") for line in seen), seen
        assert any("/kind:" in line for line in seen) and any(
            "nothing was written" in s for s in seen
        )
        assert module.read_text() == built  # a failed build keeps the previous output
        path.write_text(json.dumps({**data, "description": "Find one customer, by id."}))
        _until(lines, "watching")
        assert "Find one customer, by id." in module.read_text()
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_watch_and_check_are_exclusive(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLE_SPECS, tmp_path / "specs")
    done = run_cli("build", str(tmp_path / "specs"), "--watch", "--check")
    assert done.returncode == 2 and "pick one" in done.stderr
