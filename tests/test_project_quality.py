"""The project's own code is held to what it generates: mypy --strict, ruff, black."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

SOURCES = ["codegen", "runtime", "tests", "bench"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_mypy_strict_on_the_installed_packages() -> None:
    result = run("mypy")  # [tool.mypy] in pyproject.toml: strict, blade_codegen and blade_runtime
    assert result.returncode == 0, result.stdout


def test_ruff_and_black() -> None:
    ruff = run("ruff", "check", "--no-cache", *SOURCES)
    assert ruff.returncode == 0, ruff.stdout
    black = run("black", "--check", "--quiet", *SOURCES)
    assert black.returncode == 0, black.stderr
