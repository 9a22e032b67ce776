"""The command line refuses bad inputs before writing anything: names a new spec would take;
and what it writes gets the modes the user's umask gives."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import add_spec, run_cli, spec, tree_bytes, write_json


@pytest.fixture
def specs(tmp_path: Path) -> Path:
    folder = tmp_path / "specs"
    add_spec(folder, spec("crm.find-order.v1"))
    return folder


def test_new_refuses_a_spec_whose_names_collide_with_an_existing_one(specs: Path) -> None:
    before = tree_bytes(specs)
    # Its id and name differ from crm.find-order.v1's; its module and client method do not.
    done = run_cli("new", "crm.Find-Order.v1", "--specs", str(specs))
    assert done.returncode == 3, (done.stdout, done.stderr)
    module, method, last = done.stderr.splitlines()
    new = str(specs / "crm" / "Find-Order.v1.json")
    assert module.startswith(f"{new}:1:1: /: its module blade_specs.crm.find_order_v1 is also ")
    assert module.endswith(
        "the module of crm/find-order.v1.json (names that differ only in "
        "punctuation or case collide; rename one)"
    )
    assert method.startswith(f"{new}:") and "that of crm.find-order.v1" in method
    assert last == "error: nothing was written"
    assert tree_bytes(specs) == before


def test_new_beside_unrelated_specs_still_writes(specs: Path) -> None:
    done = run_cli("new", "crm.cancel-order.v1", "--specs", str(specs))
    assert done.returncode == 0, done.stderr
    assert run_cli("build", str(specs), "--out", str(specs.parent / "out")).returncode == 0


def test_import_refuses_a_tool_whose_module_collides_with_an_existing_spec(
    tmp_path: Path,
) -> None:
    specs = tmp_path / "specs"
    add_spec(specs, spec("crm.find_order.v1"))
    before = tree_bytes(specs)
    tools = write_json(
        tmp_path / "tools.json",
        {"tools": [{"name": "findOrder", "inputSchema": {"type": "object"}}]},
    )
    done = run_cli("import", "--from", "mcp", str(tools), "--namespace", "crm", "--out", str(specs))
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert f"{specs / 'crm' / 'find-order.v1.json'}:1:1: /: its module " in done.stderr
    assert "is also the module of crm/find_order.v1.json" in done.stderr
    assert tree_bytes(specs) == before


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
