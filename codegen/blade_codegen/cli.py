"""The ``blade-codegen`` command: a thin shell over functions the tests call directly.

Exit codes: 0 success; 1 output stale (``build --check``) or breaking changes (``check``,
``lock``); 2 usage; 3 invalid specs; 4 the output could not be written; 5 ``build`` or ``pack``
refused because the specs break the lock.
"""

from __future__ import annotations

import contextlib
import gc
import json
import keyword
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NoReturn, cast

import click

from blade_codegen import __version__

if TYPE_CHECKING:
    from blade_codegen.check import Finding
    from blade_codegen.importer import Imported
    from blade_runtime.core.export import ExportFormat
from blade_codegen.config import ConfigError, Settings, settings
from blade_codegen.problems import SpecError

EXIT_STALE = 1
EXIT_USAGE = 2
EXIT_INVALID = 3
EXIT_WRITE = 4
EXIT_BREAKING = 5
LOCK_HELP = "The lock file.  [default: blade.lock.json beside SPECS_DIR]"
# blade_runtime.core.export.EXPORT_FORMATS, spelled out: importing blade_runtime (pydantic, asyncio)
# would add 0.1 s to every command's start-up. A test holds the two lists equal.
EXPORT_FORMATS = ("blade", "openai", "anthropic", "mcp")


def _valid_package(name: str) -> bool:
    # One identifier: OUT/PACKAGE is one folder, and the generated modules import themselves
    # as PACKAGE.<module>, so a dotted name would give a folder named "a.b" that nothing imports.
    return name.isidentifier() and not keyword.iskeyword(name)


class _Group(click.Group):
    """Each command's summary in the listing is its whole first sentence, never cut."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=1_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(
    cls=_Group,
    context_settings={
        "help_option_names": ["-h", "--help"],
        "show_default": True,
        "max_content_width": 100,
    },
)
@click.version_option(__version__, prog_name="blade-codegen")
def main() -> None:
    """Compile tool spec files into typed Python: models, interfaces and a manifest.

    Exit codes: 0 success, 1 stale output (build --check) or breaking changes (check, lock),
    2 usage, 3 invalid specs or unreadable baseline, 4 output not writable, 5 build or pack
    refused: the specs break the lock.
    """


@main.command()
@click.argument("specs_dir", required=False, type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    help="Output folder.  [default: [tool.blade-codegen] out, else generated/]",
)
@click.option(
    "--package",
    help="Python package name of the generated code.  "
    "[default: [tool.blade-codegen] package, else blade_specs]",
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if the output is stale.")
@click.option(
    "--lock", "lock_file", type=click.Path(path_type=Path, dir_okay=False), help=LOCK_HELP
)
@click.option("--allow-breaking", is_flag=True, help="Build even if specs break the lock.")
@click.option(
    "--watch",
    is_flag=True,
    help="Build now and again on every change of the specs or the lock, until Ctrl-C.",
)
def build(
    specs_dir: Path | None,
    out: Path | None,
    package: str | None,
    check: bool,
    lock_file: Path | None,
    allow_breaking: bool,
    watch: bool,
) -> None:
    """Build SPECS_DIR (default: [tool.blade-codegen] specs, else specs/) into OUT/PACKAGE.

    Where a lock exists, a spec that breaks its locked contract is refused (exit 5). A folder
    without spec files is refused (exit 3). With --watch, each build prints its problems or
    what it wrote, and a failed build keeps the previous output.
    """
    specs = _specs_dir(specs_dir)
    defaults = _settings()
    out = out or defaults.out
    package = defaults.package if package is None else package  # --package "" is refused
    if not _valid_package(package):
        raise click.UsageError(
            f"--package {package!r} is not a Python package name (use e.g. blade_specs)"
        )
    _separate(specs, out / package)
    if not watch:
        _build_once(specs, out, package, check, lock_file, allow_breaking)
        # The process ends here: the collection Python makes on the way out would scan every
        # object the build left (0.05 s after a 1,000-spec rebuild) to free nothing of worth.
        gc.freeze()
        return
    if check:
        raise click.UsageError("--watch writes the output; --check writes nothing: pick one")
    from blade_codegen.watch import watch as watch_tree

    def build_round() -> None:
        click.echo(f"[{time.strftime('%H:%M:%S')}] building {specs}", err=True)
        with contextlib.suppress(SystemExit):  # the round printed its outcome; watching goes on
            _build_once(specs, out, package, False, lock_file, allow_breaking)
        click.echo(f"watching {specs} for changes (Ctrl-C to stop)", err=True)

    try:
        watch_tree([specs, lock_file or default_lock(specs)], build_round)
    except KeyboardInterrupt:
        click.echo("stopped watching", err=True)


def _build_once(
    specs: Path,
    out: Path,
    package: str,
    check: bool,
    lock_file: Path | None,
    allow_breaking: bool,
) -> None:
    """One build as the command runs it: prints the outcome, exits non-zero on a failure."""
    from blade_codegen.build import BreakingChange
    from blade_codegen.build import build as run_build
    from blade_codegen.check import BaselineError
    from blade_codegen.models import ModelFailure

    _require_specs(specs)
    lock = _lock_path(lock_file, specs)
    progress = _Progress() if sys.stderr.isatty() else None
    try:
        result = run_build(
            specs,
            out,
            package,
            check=check,
            progress=progress.step if progress else lambda p: None,
            lock=None if allow_breaking else lock,
        )
    except SpecError as error:
        _report(error)
    except BaselineError as error:
        _fail(str(error), EXIT_INVALID)
    except ModelFailure as failure:
        _fail(f"{failure} (the model generator failed; nothing was written)", EXIT_INVALID)
    except BreakingChange as refused:
        _refuse_breaking(
            refused.report.breaking,
            " against the lock; nothing was generated (publish them under new ids, or pass "
            "--allow-breaking)",
            EXIT_BREAKING,
        )
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
    for spec_id, notes in sorted(result.looser.items()):
        failed = [n for n in notes if "the generator failed" in n]
        what = "typed loosely (the generator failed)" if failed else "looser than its JSON Schema"
        click.echo(
            f"note: {spec_id}: models {what} at {len(notes)} place(s), listed in its module's "
            "header; the runtime still validates the schema",
            err=True,
        )
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
    help="blade (our tool list; not manifest.json), openai (function tools), anthropic "
    "(tools), mcp (a tools/list result).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write to this file.  [default: standard output]",
)
def export(specs_dir: Path | None, format_: str, out: Path | None) -> None:
    """Print the model-facing tool list of SPECS_DIR, from the spec files alone.

    Names a provider refuses (OpenAI and Anthropic reject dots) are mapped to safe wire names;
    the mapping is listed on stderr.
    """
    from blade_codegen.export import export_specs

    specs = _specs_dir(specs_dir, need_specs=True)
    try:
        exported = export_specs(specs, cast("ExportFormat", format_))
    except SpecError as error:
        _report(error)
    renamed = {n: w for n, w in exported.names.to_wire.items() if n != w}
    for name, wire in sorted(renamed.items()):
        click.echo(f"{format_} name for {name}: {wire}", err=True)
    text = json.dumps(exported.document, indent=2, ensure_ascii=False) + "\n"
    if out is None:
        click.echo(text, nl=False)
        return
    _write_or_exit(out, text)


def _settings() -> Settings:
    try:
        return settings(Path.cwd())
    except ConfigError as error:
        raise click.UsageError(str(error)) from None


def _specs_dir(specs_dir: Path | None, need_specs: bool = False) -> Path:
    """The spec folder; with ``need_specs``, one holding no spec file is refused."""
    specs = specs_dir or _settings().specs
    if not specs.is_dir():
        raise click.UsageError(
            f"no spec folder at {specs} (pass SPECS_DIR or set [tool.blade-codegen] specs)"
        )
    if need_specs:
        _require_specs(specs)
    return specs


def _separate(specs: Path, target: Path) -> None:
    """The package folder a build replaces and the spec folder must not hold one another: the
    next build would read the output as specs, or the swap would remove the specs."""
    spec_root, package = specs.resolve(), target.resolve()
    if package.is_relative_to(spec_root):
        where = "the spec folder" if package == spec_root else "inside the spec folder"
        raise click.UsageError(
            f"the output {target} would be {where} {specs}, and read as specs "
            "(pick an --out outside the spec folder)"
        )
    if spec_root.is_relative_to(package):
        raise click.UsageError(
            f"the output {target} would replace the spec folder {specs}, which it holds "
            "(pick another --out or --package)"
        )


def _require_specs(specs: Path) -> None:
    """A folder holding no spec file is refused (exit 3): an empty package built without a word
    would hide a wrong path."""
    from blade_codegen.load import SHARED_SUFFIX, spec_paths

    if all(p.name.endswith(SHARED_SUFFIX) for p in spec_paths(specs)):
        _fail(
            f"{specs}: no spec files (*.json other than *.schema.json); nothing was written "
            "(write one with `blade-codegen new ID`, or pass the right SPECS_DIR)",
            EXIT_INVALID,
        )


def _lock_path(lock_file: Path | None, specs: Path, *, required: bool = False) -> Path:
    """The lock: ``--lock FILE`` (which must exist: a misspelled name must not check nothing),
    else blade.lock.json beside SPECS_DIR (which must exist too when ``required``)."""
    path = lock_file or default_lock(specs)
    if (lock_file is not None or required) and not path.is_file():
        _fail(
            f"no lock file at {path}: nothing released to compare with (record the first "
            f"release with `blade-codegen lock{'' if lock_file is None else ' --lock FILE --init'}`"
            ", or fix the path)",
            EXIT_INVALID,
        )
    return path


def _report(error: SpecError) -> NoReturn:
    for problem in error.problems:
        click.echo(str(problem), err=True)
    files = len({p.path for p in error.problems})
    noun = "problem" if len(error.problems) == 1 else "problems"
    click.echo(f"{len(error.problems)} {noun} in {files} file(s); nothing was written", err=True)
    sys.exit(EXIT_INVALID)


def _write_or_exit(path: Path, text: str) -> None:
    from blade_codegen.write import write_file

    try:
        write_file(path, text)
    except OSError as error:
        _fail(f"cannot write {path}: {error.strerror or error}", EXIT_WRITE)


def _refuse_breaking(findings: list[Finding], outcome: str, code: int) -> NoReturn:
    """Each breaking finding on its own line, then how many and what was refused."""
    for finding in findings:
        click.echo(finding.message(), err=True)
    click.echo(f"{len(findings)} breaking change(s){outcome}", err=True)
    sys.exit(code)


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def default_lock(specs: Path) -> Path:
    from blade_codegen.check import LOCK_NAME

    return specs.resolve().parent / LOCK_NAME


@main.command()
@click.argument("specs_dir", required=False, type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--against",
    default="lock",
    show_default=True,
    help="The baseline: the lock file, or git:REF for the specs at a git revision.",
)
@click.option(
    "--lock", "lock_file", type=click.Path(path_type=Path, dir_okay=False), help=LOCK_HELP
)
@click.option(
    "--format",
    "format_",
    type=click.Choice(["text", "json"]),
    default="text",
    help="text: one line per finding; json: one document for machines.",
)
def check(specs_dir: Path | None, against: str, lock_file: Path | None, format_: str) -> None:
    """Report every change that breaks a released contract (exit 1), or none (exit 0).

    What a tool accepts (input, resume payloads) must keep accepting old values; what it emits
    (output, data records, suspend payloads) must not produce values old clients reject.
    """
    from blade_codegen.check import BaselineError, git_baseline, git_ref_allowed, read_lock
    from blade_codegen.check import check as run_check
    from blade_codegen.resolve import resolve_specs

    specs = _specs_dir(specs_dir, need_specs=True)
    ref = against.removeprefix("git:")
    if against != "lock" and (ref == against or not git_ref_allowed(ref)):
        raise click.UsageError(f"--against {against!r}: use lock or git:REF")
    try:
        resolved = resolve_specs(specs)
        if against == "lock":
            baseline = read_lock(_lock_path(lock_file, specs, required=True))
        else:
            baseline = git_baseline(specs, ref)
    except SpecError as error:
        _report(error)
    except BaselineError as error:
        _fail(str(error), EXIT_INVALID)
    report = run_check(list(resolved.specs), baseline)
    if format_ == "json":
        document = {
            "compatible": not report.breaking,
            "baseline": baseline.source,
            "compared": report.compared,
            "unchanged": report.unchanged,
            "findings": [finding.as_json() for finding in report.findings],
        }
        click.echo(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        for finding in report.findings:
            click.echo(finding.message())
        verdict = f"{len(report.breaking)} breaking change(s)" if report.breaking else "compatible"
        click.echo(
            f"{verdict}: {report.compared} changed spec(s) compared, {report.unchanged} unchanged,"
            f" against {baseline.source}",
            err=True,
        )
    sys.exit(EXIT_STALE if report.breaking else 0)


@main.command()
@click.argument("specs_dir", required=False, type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--lock", "lock_file", type=click.Path(path_type=Path, dir_okay=False), help=LOCK_HELP
)
@click.option("--waive", "waive_id", help="Record a waiver for this id's undecidable findings.")
@click.option("--reason", help="Why the waived change is safe (required with --waive).")
@click.option(
    "--init",
    is_flag=True,
    help="Create the --lock FILE that does not exist yet (the default lock needs no --init).",
)
def lock(
    specs_dir: Path | None,
    lock_file: Path | None,
    waive_id: str | None,
    reason: str | None,
    init: bool,
) -> None:
    """Record the specs as released in the lock, if nothing breaks a released contract.

    The first `blade-codegen lock` writes blade.lock.json beside SPECS_DIR: the first release.
    The lock keeps, per id, every released fingerprint, the latest contract and the data channel
    and suspend point names ever used. Commit it next to the specs.
    """
    from blade_codegen.check import (
        BaselineError,
        lock_text,
        locked,
        read_lock,
        undecidable_waivers,
    )
    from blade_codegen.check import check as run_check
    from blade_codegen.resolve import resolve_specs

    if waive_id is not None and not reason:
        raise click.UsageError("--waive needs --reason: say why the change is safe")
    specs = _specs_dir(specs_dir, need_specs=True)
    path = lock_file if init and lock_file is not None else _lock_path(lock_file, specs)
    try:
        resolved = resolve_specs(specs)
        baseline = read_lock(path)
    except SpecError as error:
        _report(error)
    except BaselineError as error:
        _fail(str(error), EXIT_INVALID)
    report = run_check(list(resolved.specs), baseline)
    waivers = undecidable_waivers(report, waive_id, reason or "") if waive_id else []
    if waive_id and not waivers:
        raise click.UsageError(f"--waive {waive_id}: it has no undecidable finding to waive")
    waived = {(w.id, w.rule, w.path) for w in waivers}
    breaking = [f for f in report.breaking if (f.id, f.rule, f.path) not in waived]
    if breaking:
        _refuse_breaking(breaking, f"; {path} was not changed", EXIT_STALE)
    text = lock_text(locked(list(resolved.specs), baseline, waivers))
    if path.exists() and path.read_text("utf-8") == text:
        click.echo(f"{path} is up to date")
        return
    first = not path.exists()
    _write_or_exit(path, text)
    click.echo(
        f"wrote {path}: {len(resolved.specs)} spec(s) locked"
        + (" (the first release: commit it beside the specs)" if first else "")
    )


@main.command()
@click.argument("specs_dir", required=False, type=click.Path(path_type=Path, file_okay=False))
@click.option("--name", required=True, help="Distribution name: blade-tool-<capability>.")
@click.option("--version", "version_", required=True, help="The release's version, e.g. 1.2.0.")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("dist"),
    show_default=True,
    help="Where the sdist and the wheel are written.",
)
@click.option(
    "--lock", "lock_file", type=click.Path(path_type=Path, dir_okay=False), help=LOCK_HELP
)
def pack(
    specs_dir: Path | None, name: str, version_: str, out: Path, lock_file: Path | None
) -> None:
    """Build SPECS_DIR as a spec package: an sdist and a wheel of the specs, their generated
    models and client DTOs, the manifest, the lock and a README.

    Refused (exit 5) when a spec breaks the lock; a pack records the release in the lock.
    """
    from blade_codegen.build import BreakingChange
    from blade_codegen.check import BaselineError
    from blade_codegen.models import ModelFailure
    from blade_codegen.pack import PackRefused
    from blade_codegen.pack import pack as run_pack

    specs = _specs_dir(specs_dir, need_specs=True)
    lock = _lock_path(lock_file, specs)
    try:
        packed = run_pack(specs, name, version_, out, lock)
    except PackRefused as refused:
        raise click.UsageError(str(refused)) from None
    except SpecError as error:
        _report(error)
    except (BaselineError, ModelFailure) as error:
        _fail(str(error), EXIT_INVALID)
    except BreakingChange as refused:
        _refuse_breaking(
            refused.report.breaking,
            f" against {lock}; nothing was packed (publish them under new ids)",
            EXIT_BREAKING,
        )
    except OSError as error:
        _fail(f"cannot write {out}: {error.strerror or error}", EXIT_WRITE)
    click.echo(f"wrote {packed.sdist}")
    click.echo(f"wrote {packed.wheel}")
    recorded = "recorded the release in" if packed.lock_changed else "release already in"
    click.echo(f"{packed.tools} tool(s); requires {', '.join(packed.requires)}; {recorded} {lock}")


@main.command(name="import")
@click.option(
    "--from",
    "source",
    type=click.Choice(["mcp", "openai", "anthropic"]),
    required=True,
    help="mcp: a tools/list result or one tool record a line; openai, anthropic: a tools array.",
)
@click.argument("file", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--server",
    help="Read a live MCP server instead of FILE: a streamable HTTP URL, or a command line "
    "started over stdio (needs blade-runtime[mcp]).",
)
@click.option(
    "--header",
    "headers",
    multiple=True,
    help="'Name: value' sent to a --server URL (repeatable; never printed).",
)
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Write nothing: say whether the specs still match the tools (exit codes as check).",
)
@click.option("--namespace", required=True, help="Id namespace: specs are NS.<tool-name>.v1.")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    help="Specs folder.  [default: [tool.blade-codegen] specs, else specs/]",
)
@click.option(
    "--name-prefix", default="", help="Prefix for the names (e.g. github.), to keep them unique."
)
@click.option(
    "--side-effect",
    type=click.Choice(["pure", "idempotent", "non_idempotent"]),
    default=None,
    help="The side effect of every imported tool. A remote server's idempotentHint or "
    "readOnlyHint never decides it (recovery may replay pure and idempotent calls).  "
    "[default: non_idempotent]",
)
@click.option("--force", is_flag=True, help="Replace spec files that exist with other content.")
def import_(
    source: str,
    file: Path | None,
    server: str | None,
    headers: tuple[str, ...],
    check_only: bool,
    namespace: str,
    out: Path | None,
    name_prefix: str,
    side_effect: str | None,
    force: bool,
) -> None:
    """Write spec files for the tools in FILE (schemas brought to JSON Schema 2020-12).

    Each tool that converts is written, each file whole; each tool that does not is listed, one
    line at its place in FILE with the fix. Exit codes: 0 written (or unchanged), 1 a spec file
    exists with other content (left alone; --force replaces), 2 usage, 3 a tool was not
    imported (the others were) or FILE is not a tool list (nothing written), 4 the folder
    cannot be written. With --check (MCP): 0 the specs match the server's tools or differ
    compatibly, 1 a change breaks their callers or readers (or a tool was dropped), 3 the server
    or FILE cannot be read.
    """
    if (file is None) == (server is None):
        raise click.UsageError("give FILE or --server (one of them)")
    if (server is not None or check_only) and source != "mcp":
        raise click.UsageError("--server and --check read MCP tools: use --from mcp")
    if server is not None:
        from blade_codegen.live import LiveError, listing

        try:
            text = listing(server, headers)
        except LiveError as error:
            _fail(str(error), EXIT_INVALID)
        with tempfile.TemporaryDirectory() as folder:
            listed = Path(folder) / "tools-list.json"
            listed.write_text(text, "utf-8")
            _import(source, listed, namespace, out, name_prefix, side_effect, force, check_only)
        return
    assert file is not None
    _import(source, file, namespace, out, name_prefix, side_effect, force, check_only)


def _import(
    source: str,
    file: Path,
    namespace: str,
    out: Path | None,
    name_prefix: str,
    side_effect: str | None,
    force: bool,
    check_only: bool,
) -> None:
    from blade_codegen.importer import (
        ImportRefused,
        WriteStopped,
        check_each,
        import_each,
        namespace_problem,
        read_tools,
        write_imported,
    )

    wrong = namespace_problem(namespace)
    if wrong is not None:
        raise click.UsageError(wrong)
    defaults = _settings()
    specs = out or defaults.specs
    kind = cast("Literal['mcp', 'openai', 'anthropic']", source)
    try:
        tools, unreadable = read_tools(file, kind)
        files, refused = import_each(
            tools, kind, namespace, file.name, name_prefix, unreadable, side_effect
        )
    except ImportRefused as not_a_list:
        for problem in not_a_list.problems:
            click.echo(problem, err=True)
        click.echo("nothing was written", err=True)
        sys.exit(EXIT_INVALID)
    files, invalid = check_each(specs, files, defaults.package)
    refused.extend(invalid)
    if check_only:
        _check_imported(specs, files, refused)
    for file_ in files:
        for note in file_.notes:
            click.echo(f"note: {note}", err=True)
    try:
        written, unchanged, clashes = write_imported(specs, files, force)
    except WriteStopped as stopped:
        done = f"; written before it: {', '.join(stopped.written)}" if stopped.written else ""
        _fail(f"cannot write {specs}: {stopped.strerror or stopped}{done}", EXIT_WRITE)
    for line in [*refused, *clashes]:
        click.echo(line, err=True)
    click.echo(
        f"imported {len(files) - len(clashes)} tool(s) into {specs}: {len(written)} written, "
        f"{len(unchanged)} unchanged"
    )
    total = len(tools) + len(unreadable)
    missing = total - len(files)
    if missing:
        outcome = "the others were imported" if files else "nothing was written"
        click.echo(
            f"{missing} of {total} tool(s) not imported, listed above (fix them and import "
            f"again); {outcome}",
            err=True,
        )
        sys.exit(EXIT_INVALID)
    if clashes:
        sys.exit(EXIT_STALE)


def _check_imported(specs: Path, files: list[Imported], refused: list[str]) -> None:
    """``import --check``: each finding on a line, a verdict, and check's exit code."""
    from blade_codegen.live import drift

    for line in refused:
        click.echo(line, err=True)
    findings, unchanged = drift(specs, files)
    for finding in findings:
        click.echo(finding.line())
    breaking = [finding for finding in findings if finding.breaking]
    verdict = f"{len(breaking)} breaking change(s)" if breaking else "compatible"
    click.echo(
        f"{verdict}: {len(findings)} finding(s), {unchanged} spec(s) unchanged, in {specs}",
        err=True,
    )
    if refused and not breaking:
        sys.exit(EXIT_INVALID)
    sys.exit(EXIT_STALE if breaking else 0)


SPECS_OPTION = click.option(
    "--specs",
    "specs_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="The spec folder.  [default: [tool.blade-codegen] specs, else specs/]",
)


@main.command()
@click.argument("spec_id", metavar="ID")
@SPECS_OPTION
def new(spec_id: str, specs_dir: Path | None) -> None:
    """Write a spec skeleton for ID at the path the id gives (crm.lookup-customer.v1 ->
    SPECS/crm/lookup-customer.v1.json).

    Exit codes: 0 written, 1 the file exists (nothing written), 2 an id without a namespace,
    3 the skeleton would not validate in the tree (e.g. its name is taken), 4 not writable.
    """
    from blade_codegen.stubs import Exists, Invalid, Refused, new_spec

    defaults = _settings()
    specs = specs_dir or defaults.specs
    try:
        path = new_spec(specs, spec_id, defaults.package)
    except Refused as refused:
        raise click.UsageError(str(refused)) from None
    except Exists as exists:
        _fail(str(exists), EXIT_STALE)
    except Invalid as invalid:
        for problem in invalid.problems:
            click.echo(problem, err=True)
        _fail("nothing was written", EXIT_INVALID)
    except OSError as error:
        _fail(f"cannot write {specs}: {error.strerror or error}", EXIT_WRITE)
    click.echo(f"wrote {path}: fill in the description and the schemas, then build")


@main.command()
@click.argument("spec_id", metavar="ID")
@click.option(
    "--out",
    "out_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The module to write.  [default: the tool's module name in this folder, e.g. "
    "lookup_customer_v1.py]",
)
@SPECS_OPTION
@click.option(
    "--package", help="The generated package it imports.  [default: [tool.blade-codegen] package]"
)
def stub(spec_id: str, out_file: Path | None, specs_dir: Path | None, package: str | None) -> None:
    """Write a typed implementation module for the tool ID, never over an existing file.

    It passes mypy --strict as written (once `blade-codegen build` has run): the body raises
    NotImplementedError, and comments show the tool's data channels, suspend points and child
    tools. Exit codes: 0 written, 1 the file exists, 2 no such tool or a client tool,
    3 invalid specs, 4 not writable.
    """
    from blade_codegen.stubs import Exists, Refused, write_new
    from blade_codegen.stubs import stub as make_stub

    specs = _specs_dir(specs_dir)
    package = _settings().package if package is None else package
    if not _valid_package(package):
        raise click.UsageError(f"--package {package!r} is not a Python package name")
    try:
        made = make_stub(specs, spec_id, package)
        target = out_file or Path(made.filename)
        write_new(target, made.text)
    except SpecError as error:
        _report(error)
    except Refused as refused:
        raise click.UsageError(str(refused)) from None
    except Exists as exists:
        _fail(str(exists), EXIT_STALE)
    except OSError as error:
        _fail(f"cannot write {out_file or made.filename}: {error.strerror or error}", EXIT_WRITE)
    click.echo(f"wrote {target}: implement it, then register it (its register function)")


@main.command()
@click.option("--specs", default="specs", show_default=True, help="The spec folder to create.")
@click.option("--out", default="generated", show_default=True, help="The output folder.")
@click.option(
    "--package", default="blade_specs", show_default=True, help="The generated package's name."
)
def init(specs: str, out: str, package: str) -> None:
    """Set up this folder: [tool.blade-codegen] in pyproject.toml, the spec folder with an
    example spec (example.hello.v1) and quickstart.py that calls it, and the output folder in
    .gitignore. What is already there is kept."""
    from blade_codegen.stubs import Exists, Invalid, Refused, init_project

    if not _valid_package(package):
        raise click.UsageError(f"--package {package!r} is not a Python package name")
    try:
        done = init_project(Path.cwd(), specs, out, package)
    except (Refused, ConfigError) as refused:
        raise click.UsageError(str(refused)) from None
    except (Exists, Invalid) as error:
        _fail(str(error), EXIT_STALE)
    except OSError as error:
        _fail(f"cannot write here: {error.strerror or error}", EXIT_WRITE)
    for line in done:
        click.echo(line)
    click.echo("next: blade-codegen build")


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
