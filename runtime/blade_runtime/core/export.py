"""Model-facing tool lists: our manifest, and the OpenAI, Anthropic and MCP shapes.

The same records come from a runtime's registrations or, through ``blade-codegen export``, from
the spec files alone. Where a provider's name rules are stricter than ours (OpenAI and Anthropic
refuse dots), each name is mapped to a provider-safe wire name, and back, without collisions: a
name that is already valid keeps itself, the others get their invalid characters replaced and, on a
clash or when too long, a short hash of the original name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

from pydantic import JsonValue

from blade_runtime.core.spec import ExecutionMode, JsonObject, SideEffect, ToolKind

ExportFormat: TypeAlias = Literal["blade", "openai", "anthropic", "mcp"]
EXPORT_FORMATS: tuple[ExportFormat, ...] = ("blade", "openai", "anthropic", "mcp")


@dataclass(frozen=True, slots=True)
class NameRule:
    """A provider's tool-name rule: allowed characters and maximum length."""

    invalid: re.Pattern[str]
    max_length: int
    text: str


NAME_RULES: Mapping[ExportFormat, NameRule] = {
    "blade": NameRule(re.compile(r"[^A-Za-z0-9_.-]"), 1 << 16, "^[A-Za-z][A-Za-z0-9_.-]*$"),
    "openai": NameRule(re.compile(r"[^A-Za-z0-9_-]"), 64, "^[a-zA-Z0-9_-]{1,64}$"),
    "anthropic": NameRule(re.compile(r"[^A-Za-z0-9_-]"), 64, "^[a-zA-Z0-9_-]{1,64}$"),
    "mcp": NameRule(re.compile(r"[^A-Za-z0-9_.-]"), 128, "^[A-Za-z0-9_.-]{1,128}$"),
}


@dataclass(frozen=True, slots=True)
class ExportedTool:
    """What a model may learn about one tool. Server context never appears here."""

    name: str
    id: str
    description: str
    input_schema: JsonObject
    output_schema: JsonObject | None
    kind: ToolKind | None
    side_effect: SideEffect
    execution: ExecutionMode
    timeout_ms: int
    title: str | None = None  # the display name (MCP's ``title``)
    aliases: tuple[str, ...] = ()  # more names it is called by (the blade manifest lists them)
    group: str | None = None


@dataclass(frozen=True, slots=True)
class WireNames:
    """The two-way mapping between registration names and one provider's wire names."""

    to_wire: Mapping[str, str]
    from_wire: Mapping[str, str]

    def wire(self, name: str) -> str:
        return self.to_wire[name]

    def name(self, wire: str) -> str:
        """The registration name behind a wire name the provider sent back (KeyError if none)."""
        return self.from_wire[wire]


@dataclass(frozen=True, slots=True)
class ToolExport:
    """A tool list in one format, and the name mapping to call tools back by their wire name."""

    format: ExportFormat
    document: JsonValue
    names: WireNames
    guidance: str | None = None
    """The tools' guidance for the model (the seed's skills ``{guidance, tools}``): in the
    ``blade`` document beside the tools; the other formats are tool lists with no place for it,
    so it goes where the application puts the model's instructions."""


def wire_names(names: Iterable[str], rule: NameRule) -> WireNames:
    """Provider-safe, collision-free wire names; the result does not depend on input order."""
    pending = sorted(set(names))
    to_wire: dict[str, str] = {}
    taken: set[str] = set()
    for name in pending:
        if _fits(name, rule):
            to_wire[name] = name
            taken.add(name)
    for name in pending:
        if name in to_wire:
            continue
        candidate = rule.invalid.sub("_", name)
        if len(candidate) > rule.max_length or candidate in taken:
            digest = hashlib.sha256(name.encode()).hexdigest()[:8]
            candidate = f"{candidate[: rule.max_length - 9]}_{digest}"
        to_wire[name] = candidate
        taken.add(candidate)
    return WireNames(to_wire, {wire: name for name, wire in to_wire.items()})


def export_tools(
    tools: Iterable[ExportedTool], format: ExportFormat, guidance: str | None = None
) -> ToolExport:
    """The tool list in ``format``, sorted by registration name, with its ``guidance``."""
    ordered = sorted(tools, key=lambda tool: tool.name)
    names = wire_names((tool.name for tool in ordered), NAME_RULES[format])
    render = _RENDERERS[format]
    entries: list[JsonValue] = [render(tool, names.wire(tool.name)) for tool in ordered]
    document: JsonValue = entries if format in ("openai", "anthropic") else {"tools": entries}
    if guidance is not None and format == "blade":
        document = {"guidance": guidance, "tools": entries}
    return ToolExport(format, document, names, guidance)


def joined_guidance(texts: Iterable[str | None]) -> str | None:
    """Each distinct guidance once, in first-seen order, a blank line between them."""
    distinct = list(dict.fromkeys(text for text in texts if text))
    return "\n\n".join(distinct) if distinct else None


def _fits(name: str, rule: NameRule) -> bool:
    return 0 < len(name) <= rule.max_length and rule.invalid.search(name) is None


def _blade(tool: ExportedTool, wire: str) -> JsonValue:
    entry: dict[str, JsonValue] = {
        "name": wire,
        "id": tool.id,
        "description": tool.description,
        "execution": tool.execution,
        "side_effect": tool.side_effect,
        "timeout_ms": tool.timeout_ms,
        "input_schema": dict(tool.input_schema),
    }
    if tool.kind is not None:
        entry["kind"] = tool.kind
    if tool.output_schema is not None:
        entry["output_schema"] = dict(tool.output_schema)
    if tool.title is not None:
        entry["title"] = tool.title
    if tool.aliases:
        entry["aliases"] = list(tool.aliases)
    if tool.group is not None:
        entry["group"] = tool.group
    return entry


def _openai(tool: ExportedTool, wire: str) -> JsonValue:
    function: dict[str, JsonValue] = {
        "name": wire,
        "description": tool.description,
        "parameters": dict(tool.input_schema),
    }
    return {"type": "function", "function": function}


def _anthropic(tool: ExportedTool, wire: str) -> JsonValue:
    return {"name": wire, "description": tool.description, "input_schema": dict(tool.input_schema)}


def _mcp(tool: ExportedTool, wire: str) -> JsonValue:
    entry: dict[str, JsonValue] = {
        "name": wire,
        "description": tool.description,
        "inputSchema": dict(tool.input_schema),
    }
    if tool.title is not None:
        entry["title"] = tool.title
    # MCP's structuredContent is an object, so only an object output schema can be announced.
    if tool.output_schema is not None and tool.output_schema.get("type") == "object":
        entry["outputSchema"] = dict(tool.output_schema)
    entry["annotations"] = {
        "readOnlyHint": tool.kind == "read_only",
        "idempotentHint": tool.side_effect != "non_idempotent",
    }
    return entry


_RENDERERS = {"blade": _blade, "openai": _openai, "anthropic": _anthropic, "mcp": _mcp}
