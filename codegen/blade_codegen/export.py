"""``blade-codegen export``: the model-facing tool list, from the spec files alone.

No implementation is imported and no package is built: the specs are loaded, validated and
resolved as for a build, and handed to the runtime's exporters, so a runtime's ``export()`` and
this command produce the same document for the same tools.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from blade_codegen.resolve import ResolvedSpec, resolve_specs
from blade_runtime.core.export import ExportedTool, ExportFormat, ToolExport, export_tools
from blade_runtime.core.spec import ExecutionMode, SideEffect, ToolKind


def exported(spec: ResolvedSpec) -> ExportedTool:
    return ExportedTool(
        name=spec.name,
        id=spec.id,
        description=spec.description,
        input_schema=spec.input.bundled,
        output_schema=None if spec.output is None else spec.output.bundled,
        kind=cast(ToolKind | None, spec.kind),
        side_effect=cast(SideEffect, spec.side_effect),
        execution=cast(ExecutionMode, spec.execution),
        timeout_ms=spec.timeout_ms,
        title=spec.title,
        aliases=spec.aliases,
        group=spec.group,
    )


def export_specs(specs: Path, format: ExportFormat) -> ToolExport:
    """Every tool of the spec tree (backend and client) a model is offered (``exposure``
    ``model``) in ``format``, with the tree's guidance
    (``guidance.md``): in the ``blade`` document beside the tools, on the export for the rest."""
    resolved = resolve_specs(specs)
    tools = (exported(spec) for spec in resolved.specs if spec.exposure == "model")
    return export_tools(tools, format, resolved.tree.guidance)
