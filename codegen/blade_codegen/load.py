"""Stage 1, load: read the spec tree and keep the text for positions in messages."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blade_codegen.problems import Problem, pointer

if TYPE_CHECKING:
    from blade_codegen.dependencies import Dependency, Unavailable

SHARED_SUFFIX = ".schema.json"


@dataclass(frozen=True)
class SourceFile:
    """One JSON file of the spec tree: its parsed data, its text and where it sits."""

    root: Path
    rel: str  # POSIX path relative to the spec root
    text: str
    data: Any
    digest: str

    @property
    def is_shared(self) -> bool:
        return self.rel.endswith(SHARED_SUFFIX)

    @cached_property
    def _source_map(self) -> dict[str, Any]:
        # Only computed when a message needs a position: the happy path never pays for it.
        import json_source_map

        result: dict[str, Any] = json_source_map.calculate(self.text)
        return result

    def locate(self, segments: Sequence[str | int]) -> tuple[int, int]:
        """1-based line and column of the value at ``segments``, or of its nearest ancestor."""
        source_map = self._source_map
        parts = [str(s) for s in segments]
        while True:
            # json-source-map joins raw keys with "/" without RFC 6901 escaping.
            entry = source_map.get("".join("/" + p for p in parts))
            if entry is not None:
                start = entry.key_start if entry.key_start is not None else entry.value_start
                return start.line + 1, start.column + 1
            if not parts:
                return 1, 1
            parts.pop()

    def problem(self, segments: Sequence[str | int], message: str, hint: str = "") -> Problem:
        line, column = self.locate(segments)
        return Problem(self.rel, line, column, pointer(*segments), message, hint)


@dataclass(frozen=True)
class SpecTree:
    """Every JSON file under the spec root, split into tool specs and shared schema files."""

    root: Path
    specs: tuple[SourceFile, ...]
    shared: tuple[SourceFile, ...]
    problems: tuple[Problem, ...] = field(default=())
    # The package's guidance for the model (``guidance.md`` at the root), sent with its tools.
    guidance: str | None = None
    # Installed spec packages the tree references (their shared files are in ``shared``).
    dependencies: Mapping[str, Dependency | Unavailable] = field(default_factory=dict)

    def file(self, rel: str) -> SourceFile | None:
        return self._by_rel.get(rel)

    @cached_property
    def _by_rel(self) -> dict[str, SourceFile]:
        return {f.rel: f for f in (*self.specs, *self.shared)}


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)  # in C; the pairs are walked only when one key came twice
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return result


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def spec_paths(root: Path) -> list[Path]:
    """Every ``*.json`` file under ``root``, in a stable order; hidden folders are skipped.

    What ``root.rglob("*.json")`` finds (folders are entered without following links, a folder
    that may not be listed is left out), by one ``scandir`` per folder: rglob's paths cost three
    times as much, and a build lists the tree twice (the command's check that there are specs,
    then the read)."""
    found: list[tuple[str, Path]] = []
    if not root.is_dir():
        return []

    def walk(folder: Path, rel: str) -> None:
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except PermissionError:
            return
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            path = folder / name
            if name.endswith(".json"):
                found.append((rel + name, path))
            try:
                is_folder = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_folder = False
            if is_folder:
                walk(path, rel + name + "/")

    walk(root, "")
    found.sort(key=lambda item: item[0])
    return [path for _, path in found]


def _inside(root: Path, path: Path) -> bool:
    """``path`` (found under ``root``) is in the tree once links are followed. Without a link on
    the way from ``root`` it is, and only then are both resolved (each resolution is a system
    call per path segment: a thousand specs' worth is a noticeable part of a rebuild)."""
    for at in (path, *path.parents):
        if at == root:
            return True
        if at.is_symlink():
            break
    return path.resolve().is_relative_to(root.resolve())


def read_file(
    root: Path, path: Path, raw: bytes | None = None
) -> tuple[SourceFile | None, Problem | None]:
    """One file of the tree; ``raw`` is its content when the caller has read it already."""
    rel = path.relative_to(root).as_posix()
    try:
        if not _inside(root, path):
            return None, Problem(rel, 1, 1, "", "links outside the spec tree", "copy the file in")
        if raw is None:
            raw = path.read_bytes()
    except OSError as error:
        return None, Problem(rel, 1, 1, "", f"cannot read: {error.strerror}", "check permissions")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, Problem(rel, 1, 1, "", f"not UTF-8 (byte {error.start})", "save it as UTF-8")
    try:
        data = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except _DuplicateKeyError as error:
        line, column = _first_key_line(text, error.key)
        return None, Problem(
            rel, line, column, "", f"duplicate key {error.key!r}", "keep one of them"
        )
    except json.JSONDecodeError as error:
        return None, Problem(rel, error.lineno, error.colno, "", f"invalid JSON: {error.msg}", "")
    return SourceFile(root, rel, text, data, hashlib.sha256(raw).hexdigest()), None


def _first_key_line(text: str, key: str) -> tuple[int, int]:
    needle = json.dumps(key)
    seen = text.find(needle)
    second = text.find(needle, seen + 1) if seen >= 0 else -1
    index = second if second >= 0 else max(seen, 0)
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


GUIDANCE_FILE = "guidance.md"
"""The spec package's guidance for the model, at the root of the spec tree: the seed's skills
``{guidance, tools}``, in the manifest beside the tools and sent with them."""
GUIDANCE_LIMIT = 64 * 1024  # bytes: guidance rides along with every model request


def read_tree(root: Path) -> dict[Path, bytes | None]:
    """The content of every file ``load`` reads (None: unreadable, ``load`` says why)."""
    contents: dict[Path, bytes | None] = {}
    guidance = root / GUIDANCE_FILE
    paths = spec_paths(root) + ([guidance] if guidance.is_file() else [])
    for path in paths:
        try:
            contents[path] = path.read_bytes()
        except OSError:
            contents[path] = None
    return contents


def load(root: Path, contents: Mapping[Path, bytes | None] | None = None) -> SpecTree:
    """Read every JSON file under ``root``; unreadable files become problems, not exceptions.

    ``contents`` is the tree as ``read_tree`` read it, for a caller that needed the bytes first
    (the build hashes them before it knows whether it has anything to parse)."""
    specs: list[SourceFile] = []
    shared: list[SourceFile] = []
    problems: list[Problem] = []
    guidance_path = root / GUIDANCE_FILE
    guidance = None
    if contents is None or guidance_path in contents:
        raw = None if contents is None else contents[guidance_path]
        guidance = read_guidance(guidance_path, raw, contents is None, problems)
    for path in spec_paths(root) if contents is None else contents:
        if path == guidance_path:
            continue
        source, problem = read_file(root, path, None if contents is None else contents[path])
        if source is not None and source.rel.startswith("@"):
            reserved = "paths starting with @ name installed spec packages"
            problem = Problem(source.rel, 1, 1, "", reserved, "rename the folder")
        if problem is not None:
            problems.append(problem)
        elif source is not None:
            (shared if source.is_shared else specs).append(source)
    return SpecTree(root, tuple(specs), tuple(shared), tuple(problems), guidance)


def read_guidance(
    path: Path, raw: bytes | None, from_disk: bool, problems: list[Problem]
) -> str | None:
    """The text of ``guidance.md`` (None when there is none); a problem when it cannot be the
    model's guidance: unreadable, not UTF-8, empty or too long."""
    if from_disk:
        if not path.is_file():
            return None
        try:
            raw = path.read_bytes()
        except OSError:
            raw = None
    name = GUIDANCE_FILE
    if raw is None:
        problems.append(Problem(name, 1, 1, "", "cannot be read", "check its permissions"))
        return None
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError as error:
        message = f"is not UTF-8 (byte {error.start})"
        problems.append(Problem(name, 1, 1, "", message, "save it as UTF-8"))
        return None
    if not text:
        fix = "write the guidance for the model, or remove the file"
        problems.append(Problem(name, 1, 1, "", "is empty", fix))
        return None
    if len(raw) > GUIDANCE_LIMIT:
        message = f"is {len(raw)} bytes, over the {GUIDANCE_LIMIT} a model's guidance may take"
        problems.append(Problem(name, 1, 1, "", message, "shorten it"))
        return None
    return text
