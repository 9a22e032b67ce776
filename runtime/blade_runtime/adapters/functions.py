"""The runtime's tools as every adapter builds them: the callable registrations under the OpenAI
name rule (the strictest one the frameworks share), each with its schema unchanged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blade_runtime.core.caller import CallContext
from blade_runtime.core.registry import Registration
from blade_runtime.runtime import Runtime


@dataclass(frozen=True)
class ExportedFunction:
    wire: str
    """The name the framework and the model see."""
    registration: Registration[Any]
    description: str
    parameters: dict[str, Any]
    """The spec's input schema, as exported."""


def exported_functions(
    runtime: Runtime, context: CallContext | None = None, run_id: str = "default"
) -> list[ExportedFunction]:
    """The tools ``runtime.export`` gives for ``context`` (see it), with their registrations."""
    exported = runtime.export("openai", context=context, run_id=run_id)
    document = exported.document
    assert isinstance(document, list)
    registrations = {r.name: r for r in runtime.registrations()}
    found = []
    for entry in document:
        assert isinstance(entry, dict) and isinstance(entry["function"], dict)
        function = entry["function"]
        wire = str(function["name"])
        parameters = function["parameters"]
        assert isinstance(parameters, dict)
        found.append(
            ExportedFunction(
                wire,
                registrations[exported.names.name(wire)],
                str(function["description"]),
                dict(parameters),
            )
        )
    return found
