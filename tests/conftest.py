"""Shared helpers: build spec trees into temporary folders and type-check the result."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_SPECS = ROOT / "specs"


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), "utf-8")
    return path


def spec(spec_id: str, **overrides: Any) -> dict[str, Any]:
    """A minimal valid spec with ``overrides`` applied (None removes a key)."""
    name = spec_id.split(".")[-2].replace("-", "_")
    data: dict[str, Any] = {
        "id": spec_id,
        "name": name,
        "description": "A test tool.",
        "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
    for key, value in overrides.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def add_spec(root: Path, data: dict[str, Any]) -> Path:
    rel = data["id"].replace(".", "/", 1) + ".json"
    return write_json(root / rel, data)


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def run_mypy(*paths: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", *map(str, paths)],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def run_ruff(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def example_specs(tmp_path: Path) -> Path:
    """A private copy of the bundled example specs."""
    target = tmp_path / "specs"
    shutil.copytree(EXAMPLE_SPECS, target)
    return target


@pytest.fixture(scope="session")
def built_examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example package built once for the session: returns the output folder (OUT)."""
    from blade_codegen.build import build

    out = tmp_path_factory.mktemp("out")
    build(EXAMPLE_SPECS, out, "blade_specs")
    return out


BuildFn = Callable[..., Any]
