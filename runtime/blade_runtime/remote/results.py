"""What a remote tool's answer becomes: a typed output, content blocks, or a failure with a code.

A ``CallToolResult`` with ``isError`` is a failure the model reads (TOOL_FAILED, its text); a
JSON-RPC error is one of our codes (invalid parameters: INVALID_INPUT; an unknown tool:
TOOL_UNAVAILABLE; a timeout: TIMEOUT; the rest: TOOL_ERROR); a broken connection is
TOOL_UNAVAILABLE. ``structuredContent`` is the output where the tool has an output schema; else
the output is the content blocks, in MCP's JSON shapes (which are ours: ``core.content``), so the
model reads them as they came. A block of a type we do not know becomes a line of text saying
so; a result larger than the bridge's limit is a failure, never a 10 MB string in a context.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import JsonValue

from blade_runtime.core.content import BLOCK_TYPES
from blade_runtime.core.context import ToolFailed

# JSON-RPC error codes (the spec's), and what a call that met them settles as.
INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601
REQUEST_TIMEOUT = -32001
CONNECTION_CLOSED = -32000
_CODES = {INVALID_PARAMS: "INVALID_INPUT", METHOD_NOT_FOUND: "TOOL_UNAVAILABLE"}
_KEEP = {
    "text": ("text",),
    "image": ("data", "mimeType"),
    "audio": ("data", "mimeType"),
    "resource_link": ("uri", "name", "mimeType", "description", "title", "size"),
    "resource": ("resource",),
}


def blocks_of(content: Any) -> list[JsonValue]:
    """MCP content blocks as the JSON the model reads (unknown kinds as a line of text)."""
    blocks: list[JsonValue] = []
    for block in content if isinstance(content, list) else ():
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in BLOCK_TYPES:
            blocks.append({"type": "text", "text": f"(content of an unsupported type: {kind!r})"})
            continue
        assert isinstance(block, dict)
        kept: dict[str, JsonValue] = {"type": kind}
        for key in _KEEP[kind]:
            if block.get(key) is not None:
                kept[key] = block[key]
        if kind == "resource" and isinstance(kept.get("resource"), dict):
            resource = kept["resource"]
            assert isinstance(resource, dict)
            kept["resource"] = {
                key: resource[key] for key in ("uri", "mimeType", "text", "blob") if key in resource
            }
        blocks.append(kept)
    return blocks


def text_of(blocks: list[JsonValue]) -> str:
    """The text blocks of a failure, as the sentence the model reads."""
    texts = [b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)]
    return " ".join(str(t) for t in texts).strip() or "The remote tool reported an error."


def answer(result: Any, *, structured: bool, tool: str, limit: int) -> JsonValue:
    """The output of a ``CallToolResult`` (its JSON, ``result``), or ``ToolFailed``."""
    if not isinstance(result, dict):
        raise ToolFailed(f"The remote tool {tool} returned a malformed result.", "TOOL_ERROR")
    size = len(json.dumps(result, ensure_ascii=False))
    if size > limit:
        raise ToolFailed(
            f"The remote tool {tool} returned {size} bytes, more than the {limit} this bridge "
            "accepts; ask for less (a narrower query, a page of the result).",
            "INVALID_OUTPUT",
        )
    blocks = blocks_of(result.get("content"))
    if result.get("isError"):
        raise ToolFailed(text_of(blocks)[:4000])
    if structured:
        output: JsonValue = result.get("structuredContent")
        if output is None:
            raise ToolFailed(
                f"The remote tool {tool} returned no structured content for its output schema.",
                "INVALID_OUTPUT",
            )
        return output
    return blocks


def failure(error: BaseException, tool: str) -> ToolFailed:
    """A JSON-RPC error (``MCPError``) or a refusal of the SDK's, as one of our codes."""
    code = getattr(error, "code", None)
    if isinstance(code, int):
        message = str(getattr(error, "message", "") or "")[:500]
        if code == REQUEST_TIMEOUT:
            return ToolFailed(f"The remote tool {tool} did not answer in time.", "TIMEOUT")
        if code == CONNECTION_CLOSED:
            return ToolFailed(
                f"The connection to the server of {tool} was lost during the call; it may or "
                "may not have taken effect.",
                "TOOL_UNAVAILABLE",
            )
        return ToolFailed(
            f"The remote tool {tool} refused the call: {message}", _CODES.get(code, "TOOL_ERROR")
        )
    if isinstance(error, RuntimeError) and "structured content" in str(error):
        return ToolFailed(
            f"The remote tool {tool} returned output its output schema rejects.", "INVALID_OUTPUT"
        )
    return ToolFailed(f"The remote tool {tool} returned a malformed result.", "TOOL_ERROR")
