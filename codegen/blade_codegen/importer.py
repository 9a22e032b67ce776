"""``blade-codegen import``: spec files from tool definitions that already exist.

Reads an MCP ``tools/list`` result (or its JSON-RPC response, or one MCP tool record a line), an
OpenAI tools array (Chat Completions or Responses shape) or an Anthropic tools array, and writes
one spec a tool: id ``NS.<tool-name>.v1``, the original name where our name rule allows it, the
description, the schemas brought to 2020-12 (``dialect``), and for MCP the annotations as
``kind`` hints (``readOnlyHint``), with the originals kept under ``importedFrom``; the side effect
stays the conservative ``non_idempotent`` unless the user gives ``--side-effect``.

A file is JSON when it parses as one document, else JSON Lines (MCP only): the shape is found by
parsing, not by its first characters. A tool written in another format than the one named (an
MCP ``inputSchema`` read as OpenAI, whose ``parameters`` may be left out) is refused, naming the
format it looks like: read as asked, its schemas would be lost. The same input gives the same
files. Every spec is validated as the build would validate it before anything is written
(``check_each``); an existing spec file is never overwritten with different content unless
``force``. A tool that cannot be imported is refused on its own, one line at its place in the
file (``file:line:col: pointer: tool: problem (fix)``), and the others are still written, each
file whole (``import_each``, ``write_imported``): a list of forty tools with one remote
reference gives thirty-nine specs and one line to act on, and importing again once it is fixed
writes the fortieth and leaves the others unchanged. A file that cannot be read as a tool list
at all writes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from blade_codegen.config import DEFAULT_PACKAGE
from blade_codegen.dialect import NotConvertible, Refusal, convert
from blade_codegen.load import SourceFile, SpecTree, load
from blade_codegen.problems import Problem, SpecError
from blade_codegen.schemas import Segments
from blade_codegen.write import write_file

Source = Literal["mcp", "openai", "anthropic"]
SOURCES: tuple[Source, ...] = ("mcp", "openai", "anthropic")
NAME_RULE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
NAMESPACE_RULE = re.compile(r"[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*)*")
# What a tool list in each format is called, to tell the user what they gave instead.
LOOKS_LIKE: dict[str, str] = {
    "mcp": "MCP tools/list output",
    "openai": "an OpenAI tools array",
    "anthropic": "an Anthropic tools array",
}
NAMED: dict[str, str] = {"mcp": "an MCP", "openai": "an OpenAI", "anthropic": "an Anthropic"}


class ImportRefused(Exception):
    """The input cannot be imported; ``problems`` are one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Imported:
    """One spec file to write: path relative to the specs folder, and its text."""

    path: str
    text: str
    notes: tuple[str, ...] = ()  # where a schema was read on a guess (no $schema), one line each


@dataclass(frozen=True)
class Tool:
    """A tool as the source describes it."""

    name: str
    description: str
    input_schema: Any
    output_schema: Any
    annotations: dict[str, Any]
    where: str  # "tools[3]" or "line 4": to say which one a problem is about
    # Where the record is, to point at its places: the file (or its line, in JSON Lines) and
    # the record's pointer in it, and where each schema slot sits in the record.
    source: SourceFile | None = None
    line: int = 0  # the record's line in JSON Lines (0: in one document)
    at: Segments = ()
    slots: Mapping[str, Segments] = field(
        default_factory=lambda: {"inputSchema": ("inputSchema",), "outputSchema": ("outputSchema",)}
    )

    def problem(self, segments: Segments, message: str, hint: str = "") -> str:
        """One line about the place ``segments`` of this record: file:line:col: pointer: ..."""
        return _located(self.source, self.line, self.at, segments, message, hint, self.where)

    def slot_problem(self, slot: str, inner: str, message: str, hint: str = "") -> str:
        """One line about the place ``inner`` (a JSON pointer) of the schema slot ``slot``."""
        return self.problem((*self.slots.get(slot, (slot,)), *_segments(inner)), message, hint)


def _located(
    source: SourceFile | None,
    line: int,
    at: Segments,
    segments: Segments,
    message: str,
    hint: str,
    where: str,
) -> str:
    if source is None:  # a tool made in code: no text to point into
        return str(Problem(where, 0, 0, "/".join(map(str, segments)), message, hint))
    problem = source.problem((*at, *segments), message, hint)
    return str(replace(problem, line=line) if line else problem)


