"""The ``blade-codegen`` command: a thin shell over functions the tests call directly.

Exit codes: 0 success; 1 output stale (``build --check``); 2 usage; 3 invalid specs;
4 the output could not be written.
"""

from __future__ import annotations

import json
import keyword
import os
import sys
from pathlib import Path
from typing import NoReturn

import click
from blade_codegen import __version__
from blade_codegen.config import ConfigError, Settings, settings
from blade_codegen.problems import SpecError
from blade_runtime.export import EXPORT_FORMATS, ExportFormat

EXIT_STALE = 1
EXIT_USAGE = 2
EXIT_INVALID = 3
EXIT_WRITE = 4


def _valid_package(name: str) -> bool:
    parts = name.split(".")
    return all(p.isidentifier() and not keyword.iskeyword(p) for p in parts)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="blade-codegen")
def main() -> None:
    """Compile tool spec files into typed Python: models, interfaces and a manifest.

    Exit codes: 0 success, 1 stale output (build --check), 2 usage, 3 invalid specs,
    4 output not writable.
    """


@main.command()
@click.argument("specs_dir", required=False, type=click.Path(path_type=Path, file_okay=False))
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), help="Output folder.")
@click.option("--package", help="Python package name of the generated code.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if the output is stale.")
def build(specs_dir: Path | None, out: Path | None, package: str | None, check: bool) -> None:
    """Build SPECS_DIR (default: [tool.blade-codegen] specs, else specs/) into OUT/PACKAGE."""
    from blade_codegen.build import build as run_build

    specs = _specs_dir(specs_dir)
    defaults = _settings()
    out = out or defaults.out
    package = package or defaults.package
    if not _valid_package(package):
        raise click.UsageError(
            f"--package {package!r} is not a Python package name (use e.g. blade_specs)"
        )
    progress = _Progress() if sys.stderr.isatty() else None
    try:
        result = run_build(
            specs, out, package, check=check, progress=progress.step if progress else lambda p: None
        )
    except SpecError as error:
        _report(error)
    except OSError as error:
        click.echo(f"error: cannot write {out}: {error.strerror or error}", err=True)
        sys.exit(EXIT_WRITE)
    finally:
        if progress:
            progress.done()
    if result.status == "stale":
        click.echo(f"{result.target} is stale; run `blade-codegen build`:", err=True)
        for path in result.differing:
            click.echo(f"  {path}", err=True)
        sys.exit(EXIT_STALE)
    if result.status == "unchanged":
        click.echo(f"{result.target} is up to date")
    else:
        click.echo(
            f"wrote {result.target}: {len(result.regenerated)} module(s) generated, "
            f"{len(result.differing)} file(s) changed"
        )


@main.command()
@click.argument("specs_dir", required=False, type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--format",
    "format_",
    type=click.Choice(EXPORT_FORMATS),
    default="blade",
    show_default=True,
    help="blade (our manifest), openai (function tools), anthropic (tools), mcp (tools/list).",
)
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), help="Write to this file.")
def export(specs_dir: Path | None, format_: ExportFormat, out: Path | None) -> None:
    """Print the model-facing tool list of SPECS_DIR, from the spec files alone.

    Names a provider refuses (OpenAI and Anthropic reject dots) are mapped to safe wire names;
    the mapping is listed on stderr.
    """
    from blade_codegen.export import export_specs

    specs = _specs_dir(specs_dir)
    try:
        exported = export_specs(specs, format_)
    except SpecError as error:
        _report(error)
    renamed = {n: w for n, w in exported.names.to_wire.items() if n != w}
    for name, wire in sorted(renamed.items()):
        click.echo(f"{format_} name for {name}: {wire}", err=True)
    text = json.dumps(exported.document, indent=2, ensure_ascii=False) + "\n"
    if out is None:
        click.echo(text, nl=False)
        return
    try:
        _write_atomically(out, text)
    except OSError as error:
        click.echo(f"error: cannot write {out}: {error.strerror or error}", err=True)
        sys.exit(EXIT_WRITE)


def _settings() -> Settings:
    try:
        return settings(Path.cwd())
    except ConfigError as error:
        raise click.UsageError(str(error)) from None


def _specs_dir(specs_dir: Path | None) -> Path:
    specs = specs_dir or _settings().specs
    if not specs.is_dir():
        raise click.UsageError(
            f"no spec folder at {specs} (pass SPECS_DIR or set [tool.blade-codegen] specs)"
        )
    return specs


def _report(error: SpecError) -> NoReturn:
    for problem in error.problems:
        click.echo(str(problem), err=True)
    files = len({p.path for p in error.problems})
    noun = "problem" if len(error.problems) == 1 else "problems"
    click.echo(f"{len(error.problems)} {noun} in {files} file(s); nothing was written", err=True)
    sys.exit(EXIT_INVALID)


def _write_atomically(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text, encoding="utf-8")
    os.replace(staging, path)


@main.command()
def schema() -> None:
    """Print the spec meta-schema (point a spec's "$schema" at it for editor validation)."""
    from blade_codegen.validate import meta_schema

    click.echo(json.dumps(meta_schema(), indent=2))


class _Progress:
    """One status line on a terminal while modules are generated."""

    def __init__(self) -> None:
        self.count = 0

    def step(self, path: str) -> None:
        self.count += 1
        click.echo(f"\r\033[Kgenerating {self.count}: {path}", err=True, nl=False)

    def done(self) -> None:
        if self.count:
            click.echo("\r\033[K", err=True, nl=False)
