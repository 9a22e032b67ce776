"""Whether a remote tool still has the schemas its spec was imported from.

The check is ``blade-codegen check``'s own (``blade_codegen.compat``), direction-aware: the
input is what our callers send and the server accepts, so a change that *narrows* it breaks
them; the output is what the server emits and our readers parse, so a change that *widens* it
breaks them. The runtime installs without the code generator: where it is missing, the schemas
are compared exactly, and any difference counts as incompatible (safe, never lenient).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class Drift:
    """One difference: where (a JSON pointer into the tool's listing), what, and whether it
    breaks our side."""

    pointer: str
    change: str
    breaks: bool


def _pointer(slot: str, path: tuple[Any, ...]) -> str:
    parts = [slot, *(str(p).replace("~", "~0").replace("/", "~1") for p in path)]
    return "/" + "/".join(parts)


def drift(spec_schema: Any, remote_schema: Any, slot: str) -> list[Drift]:
    """The differences of ``remote_schema`` from ``spec_schema`` in ``slot`` (``inputSchema``:
    accepted by the server; ``outputSchema``: emitted by it)."""
    if spec_schema is None:
        return []  # the spec reads any output: nothing the server emits can break it
    if remote_schema is None:
        return [Drift(_pointer(slot, ()), "the server declares no schema any more", True)]
    try:
        from blade_codegen.compat import compare
    except ImportError:  # the runtime alone: exact comparison
        same = json.dumps(spec_schema, sort_keys=True) == json.dumps(remote_schema, sort_keys=True)
        detail = "the schema changed (blade-codegen is not installed: compared exactly)"
        return [] if same else [Drift(_pointer(slot, ()), detail, True)]
    direction: Literal["accepting", "emitting"] = (
        "accepting" if slot == "inputSchema" else "emitting"
    )
    return [
        Drift(
            _pointer(slot, change.schema_path),
            f"{change.rule}: {change.detail}",
            change.breaks(direction),
        )
        for change in compare(spec_schema, remote_schema)
        if change.effect != "none"
    ]
