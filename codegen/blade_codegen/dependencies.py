"""Installed spec packages a spec tree builds on, found by the ``blade:`` references in it.

A spec package (made by ``blade-codegen pack``) ships its spec files under ``<package>/specs`` and
its ``manifest.json``; both are read from the installed package, never from the network. Its
shared files join the tree under ``@DIST/...``; its generated classes are imported, not copied.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from blade_codegen.load import SHARED_SUFFIX, SourceFile, SpecTree, read_file, spec_paths
from blade_codegen.problems import Problem
from blade_codegen.refs import DEPENDENCY, PACKAGE_SCHEME, RefTarget, dependency_of, parse_ref

SPECS_FOLDER = "specs"  # where a spec package ships its spec tree, inside its import package
_MARK = f'"{PACKAGE_SCHEME}:'


@dataclass(frozen=True)
class Dependency:
    name: str  # distribution: blade-tool-crm
    version: str
    package: str  # import name: blade_tool_crm
    folder: Path  # the installed import package
    tools: Mapping[str, Mapping[str, Any]]  # its manifest's tools by id

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


@dataclass(frozen=True)
class Unavailable:
    name: str
    message: str
    hint: str


def import_name(dist: str) -> str:
    """``blade-tool-crm`` -> ``blade_tool_crm``: the import name ``pack`` gives a package."""
    return dist.replace("-", "_")


def referenced(sources: Iterable[SourceFile]) -> list[str]:
    """Spec packages named by ``blade:`` references, in a stable order."""
    names: set[str] = set()
    for source in sources:
        if _MARK not in source.text:
            continue  # a plain substring test keeps the common case (no dependency) cheap
        for ref in _refs(source.data):
            if ref.startswith(PACKAGE_SCHEME + ":"):
                target = parse_ref(ref, source.rel)
                if isinstance(target, RefTarget):
                    name = dependency_of(target.file)
                    if name:
                        names.add(name)
    return sorted(names)


def _refs(data: Any) -> Iterator[str]:
    if isinstance(data, dict):
        ref = data.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in data.values():
            yield from _refs(value)
    elif isinstance(data, list):
        for value in data:
            yield from _refs(value)


def with_dependencies(tree: SpecTree) -> SpecTree:
    """The tree with the shared schemas of every spec package its references name, and the spec
    packages that hold the child tools it names and does not define itself."""
    found: dict[str, Dependency | Unavailable] = {}
    shipped: list[SourceFile] = []
    problems = list(tree.problems)
    for name in referenced((*tree.specs, *tree.shared)):
        dependency = found[name] = locate(name)
        if isinstance(dependency, Dependency):
            files, unreadable = shipped_schemas(dependency)
            shipped.extend(files)
            problems.extend(
                Problem(f"{DEPENDENCY}{name}", 1, 1, "", f"{dependency.label}: {what}", "")
                for what in unreadable
            )
    wanted = _foreign_children(tree) - {
        spec_id for d in found.values() if isinstance(d, Dependency) for spec_id in d.tools
    }
    if wanted:
        holders: dict[str, list[str]] = {}
        for dependency in installed_spec_packages():
            held = wanted & dependency.tools.keys()
            if dependency.name not in found and held:
                found[dependency.name] = dependency
                for spec_id in held:
                    holders.setdefault(spec_id, []).append(dependency.label)
        problems.extend(_ambiguous_children(tree, holders))
    if not found:
        return tree
    return replace(
        tree, shared=(*tree.shared, *shipped), problems=tuple(problems), dependencies=found
    )


def installed(tree: SpecTree) -> list[Dependency]:
    """The spec packages the tree uses that are installed and readable."""
    return [d for d in tree.dependencies.values() if isinstance(d, Dependency)]


def holder(tree: SpecTree, spec_id: str) -> Dependency | None:
    """The spec package of the tree that holds the tool ``spec_id``, if one does."""
    return next((d for d in installed(tree) if spec_id in d.tools), None)


def _ambiguous_children(tree: SpecTree, holders: Mapping[str, list[str]]) -> list[Problem]:
    """A child id that several installed spec packages hold: which one is meant is not for the
    order of the installation to decide."""
    problems = []
    for source in tree.specs:
        children = source.data.get("children") if isinstance(source.data, dict) else None
        for index, child in enumerate(children if isinstance(children, list) else []):
            found = holders.get(child) if isinstance(child, str) else None
            if found and len(found) > 1:
                problems.append(
                    source.problem(
                        ("children", index),
                        f"child {child!r} is a tool of each of {', '.join(found)}",
                        "uninstall all but one, or name the one to use with a blade: reference "
                        "to one of its schemas",
                    )
                )
    return problems


def _foreign_children(tree: SpecTree) -> set[str]:
    """Child ids the tree names but does not define."""
    own = {s.data.get("id") for s in tree.specs if isinstance(s.data, dict)}
    named: set[str] = set()
    for source in tree.specs:
        children = source.data.get("children") if isinstance(source.data, dict) else None
        if isinstance(children, list):
            named.update(c for c in children if isinstance(c, str))
    return named - own


def installed_spec_packages() -> list[Dependency]:
    """Every installed ``blade-tool-*`` spec package, by name (read only when a child tool is
    not found in the tree or the packages its references name)."""
    names = {
        dist.metadata["Name"].lower().replace("_", "-")
        for dist in metadata.distributions()
        if dist.metadata["Name"]
    }
    located = (locate(name) for name in sorted(n for n in names if n.startswith("blade-tool-")))
    return [d for d in located if isinstance(d, Dependency)]


def locate(name: str) -> Dependency | Unavailable:
    """The installed spec package ``name``, or why it cannot be used."""
    install = f"install it (pip install {name}) in the environment that runs blade-codegen"
    try:
        version = metadata.version(name)
        spec = importlib.util.find_spec(import_name(name))
    except (metadata.PackageNotFoundError, ImportError, ValueError):
        return Unavailable(name, f"the spec package {name} is not installed", install)
    if spec is None or spec.origin is None:
        return Unavailable(name, f"{name} {version} has no package {import_name(name)}", install)
    folder = Path(spec.origin).parent
    manifest = folder / "manifest.json"
    if not (folder / SPECS_FOLDER).is_dir() or not manifest.is_file():
        return Unavailable(
            name,
            f"{name} {version} is not a spec package (it ships no specs/ and manifest.json)",
            "reference a package made by `blade-codegen pack`",
        )
    try:
        tools = json.loads(manifest.read_text("utf-8"))["tools"]
        by_id = {tool["id"]: tool for tool in tools}
    except (OSError, ValueError, KeyError, TypeError) as error:
        return Unavailable(name, f"{name} {version}: unreadable manifest.json ({error})", install)
    return Dependency(name, version, import_name(name), folder, by_id)


def shipped_schemas(dependency: Dependency) -> tuple[list[SourceFile], list[str]]:
    """The shared schema files a spec package ships, as ``@DIST/...`` files of the tree, and the
    files that could not be read."""
    root = dependency.folder / SPECS_FOLDER
    files, unreadable = [], []
    for path in spec_paths(root):
        if not path.name.endswith(SHARED_SUFFIX):
            continue
        source, problem = read_file(root, path)
        if source is None:
            unreadable.append(f"{path}: {problem.message if problem else 'unreadable'}")
            continue
        files.append(_as_shipped(source, dependency.name))
    return files, unreadable


def _as_shipped(source: SourceFile, dist: str) -> SourceFile:
    return SourceFile(
        source.root, f"{DEPENDENCY}{dist}/{source.rel}", source.text, source.data, source.digest
    )
