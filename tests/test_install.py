"""The README's install into another project: both distributions as wheels (`pip wheel`'s
build), installed into a fresh virtual environment, then the quick start in an empty folder
with that environment's commands alone (no checkout on any path)."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from conftest import ROOT

from blade_codegen.pack import _build


def _isolated() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}


@pytest.mark.slow
def test_the_wheels_install_into_a_fresh_environment_and_run_the_quick_start(
    tmp_path: Path,
) -> None:
    wheels = [_build(ROOT / "runtime", "wheel", tmp_path), _build(ROOT, "wheel", tmp_path)]
    venv.create(tmp_path / "env", with_pip=False)
    bin_dir = tmp_path / "env" / "bin"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "--python", str(bin_dir / "python"), "install", *map(str, wheels)],
        check=True,
        capture_output=True,
    )
    project = tmp_path / "project"
    project.mkdir()
    for command in (["blade-codegen", "init"], ["blade-codegen", "build"]):
        done = subprocess.run(
            [str(bin_dir / command[0]), *command[1:]],
            cwd=project,
            env=_isolated(),
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, (command, done.stderr)
    ran = subprocess.run(
        [str(bin_dir / "python"), "quickstart.py"],
        cwd=project,
        env={**_isolated(), "PYTHONPATH": "generated"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1] == "{'greeting': 'Hello, Grace!', 'approved_by': 'you'}"