def _segments(at: str) -> Segments:
    """The segments of the JSON pointer ``at`` (RFC 6901 escapes undone)."""
    return tuple(p.replace("~1", "/").replace("~0", "~") for p in at.split("/")[1:])


def read_tools(path: Path, source: Source) -> tuple[list[Tool], list[str]]:
    """The tools in ``path`` in their order, and a line for each record that is not a tool;
    ImportRefused if the file is not such a list at all."""
    label = path.name
    try:
        text = path.read_text("utf-8")
    except OSError as error:
        raise ImportRefused([f"{label}: cannot read: {error.strerror or error}"]) from None
    try:
        records = _records(text, source)
    except json.JSONDecodeError as error:
        if source != "mcp":  # MCP's JSON Lines, perhaps
            with contextlib.suppress(json.JSONDecodeError):
                _refuse_foreign(label, text, _lines_of(text), source)
        raise ImportRefused(
            [f"{label}:{error.lineno}:{error.colno}: not JSON: {error.msg}"]
        ) from None
    except ValueError as error:
        raise ImportRefused([f"{label}: {error}"]) from None
    _refuse_foreign(label, text, records, source)
    problems: list[str] = []
    tools: list[Tool] = []
    document = SourceFile(Path(), label, text, None, "")
    lines = text.splitlines()
    for where, line, at, record in records:
        place = SourceFile(Path(), label, lines[line - 1], None, "") if line else document
        tool = _tool(record, source)
        if isinstance(tool, _Unreadable):
            problems.append(_located(place, line, at, tool.at, tool.message, tool.hint, where))
        else:
            name, description, input_schema, output_schema, annotations, slots = tool
            tools.append(
                Tool(
                    name,
                    description,
                    input_schema,
                    output_schema,
                    annotations,
                    where,
                    source=place,
                    line=line,
                    at=at,
                    slots=slots,
                )
            )
    return tools, problems


# A tool record: where it is said to be ("tools[3]", "line 4"), its line in JSON Lines (0 in
# one document), its JSON pointer in the document (() for a line), and the record.
Record = tuple[str, int, Segments, Any]


