"""The tools the MCP conformance suite (``@modelcontextprotocol/conformance``) calls, as blade
specs and implementations: ``blade-runtime mcp fixture_tools:make_runtime`` serves them.

Each is what the suite's scenario asks of a server (``conformance list``, its descriptions), made
the blade way: content blocks through a projection, progress and log messages through
``ctx.progress`` and ``ctx.message``, a question to the user through a suspension whose resume
schema is the form. ``SPECS`` are built into the package ``blade_conformance_specs`` (the test
builds it into a temporary folder and puts it on the path of the server it starts).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from blade_runtime import ResumeEntry
from blade_runtime.core.content import Audio, EmbeddedResource, Image, Text
from blade_runtime.core.store import Store
from blade_runtime.runtime import Runtime

PACKAGE = "blade_conformance_specs"

# a 1x1 PNG and a silent WAV, as the suite's own fixture server sends
IMAGE = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5E"
    "rkJggg=="
)
AUDIO = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

NO_INPUT = {"type": "object", "properties": {}, "additionalProperties": False}
PROMPT = {"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}


def _spec(name: str, description: str, **more: Any) -> dict[str, Any]:
    return {
        "id": f"conformance.{name.replace('_', '-')}.v1",
        "name": name,
        "description": description,
        "kind": "read_only",
        "sideEffect": "pure",
        "inputSchema": NO_INPUT,
        **more,
    }


def _asking(name: str, description: str, point: str, resume: dict[str, Any]) -> dict[str, Any]:
    """A tool that asks the user one question (its suspension ``point``) before it answers."""
    return _spec(
        name,
        description,
        suspend={point: {"suspendSchema": PROMPT, "resumeSchema": resume}},
    )


NAME_FORM = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
CONFIRM_FORM = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}

SPECS: tuple[dict[str, Any], ...] = (
    _spec("test_simple_text", "Answers with one text block."),
    _spec("test_image_content", "Answers with an image block."),
    _spec("test_audio_content", "Answers with an audio block."),
    _spec("test_embedded_resource", "Answers with an embedded resource."),
    _spec("test_multiple_content_types", "Answers with text, an image and a resource."),
    _spec("test_tool_with_logging", "Logs three messages while it runs."),
    _spec("test_tool_with_progress", "Reports progress 0, 50 and 100 of 100."),
    _spec("test_error_handling", "Always fails."),
    _spec(
        "test_x_mcp_header",
        "Echoes its region, which the client mirrors into the Mcp-Param-Region header.",
        inputSchema={
            "type": "object",
            "properties": {
                "region": {
                    "type": "string",
                    "description": "Mirrored into the Mcp-Param-Region header",
                    "x-mcp-header": "Region",
                }
            },
            "additionalProperties": False,
        },
    ),
    _spec(
        "json_schema_2020_12_tool",
        "Lists JSON Schema 2020-12 keywords in its input schema.",
        inputSchema={
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "address": {
                    "$anchor": "addressDef",
                    "type": "object",
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                }
            },
            "properties": {
                "name": {"type": "string"},
                "address": {"$ref": "#/$defs/address"},
                "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                "phone": {"type": "string"},
                "email": {"type": "string"},
            },
            "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
            "if": {
                "properties": {"contactMethod": {"const": "phone"}},
                "required": ["contactMethod"],
            },
            "then": {"required": ["phone"]},
            "else": {"required": ["email"]},
            "additionalProperties": False,
        },
    ),
    # the input-required flow (protocol 2026-07-28): one question each
    _asking(
        "test_input_required_result_elicitation", "Asks the user's name.", "user_name", NAME_FORM
    ),
    _asking(
        "test_input_required_result_request_state",
        "Asks for a confirmation.",
        "confirm",
        CONFIRM_FORM,
    ),
    _asking(
        "test_input_required_result_tampered_state",
        "Asks for a confirmation.",
        "confirm",
        CONFIRM_FORM,
    ),
    _spec(
        "test_input_required_result_multi_round",
        "Asks the user's name, then their favourite colour.",
        suspend={
            "step1": {"suspendSchema": PROMPT, "resumeSchema": NAME_FORM},
            "step2": {
                "suspendSchema": PROMPT,
                "resumeSchema": {
                    "type": "object",
                    "properties": {"color": {"type": "string"}},
                    "required": ["color"],
                },
            },
        },
    ),
    # elicitation within the request (the protocol versions before 2026-07-28)
    _spec(
        "test_elicitation",
        "Asks the user the given message.",
        inputSchema={
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
        suspend={
            "answer": {
                "suspendSchema": PROMPT,
                "resumeSchema": {
                    "type": "object",
                    "properties": {
                        "response": {"type": "string", "description": "User's response"}
                    },
                    "required": ["response"],
                },
            }
        },
    ),
    _asking(
        "test_elicitation_sep1034_defaults",
        "Asks with a default for every primitive type (SEP-1034).",
        "user_information",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "default": "John Doe", "description": "User name"},
                "age": {"type": "integer", "default": 30, "description": "User age"},
                "score": {"type": "number", "default": 95.5, "description": "User score"},
                "status": {
                    "type": "string",
                    "enum": ["active", "inactive", "pending"],
                    "default": "active",
                    "description": "User status",
                },
                "verified": {
                    "type": "boolean",
                    "default": True,
                    "description": "Verification status",
                },
            },
        },
    ),
    _asking(
        "test_elicitation_sep1330_enums",
        "Asks with every kind of enum (SEP-1330).",
        "selection",
        {
            "type": "object",
            "properties": {
                "untitledSingle": {
                    "type": "string",
                    "description": "Simple enum without titles",
                    "enum": ["active", "inactive", "pending"],
                },
                "titledSingle": {
                    "type": "string",
                    "description": "Enum with titled options (oneOf)",
                    "oneOf": [
                        {"const": "low", "title": "Low Priority"},
                        {"const": "medium", "title": "Medium Priority"},
                        {"const": "high", "title": "High Priority"},
                    ],
                },
                "untitledMulti": {
                    "type": "array",
                    "description": "Multi-select without titles",
                    "items": {"type": "string", "enum": ["read", "write", "execute"]},
                },
                "titledMulti": {
                    "type": "array",
                    "description": "Multi-select with titled options",
                    "items": {
                        "anyOf": [
                            {"const": "feature", "title": "New Feature"},
                            {"const": "bug", "title": "Bug Fix"},
                            {"const": "docs", "title": "Documentation"},
                        ]
                    },
                },
                "legacyEnum": {
                    "type": "string",
                    "description": "Legacy enum with enumNames",
                    "enum": ["small", "medium", "large"],
                    "enumNames": ["Small Size", "Medium Size", "Large Size"],
                },
            },
            "required": ["untitledSingle", "titledSingle", "untitledMulti", "titledMulti"],
        },
    ),
)


async def simple_text(ctx: Any) -> Any:
    return "This is a simple text response for testing."


async def image_content(ctx: Any) -> Any:
    return {"image": IMAGE}


async def audio_content(ctx: Any) -> Any:
    return {"audio": AUDIO}


async def embedded_resource(ctx: Any) -> Any:
    return {"uri": "test://embedded-resource", "text": "This is an embedded resource content."}


async def multiple_content_types(ctx: Any) -> Any:
    return {"uri": "test://mixed-content-resource", "text": '{"test":"data","value":123}'}


async def with_logging(ctx: Any) -> Any:
    ctx.message("Tool execution started")
    await asyncio.sleep(0.05)
    ctx.message("Tool processing data")
    await asyncio.sleep(0.05)
    ctx.message("Tool execution completed")
    return "Tool with logging executed successfully"


async def with_progress(ctx: Any) -> Any:
    for done in (0, 50, 100):
        ctx.progress(f"Completed step {done} of 100", completed=done, total=100)
        if done < 100:
            await asyncio.sleep(0.05)
    return "Tool with progress executed successfully"


async def error_handling(ctx: Any) -> Any:
    ctx.fail("This tool intentionally returns an error for testing")


async def x_mcp_header(ctx: Any) -> Any:
    return f"region={ctx.input.region or '<none>'}"


async def json_schema_tool(ctx: Any) -> Any:
    return "json_schema_2020_12_tool"


def _asks(point: str, prompt: str, answered: Any) -> Any:
    """An implementation asking ``prompt`` at ``point``, then answering ``answered(payload)``."""

    async def implementation(ctx: Any) -> Any:
        if isinstance(ctx.entry, ResumeEntry):
            return answered(ctx.entry.payload)
        ctx.suspend(point, {"prompt": prompt})

    return implementation


async def multi_round(ctx: Any) -> Any:
    if not isinstance(ctx.entry, ResumeEntry):
        ctx.suspend("step1", {"prompt": "Step 1: What is your name?"})
    if ctx.entry.point == "step1":
        ctx.suspend("step2", {"prompt": "Step 2: What is your favorite color?"})
    name = next(e.resume for e in ctx.suspend_history if e.point == "step1")
    return f"{name['name']} likes {ctx.entry.payload.color}."


async def elicitation(ctx: Any) -> Any:
    if isinstance(ctx.entry, ResumeEntry):
        return f"User response: action=accept, content={ctx.entry.payload.model_dump_json()}"
    ctx.suspend("answer", {"prompt": ctx.input.message})


def _dumped(prefix: str) -> Any:
    return lambda payload: f"{prefix}: action=accept, content={payload.model_dump_json()}"


IMPLEMENTATIONS: dict[str, tuple[Any, Any]] = {
    "test_simple_text": (simple_text, None),
    "test_image_content": (image_content, lambda out: [Image(out["image"], "image/png")]),
    "test_audio_content": (audio_content, lambda out: [Audio(out["audio"], "audio/wav")]),
    "test_embedded_resource": (
        embedded_resource,
        lambda out: [EmbeddedResource(out["uri"], "text/plain", text=out["text"])],
    ),
    "test_multiple_content_types": (
        multiple_content_types,
        lambda out: [
            Text("Multiple content types test:"),
            Image(IMAGE, "image/png"),
            EmbeddedResource(out["uri"], "application/json", text=out["text"]),
        ],
    ),
    "test_tool_with_logging": (with_logging, None),
    "test_tool_with_progress": (with_progress, None),
    "test_error_handling": (error_handling, None),
    "test_x_mcp_header": (x_mcp_header, None),
    "json_schema_2020_12_tool": (json_schema_tool, None),
    "test_input_required_result_elicitation": (
        _asks("user_name", "What is your name?", lambda p: f"Hello, {p.name}!"),
        None,
    ),
    "test_input_required_result_request_state": (
        _asks("confirm", "Please confirm", lambda p: "state-ok: confirmation received"),
        None,
    ),
    "test_input_required_result_tampered_state": (
        _asks("confirm", "Please confirm", lambda p: f"state-ok: confirmed={p.ok}"),
        None,
    ),
    "test_input_required_result_multi_round": (multi_round, None),
    "test_elicitation": (elicitation, None),
    "test_elicitation_sep1034_defaults": (
        _asks("user_information", "Please provide user information", _dumped("Elicitation result")),
        None,
    ),
    "test_elicitation_sep1330_enums": (
        _asks(
            "selection",
            "Please select values using different enum schema types",
            _dumped("Elicitation completed"),
        ),
        None,
    ),
}


def make_runtime(store: Store | None = None) -> Runtime:
    """A runtime with every fixture tool (``blade-runtime mcp fixture_tools:make_runtime``)."""
    import importlib

    runtime = Runtime(store=store)
    for data in SPECS:
        namespace, module = str(data["id"]).split(".")[:2]
        spec = importlib.import_module(f"{PACKAGE}.{namespace}.{module.replace('-', '_')}_v1")
        implementation, project = IMPLEMENTATIONS[str(data["name"])]
        runtime.register(spec.SPEC, implementation, project=project)
    return runtime


def build_package(root: Path) -> Path:
    """Write ``SPECS`` under ``root/specs``, build them into ``root/out`` and return ``root/out``
    (put it on ``PYTHONPATH`` for the server)."""
    from blade_codegen.build import build

    for data in SPECS:
        path = root / "specs" / (str(data["id"]).replace(".", "/", 1) + ".json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2), "utf-8")
    build(root / "specs", root / "out", PACKAGE)
    return root / "out"
