"""The pipeline: load -> validate -> resolve -> plan -> render -> format -> write.

``build`` reads as its stages. Before them, a fast path compares content hashes of the spec tree
with the last build's record, so a no-op rebuild reads files and hashes them, nothing more.

A rebuild after a change does every stage, but not for everything: a module whose inputs did not
change is reused from the output (its cache key), and a spec file whose bytes did not change is
not resolved again (``resolve_tree``: what resolving it gave last time is kept beside the
package, in ``OUT/.blade-cache``) nor checked again on its own (the checks across the set always
run).
"""

from __future__ import annotations

import gc
import hashlib
import pickle
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

from blade_codegen import __version__, syntax
from blade_codegen.check import Baseline, Report, read_lock
from blade_codegen.check import check as check_specs
from blade_codegen.dependencies import Dependency, with_dependencies
from blade_codegen.format import format_files
from blade_codegen.load import SpecTree, load, read_tree
from blade_codegen.models import OPTIONS_SIGNATURE
from blade_codegen.plan import BuildPlan, plan
from blade_codegen.problems import SpecError
from blade_codegen.render import render
from blade_codegen.resolve import ResolvedSet, ResolvedSpec, resolve
from blade_codegen.validate import validate
from blade_codegen.write import (
    STATE_FILE,
    digest,
    on_disk,
    previous_modules,
    read_cache,
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


def input_digests(specs: Path, contents: Mapping[Path, bytes | None]) -> dict[str, str]:
    """Each spec file's sha256 by its path in the tree (``contents``: the tree, as read)."""
    return {
        path.relative_to(specs).as_posix(): (
            "unreadable" if raw is None else hashlib.sha256(raw).hexdigest()
        )
        for path, raw in contents.items()
    }


# -- resolving only what changed ---------------------------------------------------------------

# A ResolvedSpec is kept as the values of these fields; its source is the file as read now.
_KEPT = tuple(f.name for f in fields(ResolvedSpec) if f.name != "source")


@cache
def _code_digest() -> str:
    """The code that resolves (an edited checkout resolves anew, whatever its version says)."""
    package = Path(__file__).parent
    sha = hashlib.sha256()
    for path in sorted((*package.glob("*.py"), *package.glob("*.json"))):
        sha.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()


def _context(tree: SpecTree, tools: str) -> str:
    """Everything resolving and checking a spec depends on besides the spec file: the code, the
    toolchain, the validators the checks use, every shared file (ours and those of spec
    packages) and the spec packages themselves."""
    parts = [_code_digest(), tools, sys.version]
    parts += [f"{name} {version(name)}" for name in ("jsonschema-rs", "pydantic-core")]
    parts += [f"{s.rel}:{s.digest}" for s in sorted(tree.shared, key=lambda s: s.rel)]
    for name, found in sorted(tree.dependencies.items()):
        parts.append(f"{name}:{found.label if isinstance(found, Dependency) else found.message}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _kept(cached: bytes | None, context: str) -> dict[str, tuple[str, bytes]]:
    """The last build's resolved specs (path -> (file digest, pickled fields)), if they were
    resolved in the same context. A cache that is unreadable or from elsewhere is ignored."""
    if cached is None:
        return {}
    try:
        # The output folder's own bytes, written by the build: who can change them can change
        # the generated modules the project imports just as well.
        kept_context, entries = pickle.loads(cached)
    except Exception:  # any damage to the file only costs resolving everything again
        return {}
    return entries if kept_context == context and isinstance(entries, dict) else {}


def resolve_tree(
    specs: Path, contents: Mapping[Path, bytes | None], cached: bytes | None, tools: str
) -> tuple[ResolvedSet, bytes]:
    """Load, validate and resolve the spec tree (as ``resolve_specs`` does), resolving again
    only the spec files that differ from the ones ``cached`` holds; and the cache for the next
    build. SpecError lists every problem of the tree."""
    tree = with_dependencies(load(specs, contents))
    context = _context(tree, tools)
    kept = _kept(cached, context)
    # The files whose bytes the cache holds: checked when they were cached, resolved there.
    unchanged = frozenset(s.rel for s in tree.specs if kept.get(s.rel, ("",))[0] == s.digest)
    problems = validate(tree, unchanged)
    if problems:
        raise SpecError(problems)
    entries: dict[str, tuple[str, bytes]] = {}
    reused: list[ResolvedSpec] = []
    changed = []
    for source in tree.specs:
        values = _unpickled(kept[source.rel][1]) if source.rel in unchanged else None
        if values is not None:
            reused.append(ResolvedSpec(source, **dict(zip(_KEPT, values, strict=True))))
            entries[source.rel] = kept[source.rel]
        else:
            changed.append(source)
    fresh = resolve(replace(tree, specs=tuple(changed))).specs if changed else ()
    for spec in fresh:
        kept_values = tuple(getattr(spec, name) for name in _KEPT)
        entries[spec.source.rel] = (spec.source.digest, pickle.dumps(kept_values, protocol=5))
    resolved = ResolvedSet(tree, tuple(sorted((*reused, *fresh), key=lambda r: r.id)))
    return resolved, pickle.dumps((context, entries), protocol=5)


def _unpickled(blob: bytes) -> tuple[Any, ...] | None:
    try:
        values = pickle.loads(blob)
    except Exception:
        return None
    return values if isinstance(values, tuple) and len(values) == len(_KEPT) else None


@contextmanager
def _collector_quiet() -> Iterator[Callable[[], None]]:
    """Loading and resolving a tree makes hundreds of thousands of dicts and lists that live
    until the build ends and hold no cycles: the cyclic collector, scanning them again and again
    as they are made, found nothing and cost a tenth of a 1,000-spec rebuild. It is off until the
    caller calls the function this yields (after resolving); that freezes what was made so far
    (re-enabled, the collector would otherwise scan it all at once: 0.09 s on 1,000 specs) and
    turns the collector back on for the generator, which makes cyclic garbage. A caller's own
    frozen objects are left as they are (nothing is frozen then)."""
    enabled = gc.isenabled()
    ours = not gc.get_freeze_count()
    gc.disable()

    def settle() -> None:
        if ours:
            gc.freeze()
        if enabled:
            gc.enable()

    try:
        yield settle
    finally:
        if ours:
            gc.unfreeze()
        if enabled:
            gc.enable()


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
    # Generated modules go through ruff and black; the package files come from templates written
    # in black's style already (a test holds them to it), so a large __init__.py costs nothing to
    # rebuild.
    files = format_files(rendered.files, set(fresh))
    syntax.forget()  # the last modules' trees are not kept alive (``build --watch`` stays)
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
    contents = read_tree(specs)  # read once too: hashed here, parsed if anything changed
    inputs = input_digests(specs, contents)
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
    with _collector_quiet() as settle:
        # --check writes no cache, and never reads one: a checkout's file is not trusted code.
        cached = None if check else read_cache(target)
        resolved, cache_bytes = resolve_tree(specs, contents, cached, tools)
        settle()
        compiled = compile_specs(
            resolved, package, previous_modules(state, disk), progress, baseline
        )
    inputs.update(package_versions(compiled.plan.resolved.tree.dependencies))
    files, fresh, looser = compiled.files, compiled.fresh, compiled.looser
    files[STATE_FILE] = state_text(files, compiled.keys, inputs, tools)
    differing = tuple(sorted(p for p in set(files) | set(disk) if files.get(p) != disk.get(p)))
    if not differing:
        return BuildResult(target, "unchanged", fresh, looser=looser)
    if check:
        # The build's own record (input digests: a new lock's, say) is not output: code that
        # is the same is not stale, or building, locking and committing would fail CI.
        if differing == (STATE_FILE,):
            return BuildResult(target, "unchanged", fresh, looser=looser)
        return BuildResult(target, "stale", fresh, differing, looser)
    write_package(
        target, files, unchanged={p for p in files if p not in differing}, cache=cache_bytes
    )
    return BuildResult(target, "written", fresh, differing, looser)