def _records(text: str, source: Source) -> list[Record]:
    """The tool records of ``text`` with where each is: one JSON document (pretty-printed or
    not), or for MCP one record a line. JSONDecodeError names the first place neither reads."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as whole:
        if source != "mcp":
            raise
        records = _lines_of(text)
        if not records:
            raise whole from None  # not JSON Lines either: the document's own error
        return records
    if source == "mcp" and isinstance(document, dict) and "inputSchema" in document:
        return [("line 1", 1, (), document)]  # JSON Lines of one record
    at, tools = _tool_list(document, source)
    return [(f"tools[{i}]", 0, (*at, i), item) for i, item in enumerate(tools)]


def _lines_of(text: str) -> list[Record]:
    """``text`` read as JSON Lines, or [] when it is not (not two lines, or the first is not
    JSON); JSONDecodeError names a later line that is not JSON."""
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if len(lines) < 2:
        return []
    try:
        json.loads(lines[0][1])
    except json.JSONDecodeError:
        return []
    records: list[Record] = []
    for n, line in lines:
        try:
            records.append((f"line {n}", n, (), json.loads(line)))
        except json.JSONDecodeError as error:
            raise json.JSONDecodeError(error.msg, text, _offset(text, n, error.pos)) from None
    return records


def _offset(text: str, line: int, column: int) -> int:
    """The offset in ``text`` of ``column`` (0-based) on 1-based ``line``."""
    starts = [0, *(i + 1 for i, c in enumerate(text) if c == "\n")]
    return starts[line - 1] + column


def _tool_list(document: Any, source: Source) -> tuple[Segments, list[Any]]:
    """The tools of ``document`` and the JSON pointer of their list."""
    at: Segments = ()
    # A JSON-RPC response wraps the result; read under another --from, its tools tell.
    result = document.get("result") if isinstance(document, dict) else None
    if isinstance(result, dict) and (source == "mcp" or isinstance(result.get("tools"), list)):
        at, document = ("result",), result
    if isinstance(document, dict) and isinstance(document.get("tools"), list):
        return (*at, "tools"), list(document["tools"])
    if isinstance(document, list):
        return at, document
    if source == "mcp":
        raise ValueError('expected a tools/list result ({"tools": [...]}) or a list of tools')
    raise ValueError(f"expected a {source} tools array")


def _format_of(record: Any, source: Source) -> str:
    """The format ``record`` is written in, by the key each names the input schema with;
    ``source`` when it fits (or nothing tells), "blade" for our own export."""
    if not isinstance(record, dict):
        return source
    if {"id", "side_effect", "execution"} <= record.keys():
        return "blade"  # export --format blade: its ids and side effects have no place here
    function = record.get("function")
    keys = {
        "mcp": "inputSchema" in record,
        "anthropic": "input_schema" in record,
        "openai": "parameters" in record or isinstance(function, dict),
    }
    if keys[source]:
        return source
    # OpenAI's parameters may be left out: a record that names no schema is read as asked.
    return next((name for name, has in keys.items() if has), source)


def _refuse_foreign(label: str, text: str, records: list[Record], source: Source) -> None:
    """ImportRefused, one line at the first record of another format than ``source``: read as
    ``source``, its schemas would be lost (OpenAI's parameters default to any object)."""
    for _, line, at, record in records:
        found = _format_of(record, source)
        if found == source:
            continue
        if found == "blade":
            looks = "the tool list of blade-codegen export --format blade"
            hint = "import reads MCP, OpenAI or Anthropic tools: export with --format mcp"
        else:
            looks, hint = LOOKS_LIKE[found], f"use --from {found}"
        message = f"not {NAMED[source]} tool: this looks like {looks}"
        if line:
            problem = Problem(label, line, 1, "", message, hint)
        else:
            document = SourceFile(Path(), label, text, None, "")
            problem = document.problem(at, message, hint)
        raise ImportRefused([str(problem)])


@dataclass(frozen=True)
class _Unreadable:
    """Why a record is not a tool, and where in it."""

    at: Segments
    message: str
    hint: str


def _tool(
    record: Any, source: Source
) -> tuple[str, str, Any, Any, dict[str, Any], dict[str, Segments]] | _Unreadable:
    if not isinstance(record, dict):
        return _Unreadable((), "a tool must be a JSON object", "remove it from the list")
    fields: tuple[Any, Any, Any, Any, Any]
    body: Any = record
    within: Segments = ()
    if source == "openai":
        if record.get("type", "function") != "function":
            return _Unreadable(
                ("type",),
                f"only function tools can be imported (type {record.get('type')!r})",
                "remove it from the list, or write its spec by hand",
            )
        if "function" in record:
            body, within = record["function"], ("function",)
        if not isinstance(body, dict):
            return _Unreadable(within, "function must be a JSON object", "fix the record")
        fields = (
            body.get("name"),
            body.get("description"),
            body.get("parameters", {"type": "object"}),
            None,
            {},
        )
        slots = {"inputSchema": (*within, "parameters")}
    elif source == "anthropic":
        fields = (
            record.get("name"),
            record.get("description"),
            record.get("input_schema"),
            None,
            {},
        )
        slots = {"inputSchema": ("input_schema",)}
    else:
        fields = (
            record.get("name"),
            record.get("description"),
            record.get("inputSchema"),
            record.get("outputSchema"),
            record.get("annotations") or {},
        )
        slots = {"inputSchema": ("inputSchema",), "outputSchema": ("outputSchema",)}
    name, description, input_schema, output_schema, annotations = fields
    if not isinstance(name, str) or not name:
        return _Unreadable(within, "the tool has no name", 'give it a "name"')
    if not isinstance(input_schema, dict):
        key = slots["inputSchema"]
        return _Unreadable(
            key if key[-1] in body else within,
            f"{name}: the input schema is missing or not an object",
            f'give it an "{key[-1]}" object schema',
        )
    return (
        name,
        description if isinstance(description, str) else "",
        input_schema,
        output_schema,
        dict(annotations),
        slots,
    )


def namespace_problem(namespace: str) -> str | None:
    """Why ``namespace`` cannot prefix spec ids, or None."""
    if NAMESPACE_RULE.fullmatch(namespace):
        return None
    return f"--namespace {namespace!r}: use lowercase words and dots, e.g. acme.crm"


def import_tools(
    tools: Iterable[Tool],
    source: Source,
    namespace: str,
    label: str,
    name_prefix: str = "",
    problems: Iterable[str] = (),
    side_effect: str | None = None,
) -> list[Imported]:
    """The spec files for ``tools``, all of them; ImportRefused lists every tool that cannot be
    imported (after the ``problems`` reading the file found)."""
    files, refused = import_each(
        tools, source, namespace, label, name_prefix, problems, side_effect
    )
    if refused:
        raise ImportRefused(refused)
    return files


def import_each(
    tools: Iterable[Tool],
    source: Source,
    namespace: str,
    label: str,
    name_prefix: str = "",
    problems: Iterable[str] = (),
    side_effect: str | None = None,
) -> tuple[list[Imported], list[str]]:
    """The spec files of the tools that convert, and one line for each that does not (after
    the ``problems`` reading the file found); ImportRefused for a bad ``namespace`` only.
    ``label`` names the file for tools made in code."""
    wrong = namespace_problem(namespace)
    if wrong is not None:
        raise ImportRefused([wrong])
    found = list(problems)
    files: dict[str, Imported] = {}
    for tool in tools:
        slug = _slug(tool.name)
        spec_id = f"{namespace}.{slug}.v1"
        path = f"{namespace.replace('.', '/')}/{slug}.v1.json"
        if path in files:
            found.append(
                tool.problem(
                    (),
                    f"{tool.name}: another tool of {label} also imports as {spec_id}",
                    "rename one of them in the file, or import them into two namespaces",
                )
            )
            continue
        notes: list[tuple[str, str, str]] = []
        try:
            spec = _spec(tool, source, spec_id, name_prefix, notes, side_effect)
        except _SlotRefused as refused:
            found.extend(
                tool.slot_problem(
                    refused.slot,
                    r.pointer,
                    f"{tool.name}: {r.reason}",
                    r.hint,
                )
                for r in refused.refusals
            )
            continue
        text = json.dumps(spec, indent=2, ensure_ascii=False) + "\n"
        lines = tuple(
            tool.slot_problem(slot, at, f"{tool.name}: {note}") for slot, at, note in notes
        )
        files[path] = Imported(path, text, lines)
    return list(files.values()), sorted(found, key=lambda line: _position(line, label))


def _position(line: str, label: str) -> tuple[int, int]:
    """Where a problem line of the file ``label`` points (line, column): its place in order."""
    head = line[len(label) + 1 :].split(":", 2) if line.startswith(f"{label}:") else []
    return (int(head[0]), int(head[1])) if len(head) == 3 and head[1].isdigit() else (0, 0)


class _SlotRefused(Exception):
    """A schema slot of a tool that cannot be converted: the slot and the refusals in it."""

    def __init__(self, slot: str, refusals: list[Refusal]) -> None:
        super().__init__(slot)
        self.slot = slot
        self.refusals = refusals


def _spec(
    tool: Tool,
    source: Source,
    spec_id: str,
    name_prefix: str,
    notes: list[tuple[str, str, str]],
    side_effect: str | None = None,
) -> dict[str, Any]:
    name = name_prefix + (tool.name if NAME_RULE.fullmatch(tool.name) else _safe_name(tool.name))
    spec: dict[str, Any] = {
        "id": spec_id,
        "name": name,
        "description": tool.description or tool.name,
    }
    hints = tool.annotations
    if hints.get("readOnlyHint") is True:
        spec["kind"] = "read_only"  # how the tool is described; no promise of replay safety
    # The side effect is never taken from a remote server's hints (seed 000: hints from remote
    # servers never prove replay safety): recovery may run a pure or idempotent call twice, so
    # only the user says so (--side-effect); else the conservative non_idempotent default.
    if side_effect is not None:
        spec["sideEffect"] = side_effect
    spec["inputSchema"] = _arguments(_converted(tool.input_schema, "inputSchema", notes))
    if isinstance(tool.output_schema, dict):
        spec["outputSchema"] = _converted(tool.output_schema, "outputSchema", notes)
    origin: dict[str, Any] = {"format": source, "name": tool.name}
    if hints:
        origin["annotations"] = hints
    spec["importedFrom"] = origin
    return spec


def _converted(schema: dict[str, Any], slot: str, notes: list[tuple[str, str, str]]) -> Any:
    """``schema`` in 2020-12, its notes added to ``notes`` as (slot, pointer, message);
    _SlotRefused names the slot of the places that cannot be converted."""
    try:
        converted = convert(schema)
    except NotConvertible as refused:
        raise _SlotRefused(slot, refused.refusals) from None
    notes.extend((slot, note.pointer, note.message) for note in converted.notes)
    return converted.schema


def _arguments(schema: Any) -> Any:
    """Tool arguments are always a JSON object, so an input schema that allows objects among
    other things (or says nothing about the type) is stated as an object schema: no argument
    list that can reach the tool changes verdict."""
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    if kind is None or (isinstance(kind, list) and "object" in kind):
        return {"type": "object", **{k: v for k, v in schema.items() if k != "type"}}
    return schema


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", name).lower()).strip(
        "-"
    )
    return slug if slug and slug[0].isalpha() else f"tool-{slug}"


