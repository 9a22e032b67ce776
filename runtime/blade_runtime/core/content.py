"""What the model reads of a result: projections of the typed output, and content blocks.

A registration may give ``project=``: a function from the typed output to what the model reads,
a sentence (``str``), any JSON value, or content blocks (``Text``, ``Image``, ``ResourceLink``).
The stored and typed output stay whole; errors bypass the projection; a stored call can be
projected again (``Runtime.reproject``) after the projection changed. Content blocks are stored
and announced as JSON (``{"type": "text", "text": ...}``, MCP's shapes) and rendered for each
provider by ``to_mcp`` and ``to_anthropic``. ``Audio`` and ``EmbeddedResource`` (a resource's
contents in the result itself) are MCP's; for Anthropic they become a line of text.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, TypeVar

from pydantic import JsonValue


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Image:
    """An image for the model: base64 ``data`` of ``mime_type`` (``image/png``, ...)."""

    data: str
    mime_type: str


@dataclass(frozen=True, slots=True)
class Audio:
    """Audio for the model: base64 ``data`` of ``mime_type`` (``audio/wav``, ...)."""

    data: str
    mime_type: str


@dataclass(frozen=True, slots=True)
class EmbeddedResource:
    """A resource's contents in the result (MCP's ``resource``): ``text``, or base64 ``blob``."""

    uri: str
    mime_type: str | None = None
    text: str | None = None
    blob: str | None = None


@dataclass(frozen=True, slots=True)
class ResourceLink:
    """A link to a resource the client can fetch (MCP's ``resource_link``)."""

    uri: str
    name: str
    mime_type: str | None = None
    description: str | None = None
    size: int | None = None  # bytes, when known


Block: TypeAlias = Text | Image | Audio | ResourceLink | EmbeddedResource
_BLOCKS = (Text, Image, Audio, ResourceLink, EmbeddedResource)
Projected: TypeAlias = str | JsonValue | Sequence[Block]
Projection: TypeAlias = Callable[[Any], Projected]
OutputT_contra = TypeVar("OutputT_contra", contravariant=True)


class ProjectionWithContext(Protocol[OutputT_contra]):
    """A projection that also reads the call's typed input and its ``CallInfo`` (it may be
    async): ``def project(output, *, input, call)``."""

    def __call__(
        self, output: OutputT_contra, /, *, input: Any, call: Any
    ) -> Projected | Awaitable[Projected]: ...


BLOCK_TYPES = frozenset({"text", "image", "audio", "resource_link", "resource"})


def block_json(block: Block) -> dict[str, JsonValue]:
    if isinstance(block, Text):
        return {"type": "text", "text": block.text}
    if isinstance(block, Image | Audio):
        kind = "image" if isinstance(block, Image) else "audio"
        return {"type": kind, "data": block.data, "mimeType": block.mime_type}
    if isinstance(block, EmbeddedResource):
        contents: dict[str, JsonValue] = {"uri": block.uri}
        if block.mime_type is not None:
            contents["mimeType"] = block.mime_type
        if block.blob is not None:
            contents["blob"] = block.blob
        else:
            contents["text"] = block.text or ""
        return {"type": "resource", "resource": contents}
    link: dict[str, JsonValue] = {"type": "resource_link", "uri": block.uri, "name": block.name}
    if block.mime_type is not None:
        link["mimeType"] = block.mime_type
    if block.description is not None:
        link["description"] = block.description
    if block.size is not None:
        link["size"] = block.size
    return link


async def project(
    registration: Any, output: Any, typed_input: Callable[[], Any], call: Any
) -> JsonValue:
    """What the model reads of ``output`` through the registration's projection, which may be
    async and may take ``input=`` (the typed input) and ``call=`` (the CallInfo) keywords. The
    same stored output, input and call always give the same value (``reproject``)."""
    function = registration.project
    value = (
        function(output, input=typed_input(), call=call)
        if registration.project_context
        else function(output)
    )
    if inspect.isawaitable(value):
        value = await value
    return projected(value)[0]


def takes_context(function: Callable[..., Any]) -> bool:
    """Whether a projection takes the ``input=`` and ``call=`` keywords."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature: the output only
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return True
    return "input" in parameters and "call" in parameters


def projected(value: Projected) -> tuple[JsonValue, bool]:
    """A projection's value as the JSON the model reads, and whether it is content blocks."""
    if (
        isinstance(value, list | tuple)
        and value
        and all(isinstance(item, _BLOCKS) for item in value)
    ):
        return [block_json(item) for item in value], True  # type: ignore[arg-type]
    if isinstance(value, _BLOCKS):
        return [block_json(value)], True
    return value, False  # type: ignore[return-value]  # str or JSON: read as it is


def is_blocks(content: JsonValue) -> bool:
    return (
        isinstance(content, list)
        and bool(content)
        and all(isinstance(item, dict) and item.get("type") in BLOCK_TYPES for item in content)
    )


def to_mcp(content: JsonValue) -> list[dict[str, JsonValue]]:
    """Content as MCP ``CallToolResult.content``: blocks as they are, anything else as text."""
    if is_blocks(content):
        assert isinstance(content, list)
        return [dict(item) for item in content if isinstance(item, dict)]
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    return [{"type": "text", "text": text}]


def to_anthropic(content: JsonValue) -> list[dict[str, JsonValue]]:
    """Content as the ``content`` of an Anthropic ``tool_result`` block."""
    blocks: list[dict[str, JsonValue]] = []
    for item in to_mcp(content):
        if item["type"] == "image":
            source: dict[str, JsonValue] = {
                "type": "base64",
                "media_type": item["mimeType"],
                "data": item["data"],
            }
            blocks.append({"type": "image", "source": source})
        elif item["type"] == "resource_link":
            blocks.append({"type": "text", "text": f"{item['name']}: {item['uri']}"})
        elif item["type"] == "audio":
            blocks.append({"type": "text", "text": f"(audio, {item['mimeType']})"})
        elif item["type"] == "resource":
            resource = item["resource"]
            assert isinstance(resource, dict)
            shown = resource.get("text", f"(binary, {resource.get('mimeType')})")
            blocks.append({"type": "text", "text": f"{resource['uri']}: {shown}"})
        else:
            blocks.append({"type": "text", "text": item["text"]})
    return blocks
