"""Defaults from ``[tool.blade-codegen]`` in the nearest ``pyproject.toml``."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SPECS = "specs"
DEFAULT_OUT = "generated"
DEFAULT_PACKAGE = "blade_specs"


@dataclass(frozen=True)
class Settings:
    specs: Path
    out: Path
    package: str
    source: Path | None  # the pyproject.toml the settings came from


class ConfigError(Exception):
    pass


def find_pyproject(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def settings(start: Path) -> Settings:
    """Settings for a build started in ``start``; paths in pyproject.toml are relative to it."""
    pyproject = find_pyproject(start)
    table: dict[str, object] = {}
    base = start
    if pyproject is not None:
        try:
            data = tomllib.loads(pyproject.read_text("utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
            raise ConfigError(f"{pyproject}: cannot read: {error}") from None
        found = data.get("tool", {}).get("blade-codegen", {})
        if not isinstance(found, dict):
            raise ConfigError(f"{pyproject}: [tool.blade-codegen] must be a table")
        table, base = found, pyproject.parent
    values = {}
    for key, default in (
        ("specs", DEFAULT_SPECS),
        ("out", DEFAULT_OUT),
        ("package", DEFAULT_PACKAGE),
    ):
        value = table.get(key, default)
        if not isinstance(value, str):
            raise ConfigError(f"{pyproject}: [tool.blade-codegen] {key} must be a string")
        values[key] = value
    return Settings(
        specs=base / values["specs"],
        out=base / values["out"],
        package=values["package"],
        source=pyproject if table else None,
    )
