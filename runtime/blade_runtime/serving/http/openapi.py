"""The OpenAPI 3.1 document: each tool's call route and each pending action's submit route carry
that spec's own JSON Schemas, so an OpenAPI client generator gets typed bodies.

Each schema slot becomes a component (``<tool>.<slot>``); its local ``$defs`` become components
of their own and its ``#/$defs/...`` references point at them, so every reference resolves
against the document as OpenAPI tools expect.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from blade_runtime import __version__
from blade_runtime.core.registry import Registration

_NAME = re.compile(r"[^A-Za-z0-9._-]")


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


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(status): {"description": "an error", **_json(_ref("Error"))} for status in statuses}


def _path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _query(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "description": description, "schema": {"type": "string"}}


_TEXT: Final = {"type": "string"}
_NULLABLE_TEXT: Final = {"type": ["string", "null"]}
_METADATA: Final = {
    "type": "object",
    "description": "what the tool attached to its result with ctx.metadata (absent: nothing); "
    "for the application, never shown to the model",
}
_EFFECTS: Final = {
    "type": "array",
    "description": "what the call changed beyond its result (ctx.effects), in order (absent: "
    "nothing): a context patch of its run, a message, a permission change",
    "items": {"$ref": "#/components/schemas/Effect"},
}
_NEXT: Final = {
    "type": ["string", "null"],
    "description": "the next page's cursor (null: this is the last page)",
}
_PAGE: Final = (
    _query("limit", "records on the page: 1 to 1000 (default 100)"),
    _query("cursor", "the next page: the cursor the page before gave"),
)
_SHARED: Final[dict[str, Any]] = {
    "Error": {
        "type": "object",
        "properties": {
            "code": _TEXT,
            "message": _TEXT,
            "metadata": _METADATA,
            "effects": _EFFECTS,
        },
        "required": ["code", "message"],
    },
    "Action": {
        "type": "object",
        "description": "A pending action: a suspension's question, or a client tool's call.",
        "properties": {
            "kind": _TEXT,
            "action_id": _TEXT,
            "name": _TEXT,
            "tool": _TEXT,
            "spec_id": _TEXT,
            "point": _NULLABLE_TEXT,
            "call_id": _TEXT,
            "run_id": _TEXT,
            "principal_id": _NULLABLE_TEXT,
            "thread_id": {
                "type": ["string", "null"],
                "description": "the thread of the call that asks (its caller's thread_id)",
            },
            "agent_id": {
                "type": ["string", "null"],
                "description": "the agent that ran the call (its caller's agent_id)",
            },
            "suspended_at": _TEXT,
            "input": {"description": "the suspend payload (a client tool's input)"},
            "state": {"enum": ["pending", "submitted", "cancelled", "failed", "expired"]},
            "resolved_at": _NULLABLE_TEXT,
            "reason": _NULLABLE_TEXT,
            "expires_at": {"type": ["number", "null"]},
            "description": _NULLABLE_TEXT,
            "title": {"type": ["string", "null"], "description": "the tool's display name"},
            "submit_schema": {"type": "object", "description": "what a submission must meet"},
        },
        "required": ["kind", "action_id", "name", "tool", "spec_id", "call_id", "run_id"],
    },
    "Pending": {
        "type": "object",
        "description": "The call waits on a pending action.",
        "properties": {
            "status": {"const": "pending"},
            "call_id": _TEXT,
            "run_id": _TEXT,
            "action": _ref("Action"),
        },
        "required": ["status", "call_id", "run_id", "action"],
    },
    "Result": {
        "type": "object",
        "description": "A call's result: success, skipped by a hook, or pending.",
        "properties": {
            "status": {"enum": ["success", "skipped", "pending"]},
            "call_id": _TEXT,
            "run_id": _TEXT,
            "output": {},
            "content": {},
            "artifact": {
                "type": "object",
                "description": "What the model reads was over the tool's large_result_bytes: "
                "the whole of it is this file of the call (content is its head and a link).",
                "properties": {"file_id": _TEXT, "url": _TEXT},
                "required": ["file_id", "url"],
            },
            "reason": _TEXT,
            "action": _ref("Action"),
            "metadata": _METADATA,
            "effects": _EFFECTS,
        },
        "required": ["status", "call_id", "run_id"],
    },
    "Settled": {
        "type": "object",
        "description": "A call settled as cancelled or failed by the request.",
        "properties": {
            "status": {"const": "error"},
            "call_id": _TEXT,
            "run_id": _TEXT,
            "code": {"enum": ["CANCELLED", "TOOL_FAILED"]},
            "message": _TEXT,
        },
        "required": ["status", "call_id", "run_id", "code", "message"],
    },
    "Call": {
        "type": "object",
        "properties": {
            "call_id": _TEXT,
            "run_id": _TEXT,
            "name": _TEXT,
            "spec_id": _TEXT,
            "state": _TEXT,
            "started_at": _NULLABLE_TEXT,
            "input": {},
            "result": {},
            "thread_id": {
                "type": ["string", "null"],
                "description": "the thread the call belongs to (its caller's thread_id)",
            },
            "agent_id": {
                "type": ["string", "null"],
                "description": "the agent executing the call (its caller's agent_id)",
            },
            "data": {"type": "object", "description": "ToolData records by channel"},
            "suspensions": {
                "type": "array",
                "description": "Every suspend point the call waited at, oldest first (the "
                "pending one last): action_id, name, input, suspended_at, state, and once "
                "resolved resolved_at (and resume, the answer, when submitted).",
                "items": {"type": "object"},
            },
            "pending_suspension": {
                "description": "The episode still waiting, or null.",
                "anyOf": [{"type": "object"}, {"type": "null"}],
            },
            "slots": {
                "type": "array",
                "description": "The call's concurrency slots and resource locks (a tool's "
                "concurrency and locks), each held or waited for, in every worker: key "
                "(tool:NAME or lock:...), held, capacity.",
                "items": {
                    "type": "object",
                    "properties": {
                        "key": _TEXT,
                        "held": {"type": "boolean"},
                        "capacity": {"type": "integer"},
                    },
                    "required": ["key", "held", "capacity"],
                },
            },
            "waiting": {
                "type": "boolean",
                "description": "Whether the running call waits for a slot or a lock (its "
                "deadline has not started).",
            },
        },
        "required": ["call_id", "run_id", "name", "state"],
    },
    "Calls": {
        "type": "object",
        "properties": {"calls": {"type": "array", "items": _ref("Call")}, "next": _NEXT},
        "required": ["calls", "next"],
    },
    "Actions": {
        "type": "object",
        "properties": {"actions": {"type": "array", "items": _ref("Action")}, "next": _NEXT},
        "required": ["actions", "next"],
    },
    "Tools": {
        "type": "object",
        "properties": {
            "tools": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": _TEXT,
                        "spec_id": _TEXT,
                        "execution": {"enum": ["backend", "client"]},
                        "description": _TEXT,
                        "points": {"type": "array", "items": _TEXT},
                        "title": _NULLABLE_TEXT,
                        "aliases": {"type": "array", "items": _TEXT},
                        "group": _NULLABLE_TEXT,
                        "exposure": {"enum": ["model", "operator"]},
                    },
                    "required": ["name", "spec_id", "execution", "description", "points"],
                },
            }
        },
        "required": ["tools"],
    },
    "Effect": {
        "type": "object",
        "properties": {
            "effect_id": _TEXT,
            "type": {"enum": ["context_patch", "message", "permission"]},
            "value": {},
            "at": _TEXT,
        },
        "required": ["effect_id", "type", "value", "at"],
    },
    "RunContext": {
        "type": "object",
        "description": "The run's context: its tools' context patches, merged in order",
        "properties": {"run_id": _TEXT, "context": {"type": "object"}},
        "required": ["run_id", "context"],
    },
    "Grant": {
        "type": "object",
        "properties": {
            "grant_id": _TEXT,
            "tenant": _TEXT,
            "principal": _TEXT,
            "tool": _TEXT,
            "subject": _TEXT,
            "created_at": _TEXT,
            "action_id": _NULLABLE_TEXT,
            "spec_id": _TEXT,
            "point": _TEXT,
        },
        "required": ["grant_id", "tenant", "principal", "tool", "subject", "created_at"],
    },
    "Grants": {
        "type": "object",
        "properties": {"grants": {"type": "array", "items": _ref("Grant")}, "next": _NEXT},
        "required": ["grants", "next"],
    },
    "Revoked": {
        "type": "object",
        "properties": {"revoked": _ref("Grant")},
        "required": ["revoked"],
    },
    "Cancel": {
        "type": "object",
        "properties": {"reason": {"type": "string", "minLength": 1}},
    },
    "Fail": {
        "type": "object",
        "properties": {"error": {"type": "string", "minLength": 1}},
        "required": ["error"],
    },
}


def openapi_document(registrations: Iterable[Registration[Any]]) -> dict[str, Any]:
    """The document of ``registrations`` (the tools a caller may call) and the routes every
    caller has; it validates as OpenAPI 3.1 (openapi-spec-validator, in the tests)."""
    components: dict[str, Any] = dict(_SHARED)
    paths: dict[str, Any] = {}
    for registration in registrations:
        spec = registration.spec
        tool = registration.name
        input_ref = _hoist(spec.input_schema, f"{tool}.input", components)
        success: dict[str, Any] = {
            "type": "object",
            "properties": {
                "status": {"const": "success"},
                "call_id": _TEXT,
                "run_id": _TEXT,
                "output": (
                    _hoist(spec.output_schema, f"{tool}.output", components)
                    if spec.output_schema is not None
                    else {}
                ),
                "content": {},
                "metadata": _METADATA,
                "effects": _EFFECTS,
            },
            "required": ["status", "call_id", "run_id", "output"],
        }
        paths[f"/v1/tools/{tool}/calls"] = {
            "post": {
                "operationId": f"call_{_component(tool)}",
                "summary": spec.description,
                "parameters": [
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "description": "the call id: a retry gets the first call's answer",
                        "schema": _TEXT,
                    },
                    _query("run_id", "the run the call belongs to (default: default)"),
                    _query("thread_id", "passed on to the call's context"),
                    _query("agent_id", "the agent running the call, passed on to its context"),
                ],
                "requestBody": {"required": True, **_json(input_ref)},
                "responses": {
                    "200": {"description": "the tool's result", **_json(success)},
                    "202": {
                        "description": "the call waits on a pending action",
                        **_json(_ref("Pending")),
                    },
                    **_errors(400, 401, 403, 404, 409, 413, 415, 422, 424, 500, 502, 503, 504),
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
                    "parameters": [_path("action_id")],
                    "requestBody": {"required": True, **_json(ref)},
                    "responses": {
                        "200": {
                            "description": "the resumed call's result",
                            **_json(_ref("Result")),
                        },
                        "202": {"description": "the call waits again", **_json(_ref("Pending"))},
                        **_errors(400, 401, 404, 409, 413, 415, 422, 500),
                    },
                }
            }
    paths.update(_GENERIC)
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


def _get(operation: str, summary: str, answer: str, *parameters: Any, errors: Any = ()) -> Any:
    return {
        "get": {
            "operationId": operation,
            "summary": summary,
            "parameters": list(parameters),
            "responses": {
                "200": {"description": summary, **_json(_ref(answer))},
                **_errors(401, *errors),
            },
        }
    }


def _settle(operation: str, summary: str, body: str, required: bool) -> Any:
    return {
        "post": {
            "operationId": operation,
            "summary": summary,
            "parameters": [_path("action_id")],
            "requestBody": {"required": required, **_json(_ref(body))},
            "responses": {
                "200": {"description": "the call, settled so", **_json(_ref("Settled"))},
                **_errors(400, 401, 404, 409, 415),
            },
        }
    }


_GENERIC: Final[dict[str, Any]] = {
    "/v1/tools": _get("list_tools", "the tools the caller may call", "Tools"),
    "/v1/calls/{call_id}": _get(
        "read_call",
        "a call: its state, result and data by channel",
        "Call",
        _path("call_id"),
        _query("channel", "only this ToolData channel"),
        errors=(404,),
    ),
    "/v1/runs/{run_id}/calls": _get(
        "run_calls", "a page of the run's calls", "Calls", _path("run_id"), *_PAGE, errors=(400,)
    ),
    "/v1/runs/{run_id}/context": _get(
        "run_context",
        "the run's context for the principal's calls (ctx.effects.patch_context)",
        "RunContext",
        _path("run_id"),
    ),
    "/v1/runs/{run_id}/events": {
        "get": {
            "operationId": "run_events",
            "summary": "Server-Sent Events of the run; resume with Last-Event-ID",
            "parameters": [
                _path("run_id"),
                {"name": "Last-Event-ID", "in": "header", "schema": _TEXT},
                _query("after", "the sequence number to follow"),
            ],
            "responses": {
                "200": {
                    "description": "the run's events",
                    "content": {"text/event-stream": {"schema": _TEXT}},
                },
                **_errors(400, 401, 404, 429),
            },
        }
    },
    "/v1/files/{file_id}": {
        "get": {
            "operationId": "read_file",
            "summary": "A file a tool saved (ctx.files), of the principal's tenant",
            "parameters": [_path("file_id")],
            "responses": {
                "200": {
                    "description": "the file's content, with its media type",
                    "content": {
                        "application/octet-stream": {
                            "schema": {"type": "string", "format": "binary"}
                        }
                    },
                },
                **_errors(401, 404),
            },
        }
    },
    "/v1/actions": _get(
        "list_actions",
        "the actions the caller may see",
        "Actions",
        _query("state", "pending (default), submitted, cancelled, failed, expired or any"),
        _query("run_id", "only this run's"),
        _query("tool", "only this tool's"),
        _query("waiting_over", "only those waiting longer than this many seconds"),
        _query("waiting_under", "only those waiting less long than this many seconds"),
        _query("thread_id", "only those of calls of this thread"),
        _query("agent_id", "only those of calls this agent runs"),
        *_PAGE,
        errors=(400,),
    ),
    "/v1/actions/{action_id}": _get(
        "read_action", "one action", "Action", _path("action_id"), errors=(404,)
    ),
    "/v1/actions/{action_id}/submit": {
        "post": {
            "operationId": "submit_action",
            "summary": "Resolve an action with its resume payload (a client tool's output)",
            "parameters": [_path("action_id")],
            "requestBody": {"required": True, **_json({})},
            "responses": {
                "200": {"description": "the resumed call's result", **_json(_ref("Result"))},
                "202": {"description": "the call waits again", **_json(_ref("Pending"))},
                **_errors(400, 401, 404, 409, 413, 415, 422, 500),
            },
        }
    },
    "/v1/actions/{action_id}/cancel": _settle(
        "cancel_action", "Settle the action's call as cancelled", "Cancel", False
    ),
    "/v1/actions/{action_id}/fail": _settle(
        "fail_action", "Settle the action's call as failed", "Fail", True
    ),
    "/v1/grants": _get(
        "list_grants",
        "the caller's standing permission grants (an operator's: all)",
        "Grants",
        _query("tool", "only this tool's"),
        *_PAGE,
        errors=(400,),
    ),
    "/v1/grants/{grant_id}": {
        "delete": {
            "operationId": "revoke_grant",
            "summary": "Revoke a standing grant: its requests are asked again",
            "parameters": [_path("grant_id")],
            "responses": {
                "200": {"description": "the revoked grant", **_json(_ref("Revoked"))},
                **_errors(401, 403, 404),
            },
        }
    },
}