def _safe_name(name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    return safe if safe[:1].isalpha() else f"t_{safe}"


def check_imported(specs: Path, files: list[Imported], package: str = DEFAULT_PACKAGE) -> list[str]:
    """What the build would find in ``files`` once written under ``specs`` beside the specs
    already there (ids and names unique, module, class and client method names free), one line
    each: checked before anything is written. ``package`` only words the messages."""
    return [line for _, line in _check(specs, files, package)]


def check_each(
    specs: Path, files: list[Imported], package: str = DEFAULT_PACKAGE
) -> tuple[list[Imported], list[str]]:
    """``files`` less those the build would refuse beside the specs under ``specs`` and beside
    each other, and a line for each problem of those left out. Checked again without them until
    none is left out: a file refused for a clash with another imported one (a taken name) frees
    that one."""
    refused: list[str] = []
    while files:
        found = _check(specs, files, package)
        if not found:
            break
        bad = {path for path, _ in found}
        refused.extend(line for _, line in found)
        files = [f for f in files if f.path not in bad]
    return files, refused


def _check(specs: Path, files: list[Imported], package: str) -> list[tuple[str, str]]:
    """(path, line) for each problem the build would find in ``files``."""
    from blade_codegen.dependencies import with_dependencies
    from blade_codegen.plan import plan
    from blade_codegen.resolve import resolve
    from blade_codegen.validate import validate

    tree = load(specs) if specs.is_dir() else SpecTree(specs, (), ())
    new = {
        f.path: SourceFile(
            specs, f.path, f.text, json.loads(f.text), hashlib.sha256(f.text.encode()).hexdigest()
        )
        for f in files
    }
    # The tree's own specs first: a clash with one of them is reported on the imported file.
    kept = tuple(source for source in tree.specs if source.rel not in new)
    candidate = with_dependencies(replace(tree, specs=(*kept, *new.values()), problems=()))
    problems = validate(candidate)
    if not problems:
        # Names are given in the build's later stages: resolve, then plan. The plan claims
        # names in the order it is given, so the tree's own specs go first here too.
        try:
            resolved = resolve(candidate)
            ordered = sorted(resolved.specs, key=lambda s: s.source.rel in new)
            plan(replace(resolved, specs=tuple(ordered)), package, "")  # "": no cache keys
        except SpecError as error:
            problems = list(error.problems)
    return [
        (problem.path, str(replace(problem, path=str(specs / problem.path))))
        for problem in problems
        if problem.path in new
    ]


def write_imported(
    specs: Path, files: list[Imported], force: bool
) -> tuple[list[str], list[str], list[str]]:
    """Write ``files`` under ``specs``, each in one step: (written, unchanged, clashes). A file
    that exists with other content is left alone unless ``force``, and named in ``clashes`` (one
    line each); the others are still written. OSError stops at the file that cannot be written:
    the ones before it are whole, and ``WriteStopped`` names them."""
    existing = {
        f.path: (specs / f.path).read_text("utf-8") for f in files if (specs / f.path).exists()
    }
    clashes = [
        f"{specs / f.path}: exists with other content (pass --force to replace it)"
        for f in files
        if existing.get(f.path, f.text) != f.text and not force
    ]
    written: list[str] = []
    unchanged: list[str] = []
    for file in files:
        before = existing.get(file.path)
        if before == file.text:
            unchanged.append(file.path)
        elif before is None or force:
            try:
                write_file(specs / file.path, file.text)
            except OSError as error:
                raise WriteStopped(error, written) from error
            written.append(file.path)
    return written, unchanged, clashes


class WriteStopped(OSError):
    """A spec file could not be written; ``written`` were, whole, before it."""

    def __init__(self, error: OSError, written: list[str]) -> None:
        super().__init__(error.errno, error.strerror or str(error), error.filename)
        self.written = written
