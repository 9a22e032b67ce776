"""What the command line writes gets the modes the user's umask gives."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import add_spec, run_cli, spec


@pytest.fixture
def specs(tmp_path: Path) -> Path:
    folder = tmp_path / "specs"
    add_spec(folder, spec("crm.find-order.v1"))
    return folder


@pytest.fixture
def umask() -> Iterator[int]:
    mask = 0o027  # not the common 022: the modes must follow it, not happen to match
    before = os.umask(mask)
    try:
        yield mask
    finally:
        os.umask(before)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_what_is_written_gets_the_modes_the_umask_gives(
    tmp_path: Path, specs: Path, umask: int
) -> None:
    out = tmp_path / "out"
    assert run_cli("build", str(specs), "--out", str(out)).returncode == 0
    package = out / "blade_specs"
    folders = [package, *(p for p in package.rglob("*") if p.is_dir())]
    files = [p for p in package.rglob("*") if p.is_file()]
    assert folders and files
    assert {p.relative_to(out): _mode(p) for p in folders} == {
        p.relative_to(out): 0o777 & ~umask for p in folders
    }
    assert {p.relative_to(out): _mode(p) for p in files} == {
        p.relative_to(out): 0o666 & ~umask for p in files
    }
    # A rebuild that changed one spec swaps in a new folder too.
    add_spec(specs, spec("crm.cancel-order.v1"))
    assert run_cli("build", str(specs), "--out", str(out)).returncode == 0
    assert _mode(package) == 0o777 & ~umask
    assert run_cli("new", "crm.ship-order.v1", "--specs", str(specs)).returncode == 0
    assert _mode(specs / "crm" / "ship-order.v1.json") == 0o666 & ~umask
    stub = tmp_path / "stub.py"
    done = run_cli("stub", "crm.find-order.v1", "--specs", str(specs), "--out", str(stub))
    assert done.returncode == 0, done.stderr
    assert _mode(stub) == 0o666 & ~umask
