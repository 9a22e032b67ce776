"""Large results as artifacts: what the model reads of a result stays bounded (seed 000: "large-
result artifact persistence applies to model, not data").

Above the size a runtime or a registration sets (``large_result_bytes``), the model-facing content
of a success is saved as a durable file of the call (``ctx.files``'s, in the call's tenant) and
the model reads content blocks instead: a ``Text`` with the first characters of the result and a
sentence saying where the rest is, and a ``ResourceLink`` to ``blade://files/<file id>``. Every
surface already carries content blocks: MCP clients read the link with ``resources/read``, HTTP
clients with ``GET /v1/files/{file_id}``, both scoped to the caller's tenant. The typed output
and ToolData are never offloaded: the stored call keeps the output whole (``output`` beside the
content), and the typed client and HTTP's ``output`` read it.
"""

from __future__ import annotations

from typing import Any

from pydantic import JsonValue

from blade_runtime.core.content import ResourceLink, Text, block_json
from blade_runtime.core.context import CallInfo, CancellationSignal
from blade_runtime.core.files import FileAccess
from blade_runtime.core.jsonvalue import compact_json
from blade_runtime.core.results import ToolSuccess
from blade_runtime.core.store import Claim

SCHEME = "blade://files/"
"""The URI of a call's file, as a resource link names it (``resources/read`` reads it)."""

HEAD_CHARS = 2000
"""At most this many characters of an offloaded result are read by the model (and at most
half the limit)."""


def body_of(content: JsonValue) -> tuple[bytes, str]:
    """The model-facing content as a file's bytes and media type: a sentence as text, any other
    JSON as its compact text."""
    if isinstance(content, str):
        return content.encode("utf-8", "surrogatepass"), "text/plain; charset=utf-8"
    return compact_json(content).encode("utf-8", "surrogatepass"), "application/json"


async def offload(
    files: FileAccess,
    call: CallInfo,
    signal: CancellationSignal,
    claim: Claim | None,
    done: ToolSuccess[Any],
    limit: int,
) -> ToolSuccess[Any]:
    """``done`` as the model should read it: itself when its content is at most ``limit``
    bytes, else with that content saved as a file of the call and the model reading its head
    and a link. A save that fails raises (``FileRejected``, ``LeaseNotHeld``, a store error)."""
    body, media_type = body_of(done.content)
    if len(body) <= limit:
        return done
    suffix = "txt" if media_type.startswith("text/") else "json"
    saved = await files.save(call, signal, f"{call.name}-result.{suffix}", body, media_type, claim)
    text = body.decode("utf-8", "surrogatepass")
    head = text[: min(HEAD_CHARS, max(limit // 2, 1))]
    uri = SCHEME + saved.file_id
    note = (
        f"[The result is {len(body)} bytes, over the {limit} bytes this tool hands the model: "
        f"above are its first {len(head)} characters. The whole result is the resource {uri}.]"
    )
    link = ResourceLink(
        uri,
        saved.name,
        media_type,
        f"The whole result of call {call.call_id} ({len(body)} bytes).",
        size=len(body),
    )
    content: JsonValue = [block_json(Text(f"{head}\n\n{note}")), block_json(link)]
    # The typed output stays whole: kept beside the content, as a projection's output is.
    output_json = done.output_json
    if output_json is None and not done.rewritten:
        output_json = done.content
    return ToolSuccess(
        done.call,
        done.output,
        content,
        done.display,
        output_json=output_json,
        rewritten=done.rewritten,
        artifact=saved.file_id,
        metadata=done.metadata,
    )
