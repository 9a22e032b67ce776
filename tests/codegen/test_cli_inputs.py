"""The command line refuses bad inputs before writing anything: package names, namespaces, an
output folder overlapping the spec folder, empty spec folders, names a new spec would take; and
what it writes gets the modes the user's umask gives."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("name", ["a.b", "blade-specs", "1st", "class", "a.class", ""])
def test_a_package_name_that_is_not_one_identifier_is_a_usage_error(
    tmp_path: Path, specs: Path, name: str
) -> None:
    out = tmp_path / "out"
    for args in (
        ("build", str(specs), "--out", str(out), "--package", name),
        ("stub", "crm.find-order.v1", "--specs", str(specs), "--package", name),
        ("init", "--package", name),
    ):
        done = run_cli(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "is not a Python package name" in done.stderr
    assert not out.exists() and not (tmp_path / "find_order_v1.py").exists()
    assert not (tmp_path / "pyproject.toml").exists()


@pytest.mark.parametrize(
    ("spec_folder", "out", "package", "message"),
    [
        ("specs", "specs", "blade_specs", "would be inside the spec folder"),
        ("specs", "specs/crm/gen", "blade_specs", "would be inside the spec folder"),
        ("specs", ".", "specs", "would be the spec folder"),
        ("specs/crm", ".", "specs", "would replace the spec folder"),
    ],
)
def test_an_output_overlapping_the_spec_folder_is_refused_before_anything_is_written(
    tmp_path: Path, specs: Path, spec_folder: str, out: str, package: str, message: str
) -> None:
    before = tree_bytes(tmp_path)
    for extra in ((), ("--check",), ("--watch",)):
        args = ("build", spec_folder, "--out", out, "--package", package, *extra)
        done = run_cli(*args, cwd=tmp_path)
        assert done.returncode == 2, (extra, done.stdout, done.stderr)
        [error] = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
        assert message in error and "pick" in error
    assert tree_bytes(tmp_path) == before


def test_an_output_beside_the_specs_in_the_same_folder_builds(tmp_path: Path, specs: Path) -> None:
    # OUT holds the spec folder, but the package the build replaces (OUT/PACKAGE) does not.
    done = run_cli("build", str(specs), "--out", str(tmp_path), "--package", "gen")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "gen" / "manifest.json").is_file()
    assert tree_bytes(specs) == {
        "crm/find-order.v1.json": (specs / "crm/find-order.v1.json").read_bytes()
    }


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


def test_an_empty_spec_folder_is_refused_by_every_command_that_reads_it(tmp_path: Path) -> None:
    empty = tmp_path / "specs"
    write_json(empty / "common" / "money.schema.json", {"type": "object"})  # shared files only
    lock = write_json(tmp_path / "blade.lock.json", {"lockVersion": 1, "specs": {}, "waivers": []})
    elsewhere = tmp_path / "l.json"
    before = tree_bytes(tmp_path)
    for args in (
        ("lock", str(empty), "--lock", str(elsewhere), "--init"),
        ("lock", str(empty)),
        ("check", str(empty)),
        ("check", str(empty), "--format", "json"),
        ("export", str(empty)),
        ("export", str(empty), "--out", str(tmp_path / "tools.json")),
    ):
        done = run_cli(*args)
        assert done.returncode == 3, (args, done.stdout, done.stderr)
        assert done.stdout == ""
        [line] = done.stderr.splitlines()
        assert line.startswith(f"error: {empty}: no spec files"), line
    assert tree_bytes(tmp_path) == before and json.loads(lock.read_text("utf-8"))["specs"] == {}


@pytest.mark.parametrize("namespace", ["bad ns", "Crm", "crm..orders", "", "crm/orders"])
def test_import_with_a_bad_namespace_is_a_usage_error(tmp_path: Path, namespace: str) -> None:
    tools = write_json(
        tmp_path / "tools.json",
        {"tools": [{"name": "find", "inputSchema": {"type": "object"}}]},
    )
    out = tmp_path / "specs"
    done = run_cli(
        "import", "--from", "mcp", str(tools), "--namespace", namespace, "--out", str(out)
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"--namespace {namespace!r}: use lowercase words and dots" in done.stderr
    assert not out.exists()
