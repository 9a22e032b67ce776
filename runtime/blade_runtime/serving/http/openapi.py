"""The OpenAPI 3.1 document: each tool's call route and each pending action's submit route carry
that spec's own JSON Schemas, so an OpenAPI client generator gets typed bodies.

Each schema slot becomes a component (``<tool>.<slot>``); its local ``$defs`` become components
of their own and its ``#/$defs/...`` references point at them, so every reference resolves
against the document as OpenAPI tools expect.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from blade_runtime import __version__
from blade_runtime.core.registry import Registration

_NAME = re.compile(r"[^A-Za-z0-9._-]")
_ERROR = {
    "type": "object",
    "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
    "required": ["code", "message"],
}


def _component(name: str) -> str:
    return _NAME.sub("_", name)


def _hoist(schema: Mapping[str, Any], name: str, components: dict[str, Any]) -> dict[str, str]:
    """Put ``schema`` (and its ``$defs``) into ``components``; returns a reference to it."""
    base = _component(name)
    defs = schema.get("$defs", {})
    names = {key: f"{base}.{_component(key)}" for key in defs}

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                    out[key] = _target(value)
                elif key == "$defs":
                    continue
                else:
                    out[key] = rewrite(value)
            return out
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        return node

    def _target(ref: str) -> str:
        pointer = ref[1:]
        if pointer in ("", "/"):
            return f"#/components/schemas/{base}"
        if pointer.startswith("/$defs/"):
            key, _, rest = pointer[len("/$defs/") :].partition("/")
            key = key.replace("~1", "/").replace("~0", "~")
            if key in names:
                return f"#/components/schemas/{names[key]}" + (f"/{rest}" if rest else "")
        return f"#/components/schemas/{base}{pointer}"

    root = rewrite(schema)
    root.pop("$schema", None)
    components[base] = root
    for key, value in defs.items():
        hoisted = rewrite(value)
        if isinstance(hoisted, dict):
            hoisted.pop("$schema", None)
        components[names[key]] = hoisted
    return {"$ref": f"#/components/schemas/{base}"}


def _json(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    ref = {"$ref": "#/components/schemas/Error"}
    return {str(status): {"description": "an error", **_json(ref)} for status in statuses}


def _action_id() -> dict[str, Any]:
    return {"name": "action_id", "in": "path", "required": True, "schema": {"type": "string"}}


def openapi_document(registrations: Iterable[Registration[Any]]) -> dict[str, Any]:
    components: dict[str, Any] = {"Error": _ERROR}
    paths: dict[str, Any] = {}
    for registration in registrations:
        spec = registration.spec
        tool = registration.name
        input_ref = _hoist(spec.input_schema, f"{tool}.input", components)
        success: dict[str, Any] = {
            "type": "object",
            "properties": {
                "status": {"const": "success"},
                "call_id": {"type": "string"},
                "run_id": {"type": "string"},
                "output": (
                    _hoist(spec.output_schema, f"{tool}.output", components)
                    if spec.output_schema is not None
                    else {}
                ),
                "content": {},
            },
            "required": ["status", "call_id", "run_id", "output"],
        }
        paths[f"/v1/tools/{tool}/calls"] = {
            "post": {
                "operationId": f"call_{_component(tool)}",
                "summary": spec.description,
                "parameters": [
                    {"name": "Idempotency-Key", "in": "header", "schema": {"type": "string"}},
                    {"name": "run_id", "in": "query", "schema": {"type": "string"}},
                    {"name": "thread_id", "in": "query", "schema": {"type": "string"}},
                ],
                "requestBody": {"required": True, **_json(input_ref)},
                "responses": {
                    "200": {"description": "the tool's result", **_json(success)},
                    "202": {"description": "the call waits on a pending action"},
                    **_errors(400, 401, 403, 404, 409, 413, 422, 424, 500, 502, 503, 504),
                },
            }
        }
        submits: list[tuple[str, str, Mapping[str, Any]]] = [
            (
                f"/v1/tools/{tool}/points/{point.name}/submit/{{action_id}}",
                f"{tool}.{point.name}",
                point.resume.schema,
            )
            for point in registration.points.values()
        ]
        if spec.execution == "client" and spec.output_schema is not None:
            submits.append(
                (f"/v1/tools/{tool}/output/submit/{{action_id}}", tool, spec.output_schema)
            )
        for path, kind, schema in submits:
            ref = _hoist(schema, f"{kind}.submit", components)
            paths[path] = {
                "post": {
                    "operationId": f"submit_{_component(kind)}",
                    "summary": f"Resolve a pending {kind} action",
                    "parameters": [_action_id()],
                    "requestBody": {"required": True, **_json(ref)},
                    "responses": {
                        "200": {"description": "the resumed call's result"},
                        "202": {"description": "the call waits again"},
                        **_errors(400, 401, 404, 409, 413, 422, 500),
                    },
                }
            }
    generic = {
        "/v1/tools": {"get": {"operationId": "list_tools", "responses": {"200": {}}}},
        "/v1/calls/{call_id}": {
            "get": {
                "operationId": "read_call",
                "parameters": [
                    {"name": "call_id", "in": "path", "required": True, "schema": {}},
                    {"name": "channel", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {"200": {"description": "the call"}, **_errors(401, 404)},
            }
        },
        "/v1/runs/{run_id}/calls": {
            "get": {"operationId": "run_calls", "responses": {"200": {"description": "calls"}}}
        },
        "/v1/runs/{run_id}/events": {
            "get": {
                "operationId": "run_events",
                "summary": "Server-Sent Events; resume with Last-Event-ID",
                "responses": {"200": {"content": {"text/event-stream": {}}}},
            }
        },
        "/v1/files/{file_id}": {
            "get": {
                "operationId": "read_file",
                "summary": "A file a tool saved (ctx.files), of the principal's tenant",
                "parameters": [{"name": "file_id", "in": "path", "required": True, "schema": {}}],
                "responses": {
                    "200": {"description": "the file's content, with its media type"},
                    **_errors(401, 404),
                },
            }
        },
        "/v1/actions": {
            "get": {"operationId": "list_actions", "responses": {"200": {"description": "list"}}}
        },
        "/v1/actions/{action_id}": {
            "get": {"operationId": "read_action", "parameters": [_action_id()], "responses": {}}
        },
        "/v1/actions/{action_id}/submit": {
            "post": {"operationId": "submit_action", "parameters": [_action_id()], "responses": {}}
        },
        "/v1/actions/{action_id}/cancel": {
            "post": {"operationId": "cancel_action", "parameters": [_action_id()], "responses": {}}
        },
        "/v1/actions/{action_id}/fail": {
            "post": {"operationId": "fail_action", "parameters": [_action_id()], "responses": {}}
        },
        "/v1/grants": {
            "get": {
                "operationId": "list_grants",
                "summary": "the caller's standing permission grants (an operator's: all)",
                "responses": {"200": {"description": "list"}},
            }
        },
        "/v1/grants/{grant_id}": {
            "delete": {
                "operationId": "revoke_grant",
                "parameters": [
                    {
                        "name": "grant_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    }
                ],
                "responses": {"200": {"description": "revoked"}, "404": {"description": "none"}},
            }
        },
    }
    paths.update(generic)
    return {
        "openapi": "3.1.0",
        "info": {"title": "blade-runtime", "version": __version__},
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }
