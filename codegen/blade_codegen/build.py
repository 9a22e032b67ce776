"""The pipeline: load -> validate -> resolve -> plan -> render -> format -> write.

``build`` reads as its stages. Before them, a fast path compares content hashes of the spec tree
with the last build's record, so a no-op rebuild reads files and hashes them, nothing more.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

from blade_codegen import __version__
from blade_codegen.check import Baseline, Report, read_lock
from blade_codegen.check import check as check_specs
from blade_codegen.format import format_files
from blade_codegen.load import spec_paths
from blade_codegen.models import OPTIONS_SIGNATURE
from blade_codegen.plan import BuildPlan, plan
from blade_codegen.render import render
from blade_codegen.resolve import ResolvedSet, resolve_specs
from blade_codegen.write import (
    STATE_FILE,
    digest,
    on_disk,
    previous_modules,
    read_state,
    recover,
    state_text,
    write_package,
)

Status = Literal["written", "unchanged", "stale"]


def toolchain() -> str:
    """Everything the generated text depends on besides the specs."""
    return (
        f"blade-codegen {__version__}; datamodel-code-generator "
        f"{version('datamodel-code-generator')}; black {version('black')}; ruff {version('ruff')}; "
        f"{OPTIONS_SIGNATURE}"
    )


class BreakingChange(Exception):
    """The specs break contracts recorded in the lock; nothing was generated."""

    def __init__(self, report: Report) -> None:
        super().__init__(f"{len(report.breaking)} breaking change(s)")
        self.report = report


@dataclass(frozen=True)
class Compiled:
    files: dict[str, str]
    keys: dict[str, str]
    fresh: tuple[str, ...]  # modules the generator ran for
    looser: dict[str, list[str]]  # spec id -> where its models accept more than its schema
    plan: BuildPlan


@dataclass(frozen=True)
class BuildResult:
    target: Path
    status: Status
    regenerated: tuple[str, ...] = ()  # modules the generator ran for
    differing: tuple[str, ...] = ()  # files that were (or would be) added, changed or removed
    looser: dict[str, list[str]] = field(default_factory=dict)
    """For the specs generated in this build: where their models accept more than the schema."""


def input_digests(specs: Path) -> dict[str, str]:
    return {
        p.relative_to(specs).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in spec_paths(specs)
    }


_PACKAGE = "package:"  # the state's inputs also record each spec package a build used


def package_versions(names: Iterable[str]) -> dict[str, str]:
    """The installed version of each spec package (for its references and child tools)."""
    versions = {}
    for name in sorted(names):
        try:
            versions[_PACKAGE + name] = version(name)
        except PackageNotFoundError:
            versions[_PACKAGE + name] = "not installed"
    return versions


def _up_to_date(
    state: Mapping[str, Any] | None, disk: Mapping[str, str], inputs: dict[str, str], tools: str
) -> bool:
    """The last build had these inputs and toolchain, and its files are on disk as it wrote them."""
    if state is None or state.get("generator") != tools or state.get("inputs") != inputs:
        return False
    recorded = state.get("files")
    if not isinstance(recorded, dict) or set(disk) != {*recorded, STATE_FILE}:
        return False
    return all(digest(text) == recorded[path] for path, text in disk.items() if path != STATE_FILE)


def compile_specs(
    resolved: ResolvedSet,
    package: str,
    previous: dict[str, tuple[str, str]],
    progress: Callable[[str], None],
    baseline: Baseline | None = None,
) -> Compiled:
    """Stages plan to format: the package's files in memory.

    With a ``baseline`` (the lock), a spec that breaks its locked contract raises BreakingChange
    before any code is generated."""
    if baseline is not None:
        report = check_specs(list(resolved.specs), baseline)
        if report.breaking:
            raise BreakingChange(report)
    build_plan = plan(resolved, package, OPTIONS_SIGNATURE)
    fresh: list[str] = []

    def on_module(path: str) -> None:
        fresh.append(path)
        progress(path)

    rendered = render(build_plan, previous, on_module)
    # Generated modules go through black; the package files come from templates written in black's
    # style already (a test holds them to it), so a large __init__.py costs nothing to rebuild.
    files = format_files(rendered.files, set(fresh))
    return Compiled(files, dict(rendered.keys), tuple(fresh), dict(rendered.looser), build_plan)


def build(
    specs: Path,
    out: Path,
    package: str,
    *,
    check: bool = False,
    progress: Callable[[str], None] = lambda path: None,
    lock: Path | None = None,
) -> BuildResult:
    """Build the package ``package`` under ``out`` from the spec tree at ``specs``.

    With ``check``, nothing is written: the result says whether the output on disk is stale.
    """
    target = out / package
    if not check:
        recover(target)
    tools = toolchain()
    disk = on_disk(target)  # read once: the fast path, reuse of modules and the diff all need it
    state = read_state(disk)
    inputs = input_digests(specs)
    if lock is not None and lock.is_file():
        inputs[f"lock:{lock.name}"] = digest(lock.read_text("utf-8"))  # a new lock re-checks
    else:
        lock = None
    # An upgraded spec package (one the last build used) makes the build run again.
    recorded = (state or {}).get("inputs", {})
    used = [k.removeprefix(_PACKAGE) for k in recorded if k.startswith(_PACKAGE)]
    if _up_to_date(state, disk, {**inputs, **package_versions(used)}, tools):
        return BuildResult(target, "unchanged")
    baseline = None if lock is None else read_lock(lock)
    compiled = compile_specs(
        resolve_specs(specs), package, previous_modules(state, disk), progress, baseline
    )
    inputs.update(package_versions(compiled.plan.resolved.tree.dependencies))
    files, fresh, looser = compiled.files, compiled.fresh, compiled.looser
    files[STATE_FILE] = state_text(files, compiled.keys, inputs, tools)
    differing = tuple(sorted(p for p in set(files) | set(disk) if files.get(p) != disk.get(p)))
    if not differing:
        return BuildResult(target, "unchanged", fresh, looser=looser)
    if check:
        return BuildResult(target, "stale", fresh, differing, looser)
    write_package(target, files, unchanged={p for p in files if p not in differing})
    return BuildResult(target, "written", fresh, differing, looser)
