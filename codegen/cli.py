"""The ``blade-codegen`` command: a thin shell over functions the tests call directly.

Exit codes: 0 success; 1 output stale (``build --check``); 2 usage; 3 invalid specs;
4 the output could not be written.
"""

from __future__ import annotations

import json
import keyword
import sys
from pathlib import Path

import click
from blade_codegen import __version__
from blade_codegen.config import ConfigError, settings
from blade_codegen.problems import SpecError

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

    try:
        defaults = settings(Path.cwd())
    except ConfigError as error:
        raise click.UsageError(str(error)) from None
    specs = specs_dir or defaults.specs
    out = out or defaults.out
    package = package or defaults.package
    if not specs.is_dir():
        raise click.UsageError(
            f"no spec folder at {specs} (pass SPECS_DIR or set [tool.blade-codegen] specs)"
        )
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
        for problem in error.problems:
            click.echo(str(problem), err=True)
        files = len({p.path for p in error.problems})
        noun = "problem" if len(error.problems) == 1 else "problems"
        click.echo(
            f"{len(error.problems)} {noun} in {files} file(s); nothing was written", err=True
        )
        sys.exit(EXIT_INVALID)
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
