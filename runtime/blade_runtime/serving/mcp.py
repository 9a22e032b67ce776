"""The runtime's tools served over MCP, on the official SDK's low-level server (``[mcp]`` extra).
Each function takes a ``Runtime``, or any ``McpBackend`` (``blade_runtime.serving.mcp_backend``:
tools on Temporal are ``TemporalBackend`` of ``blade_runtime.serving.mcp_temporal``).

    server = mcp_server(runtime, principal=Principal("ann", "acme"))   # mcp.server.lowlevel.Server
    await serve_stdio(runtime)                                          # stdio
    app = mcp_asgi_app(runtime, authenticate=...)                       # streamable HTTP (ASGI)

``tools/list`` is the runtime's MCP export (names, schemas, annotations from kind and side effect;
the SDK advertises the schemas, the runtime applies them). ``tools/call`` goes through
``runtime.call``: a result carries structured content and its JSON text; an error is an
``isError`` result whose structured content holds our stable code (``{"error": CODE,
"message": ...}``, the code also in ``_meta``). What reaches the client is what the model reads:
where the registration projects its output (``register(..., project=...)``), the projection,
never the whole output, in the content and the structured content alike (a sentence or content
blocks have no structured content), and such a tool announces no output schema (the
projection need not have the output's shape).

A call that waits on a pending action becomes MCP's input-required flow (protocol 2026-07-28)
when the client can elicit: a form elicitation when the resume schema is flat (top-level
primitive properties), else a URL elicitation to the approval inbox (``inbox_url=``). The
request state carries only the action's id: on the retry the action is looked up in the store
and checked against the principal stored with its call (and its tenant), never trusted from the
client; an accepted form goes to ``runtime.submit`` (an invalid answer asks again and leaves the
action pending), a decline to ``runtime.cancel``, a dismissal leaves it pending. Any worker
sharing the store can take the retry. The input request's key is the suspension point
(``input_key``), and an answer sent under it with the first call is taken. On older protocol
versions the form is asked within the request where the connection carries it (stdio, HTTP with
sessions). Elsewhere, and for clients that cannot elicit, the result is the pending action
(``{"pending": ..., "action_id": ...}``); it is an ``isError`` result only where the tool
announces an output schema, which a call that has no output yet cannot match.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import inspect
import itertools
import json
import logging
import os
import secrets
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator, Mapping
from dataclasses import dataclass
from types import coroutine as types_coroutine
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import mcp_types as types
from mcp.server.connection import allowed_log_levels
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.shared.inbound import x_mcp_header_map
from mcp_types import INVALID_PARAMS, INVALID_REQUEST
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import JsonValue, ValidationError
from pydantic_core import from_json

from blade_runtime.core.artifacts import SCHEME
from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.content import is_blocks, to_mcp
from blade_runtime.core.context import parent_ids
from blade_runtime.core.effects import effects_json
from blade_runtime.core.export import NAME_RULES, wire_names
from blade_runtime.core.jsonvalue import compact_json
from blade_runtime.core.registry import Registration
from blade_runtime.core.results import ErrorCode
from blade_runtime.core.store import ActionRecord, storable_id
from blade_runtime.runtime import Runtime
from blade_runtime.serving.mcp_backend import McpBackend, Outcome, backend_of
from blade_runtime.serving.mcp_limits import STDIO_LIMITS, StdioLimits
from blade_runtime.serving.trace_context import call_context, traceparent

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = [
    "Authenticate",
    "McpRequest",
    "McpTools",
    "flat_form_schema",
    "input_key",
    "mcp_asgi_app",
    "mcp_server",
    "serve_stdio",
]

log = logging.getLogger("blade_runtime.serving.mcp")
# log notifications are sent on purpose to the protocol versions that have them (the SDK warns
# of the capability's deprecation in 2026-07-28 at every first use)
warnings.filterwarnings(
    "ignore", category=MCPDeprecationWarning, module=r"blade_runtime\.serving\.mcp$"
)
T = TypeVar("T")


def input_key(action: ActionRecord) -> str:
    """The key of the input request a suspended call asks for: its suspension point (what the
    answer is to, ``"confirm"``), or ``"output"`` for a client tool's pending output."""
    return "output" if action.point is None else action.point.lstrip("@")


META = "io.blade"  # our keys in a result's _meta (and a request's: thread_id, agent_id)
RESOURCE_NOT_FOUND = -32002  # MCP's code for a resources/read of an unknown URI
_STATE_PREFIX = "blade2."
STATE_KEY_ENV = "BLADE_MCP_STATE_KEY"
"""The environment variable holding the key request states are signed with, shared by the
workers that answer one another's retries (else each server makes one of its own)."""


class McpRequest:
    """One MCP request as the server sees it: the negotiated protocol version, the client's
    capabilities, the HTTP request (streamable HTTP; None on stdio and in memory) and the SDK's
    request context (None on the HTTP fast path)."""

    __slots__ = ("_capabilities", "call_id", "context", "http", "protocol_version")

    def __init__(
        self,
        protocol_version: str,
        capabilities: Any,
        http: Request | None = None,
        context: ServerRequestContext[Any, Any] | None = None,
        call_id: str | None = None,
    ) -> None:
        self.protocol_version = protocol_version
        self._capabilities = capabilities  # a ClientCapabilities, or its raw JSON (parsed lazily)
        self.http = http
        self.context = context
        self.call_id = call_id  # the call's id, when the transport must be able to cancel it

    @staticmethod
    def of(ctx: ServerRequestContext[Any, Any]) -> McpRequest:
        http = ctx.request if _is_http(ctx.request) else None
        return McpRequest(ctx.protocol_version, ctx.session.client_capabilities, http, ctx)

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        raw = self._capabilities
        if raw is None or isinstance(raw, types.ClientCapabilities):
            return raw
        parsed: types.ClientCapabilities | None
        try:
            parsed = types.ClientCapabilities.model_validate(raw)
        except ValueError:
            parsed = None
        self._capabilities = parsed
        return parsed


def _is_http(request: Any) -> bool:
    from starlette.requests import Request

    return isinstance(request, Request)


Authenticate: TypeAlias = Callable[[McpRequest], Principal | Awaitable[Principal | None] | None]
"""The application's function from an MCP request (``request.http`` is the HTTP request on
streamable HTTP, with its headers) to its authenticated principal, or None for none."""

_PRIMITIVE = frozenset({"string", "number", "integer", "boolean"})
_FORM_KEYS = frozenset(
    {
        "type",
        "title",
        "description",
        "default",
        "enum",
        "enumNames",
        "oneOf",
        "format",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "items",
        "minItems",
        "maxItems",
    }
)
_FORM_FORMATS = frozenset({"date", "date-time", "email", "uri"})


def flat_form_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """``schema`` as an MCP form's requested schema when it is flat (an object of top-level
    primitive properties, or arrays of enum strings), else None (a URL elicitation is needed).

    Only the keywords a form may carry are kept; the runtime still validates the answer against
    the whole resume schema (a pattern, say), and asks again when it is refused."""
    if schema.get("type") != "object" or not isinstance(schema.get("properties"), dict):
        return None
    if any(key in schema for key in ("$ref", "allOf", "anyOf", "oneOf", "if", "patternProperties")):
        return None
    properties: dict[str, Any] = {}
    for name, prop in schema["properties"].items():
        form = _form_property(prop)
        if form is None:
            return None
        properties[name] = form
    requested: dict[str, Any] = {"type": "object", "properties": properties}
    required = schema.get("required")
    if isinstance(required, list) and required:
        requested["required"] = [str(name) for name in required]
    return requested


def _form_property(prop: Any) -> dict[str, Any] | None:
    if not isinstance(prop, dict):
        return None
    kind = prop.get("type")
    if kind is None and isinstance(prop.get("enum"), list):
        if not all(isinstance(value, str) for value in prop["enum"]):
            return None
        kind = "string"
    if kind == "array":  # a multi-select: of an enum, or of titled choices (SEP-1330)
        items = prop.get("items")
        if not isinstance(items, dict) or not _string_choices(items):
            return None
    elif kind not in _PRIMITIVE:
        return None
    if "enum" in prop and not all(isinstance(value, str) for value in prop["enum"]):
        return None  # forms offer string choices only
    form = {key: value for key, value in prop.items() if key in _FORM_KEYS}
    form["type"] = kind
    if form.get("format") not in (None, *_FORM_FORMATS):
        del form["format"]
    return form


def _string_choices(items: Mapping[str, Any]) -> bool:
    """Whether a multi-select's ``items`` offer string choices a form can show: an ``enum`` of
    strings, or ``anyOf`` (``oneOf``) of ``{"const": ..., "title": ...}`` with string consts."""
    if isinstance(items.get("enum"), list):
        return all(isinstance(value, str) for value in items["enum"])
    titled = items.get("anyOf", items.get("oneOf"))
    return (
        isinstance(titled, list)
        and bool(titled)
        and all(isinstance(c, dict) and isinstance(c.get("const"), str) for c in titled)
    )


@dataclass(frozen=True, slots=True)
class _Listing:
    generation: int  # the registrations' (Tools.generation) it was made of
    result: types.ListToolsResult
    from_wire: Mapping[str, str]
    to_wire: Mapping[str, str]
    structured: frozenset[str]  # wire names that announce an output schema
    input_schemas: Mapping[str, Mapping[str, Any]]
    headed: frozenset[str]  # wire names whose input schema declares Mcp-Param headers


class McpTools:
    """The MCP handlers over one backend: a runtime, or tools on Temporal (``mcp_server`` wires
    them into a Server). Every MCP rule is here; what it asks of where the tools run is the
    ``McpBackend`` protocol (``blade_runtime.serving.mcp_backend``)."""

    def __init__(
        self,
        runtime: Runtime | McpBackend,
        *,
        principal: Principal | None = None,
        authenticate: Authenticate | None = None,
        inbox_url: str | Callable[[McpRequest], str | None] | None = None,
        run_id: str = "mcp",
        anonymous: bool = False,
        signing_key: bytes | None = None,
    ) -> None:
        """``principal``: who every call is for (a stdio server has one user); ``authenticate``:
        or the application's function of the request, whose None refuses the request unless
        ``anonymous`` (then it is anonymous, as with neither). ``inbox_url``: the approval
        inbox, for resume schemas a form cannot hold (``{action_id}`` in it is replaced by the
        action's id; otherwise the id is appended as a path segment), or a function of the
        request giving it. ``signing_key``: what request states are signed with (default:
        ``$BLADE_MCP_STATE_KEY``, else a key of this server's own)."""
        self.backend = backend_of(runtime)
        self.runtime = self.backend.runtime  # the registrations: listing, schemas, guidance
        self.principal = principal
        self.authenticate = authenticate
        self.anonymous = anonymous
        self.inbox_url = inbox_url
        self.run_id = run_id
        self.state_key = state_key() if signing_key is None else signing_key
        self.log_level: str | None = None  # set by a stdio client's logging/setLevel
        self.requests: dict[Any, str] | None = None
        """The call id of each request in flight, by request id, on a transport that serves one
        connection (stdio) and passes its client's cancellations on (``cancel_request``)."""
        self._listing: _Listing | None = None

    # -- tools/list ---------------------------------------------------------------------------

    def listing(self, context: CallContext | None = None) -> _Listing:
        """The tool list for ``context`` (a registration's ``enabled`` and ``describe`` may
        depend on the caller); cached while no registration depends on it."""
        listing = self._current()
        if listing is not None:  # one comparison per call, however many tools there are
            return listing
        if self.runtime.tools.caller_dependent():
            return self._build(context)  # the caller's own: never kept
        self._listing = self._build(None)
        return self._listing

    def _current(self) -> _Listing | None:
        """The kept listing, while the registrations are those it was made of."""
        listing = self._listing
        if listing is None or listing.generation != self.runtime.tools.generation:
            return None
        return listing

    def _build(self, context: CallContext | None) -> _Listing:
        generation = self.runtime.tools.generation
        exported = self.runtime.export("mcp", context=context, run_id=self.run_id)
        document = exported.document
        assert isinstance(document, dict) and isinstance(document["tools"], list)
        tools: list[types.Tool] = []
        structured: set[str] = set()
        for entry in document["tools"]:
            assert isinstance(entry, dict)
            name = str(entry["name"])
            registration = next(
                r for r in self.runtime.registrations() if r.name == exported.names.name(name)
            )
            exported_tool = registration.exported()
            hints = entry.get("annotations")
            annotations = types.ToolAnnotations(
                read_only_hint=isinstance(hints, dict) and hints.get("readOnlyHint") is True,
                idempotent_hint=isinstance(hints, dict) and hints.get("idempotentHint") is True,
                # a write or execute tool may destroy; a pure tool never does
                destructive_hint=(
                    None
                    if exported_tool.kind == "read_only"
                    else exported_tool.side_effect != "pure"
                ),
            )
            output = entry.get("outputSchema")
            if registration.project is not None or registration.large_result_bytes is not None:
                # the client gets the projection, or a large result's head and link: neither
                # need be the output's shape
                output = None
            if isinstance(output, dict):
                structured.add(name)
            tools.append(
                types.Tool(
                    name=name,
                    title=registration.title,
                    description=str(entry["description"]),
                    input_schema=dict(entry["inputSchema"]),  # type: ignore[arg-type]
                    output_schema=dict(output) if isinstance(output, dict) else None,
                    annotations=annotations,
                )
            )
        return _Listing(
            generation,
            types.ListToolsResult(tools=tools),
            exported.names.from_wire,
            exported.names.to_wire,
            frozenset(structured),
            {tool.name: tool.input_schema for tool in tools},
            frozenset(tool.name for tool in tools if x_mcp_header_map(tool.input_schema)),
        )

    def input_schema(self, wire: str) -> Mapping[str, Any] | None:
        """The input schema of the tool listed as ``wire`` (None: no such tool), whoever asks
        (the SDK checks Mcp-Param headers with it before any handler runs)."""
        listing = self._current()
        if listing is not None:
            return listing.input_schemas.get(wire)
        registration = self._registration(wire)
        return None if registration is None else registration.spec.input_schema

    def declares_headers(self, wire: str) -> bool:
        """Whether the tool listed as ``wire`` declares ``x-mcp-header`` parameters, whose
        ``Mcp-Param-*`` headers the SDK checks (SEP-2243)."""
        listing = self._current()
        if listing is not None:
            return wire in listing.headed
        schema = self.input_schema(wire)
        return schema is not None and bool(x_mcp_header_map(schema))

    def _names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self._offered())

    def _offered(self) -> Iterator[Registration[Any]]:
        """The registrations a model may be offered (an operator tool never is)."""
        return (r for r in self.runtime.registrations() if r.offered_to_models)

    def _registration(self, wire: str) -> Registration[Any] | None:
        """The registration listed as ``wire``, whoever asks (None: none)."""
        name = wire_names(self._names(), NAME_RULES["mcp"]).from_wire.get(wire, wire)
        found = self.runtime.tools.by_name.get(name)  # by its name, or by an alias
        return found if found is not None and found.offered_to_models else None

    def _announces_output(self, wire: str) -> bool:
        """Whether the tool listed as ``wire`` announces an output schema (MCP's structured
        content can only be an object, so only an object schema is announced)."""
        listing = self._current()
        if listing is not None:
            return wire in listing.structured
        registration = self._registration(wire)
        if registration is None or registration.project is not None:
            return False
        output = registration.spec.output_schema
        return isinstance(output, dict) and output.get("type") == "object"

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        principal = await self._principal(McpRequest.of(ctx))
        return self.listing(CallContext(principal=principal)).result

    # -- resources/read: a call's files (a large result saved as one: core.artifacts) ----------

    async def read_resource(
        self, ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        """A file of a call, by the ``blade://files/<id>`` a resource link names: only the
        caller's tenant's (another tenant's is as unknown as one never saved)."""
        principal = await self._principal(McpRequest.of(ctx))
        uri = str(params.uri)
        body = None
        if uri.startswith(SCHEME):
            body = await self.backend.file(uri[len(SCHEME) :], principal)
        if body is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {uri}", {"uri": uri})
        media_type = body.file.media_type
        if media_type.startswith("text/") or media_type == "application/json":
            try:
                text = body.content.decode("utf-8")
            except UnicodeDecodeError:
                pass
            else:
                return types.ReadResourceResult(
                    contents=[types.TextResourceContents(uri=uri, mime_type=media_type, text=text)]
                )
        blob = base64.b64encode(body.content).decode("ascii")
        return types.ReadResourceResult(
            contents=[types.BlobResourceContents(uri=uri, mime_type=media_type, blob=blob)]
        )

    # -- tools/call ---------------------------------------------------------------------------

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        answer = await self.handle(McpRequest.of(ctx), params)
        return answer.model() if isinstance(answer, TextResult) else answer

    async def handle(self, req: McpRequest, params: types.CallToolRequestParams) -> Answer:
        """One tools/call (the SDK's handler, and the HTTP fast path, call this)."""
        principal = await self._principal(req)
        listing = self.listing(CallContext(principal=principal))
        name = listing.from_wire.get(params.name, params.name)
        hidden = self.runtime.tools.by_name.get(name)
        if hidden is not None and not hidden.offered_to_models:  # an operator tool
            return _error(ErrorCode.TOOL_HANDLER_NOT_FOUND, f"There is no tool named {name!r}.")
        if params.request_state is not None:
            return await self._retry(req, params, principal, name)
        context = _request_context(principal, params.meta)
        arguments = params.arguments or {}
        ctx = req.context if self.backend.reports else None  # progress needs an event stream
        progress = ctx is not None and _wants_progress(ctx)
        logs = ctx is not None and self._wants_logs(ctx)
        watched = progress or logs
        request_id = None if req.context is None else req.context.request_id
        request = None if request_id is None else coerce_request_id(request_id)
        if not watched and req.call_id is None and (self.requests is None or request is None):
            result = await self.backend.call(
                name, arguments, call_id=None, run_id=self.run_id, context=context
            )
            return await self._answer(
                req, result, params.name, principal, responses=params.input_responses
            )
        call_id = req.call_id or next(_CALL_IDS)
        if self.requests is not None and request is not None:
            if self.requests.get(request) == _CANCELLED:  # before it started: nothing runs
                del self.requests[request]
                return _error(ErrorCode.CANCELLED, "The tool call was cancelled before it started.")
            self.requests[request] = call_id  # where the client's cancellation finds it
        try:
            if watched:
                assert req.context is not None
                result = await self._reporting(
                    req.context, name, arguments, context, call_id, progress, logs
                )
            else:
                result = await self.backend.call(
                    name, arguments, call_id=call_id, run_id=self.run_id, context=context
                )
        finally:
            if self.requests is not None and self.requests.get(request) == call_id:
                del self.requests[request]
        return await self._answer(
            req, result, params.name, principal, responses=params.input_responses
        )

    def cancel_request(self, request_id: Any, reason: str | None) -> None:
        """The client cancelled its request ``request_id``: cancel its call, saying why."""
        if self.requests is None:
            return
        call_id = self.requests.get(request_id)
        if call_id is None:  # not started yet (or not a tools/call): it will not run
            self.requests[request_id] = _CANCELLED
        elif call_id != _CANCELLED:
            self.backend.cancel_call(call_id, client_cancelled(reason))

    def forget_request(self, request_id: Any) -> None:
        """``request_id`` was answered: a later request may use its id."""
        if self.requests is not None and self.requests.get(request_id) == _CANCELLED:
            del self.requests[request_id]

    def cancel_requests(self, reason: str) -> None:
        """Cancel the call of every request still running (the connection is ending)."""
        for call_id in list((self.requests or {}).values()):
            if call_id != _CANCELLED:
                self.backend.cancel_call(call_id, reason)

    async def _reporting(
        self,
        ctx: ServerRequestContext[Any, Any],
        name: str,
        arguments: dict[str, Any],
        context: CallContext,
        call_id: str,
        progress: bool = True,
        logs: bool = False,
    ) -> Outcome:
        """A call whose client asked for progress (``progress``): its ``ctx.progress`` events,
        and its child calls', become ``notifications/progress`` (its messages, their text), in
        order, while it runs; or for log messages (``logs``): its ``ctx.message`` events become
        ``notifications/message`` (level info, the tool's name as the logger).

        MCP wants a request's progress never to go back: each notification carries the largest
        ``completed`` sent so far (0 before any), so a message, a progress without ``completed``
        or a smaller one goes with the last value and its total. A child's count is of its own
        work, not the request's: its progress goes with the request's last value too."""
        subscription = await self.backend.subscribe(self.run_id)

        async def forward() -> None:
            last = 0.0
            last_total: float | None = None
            async for event in subscription:
                if event.kind not in ("progress", "message"):
                    continue
                own = event.call_id == call_id
                if not own and call_id not in parent_ids(event.call_id):
                    continue
                payload = event.payload if isinstance(event.payload, dict) else {}
                completed = payload.get("completed") if event.kind == "progress" and own else None
                total = payload.get("total") if event.kind == "progress" else None
                text = payload.get("message") if event.kind == "progress" else event.payload
                if isinstance(completed, int | float) and completed > last:
                    last = float(completed)
                    last_total = float(total) if isinstance(total, int | float) else None
                elif completed == last and isinstance(total, int | float):
                    last_total = float(total)
                line = text if isinstance(text, str) else json.dumps(text)
                try:
                    if logs and event.kind == "message":
                        await ctx.session.send_log_message(
                            "info", line, logger=name, related_request_id=ctx.request_id
                        )
                    if progress:
                        await ctx.session.report_progress(last, last_total, line)
                except Exception as error:  # a client gone is not the tool's failure
                    log.warning("MCP progress for %s not sent: %s", call_id, error)
                    return

        pump = asyncio.create_task(forward())
        try:
            return await self.backend.call(
                name, arguments, call_id=call_id, run_id=self.run_id, context=context
            )
        finally:
            await subscription.aclose()
            await asyncio.gather(pump, return_exceptions=True)

    def _wants_logs(self, ctx: ServerRequestContext[Any, Any]) -> bool:
        """Whether the client takes log messages at level info on this request: asked for in
        the request's ``_meta`` (2026-07-28), or not turned down by ``logging/setLevel`` (the
        older versions, where a server may send every level)."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return "info" in allowed_log_levels(ctx.protocol_version, ctx.meta)
        level = self.log_level
        return level is None or _LOG_LEVELS.index(level) <= _LOG_LEVELS.index("info")

    async def set_logging_level(
        self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        """``logging/setLevel`` (protocol versions before 2026-07-28): the least level of the
        log messages sent from now on (over stdio, the connection's; stateless HTTP has none to
        keep it for, and a request there takes what every request takes)."""
        if self.requests is not None:
            self.log_level = params.level
        return types.EmptyResult()

    async def _principal(self, req: McpRequest) -> Principal | None:
        if self.authenticate is None:
            return self.principal
        found = self.authenticate(req)
        if inspect.isawaitable(found):
            found = await found
        if found is None and not self.anonymous:
            # as the HTTP API's 401: a request nobody vouched for is not served as anonymous
            raise MCPError(INVALID_REQUEST, "Authentication required.")
        return found

    async def _answer(
        self,
        req: McpRequest,
        result: Outcome,
        wire: str,
        principal: Principal | None,
        note: str | None = None,
        responses: Mapping[str, Any] | None = None,
    ) -> Answer:
        if result.status == "pending":
            action = result.action or await self.backend.action(result.action_id, principal)
            if action is not None and responses and input_key(action) in responses:
                # answered with the call itself (SEP-2322 lets a client send what it knows)
                return await self._respond(req, action, wire, principal, responses)
            if action is not None:
                asked = await self._elicit_now(req, action, wire, principal, note)
                if asked is None:
                    asked = self._ask(req, action, note)
                if asked is not None:
                    return asked
            return self._pending_result(result.content, wire, result.action_id)
        return _settled(result, req.protocol_version)

    def _ask(
        self, req: McpRequest, action: ActionRecord, note: str | None
    ) -> types.InputRequiredResult | None:
        """The input-required result asking for the action's resume payload, or None where
        this client cannot answer one (older protocol, no elicitation, no inbox)."""
        if req.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return None
        capabilities = req.capabilities
        elicitation = None if capabilities is None else capabilities.elicitation
        if elicitation is None:
            return None
        form_ok = elicitation.form is not None or elicitation.url is None
        message = _message(action, note)
        form = flat_form_schema(action.submit_schema)
        params: types.ElicitRequestFormParams | types.ElicitRequestURLParams
        if form is not None and form_ok:
            params = types.ElicitRequestFormParams(message=message, requested_schema=form)
        elif elicitation.url is not None and (url := self._inbox(req, action.action_id)):
            params = types.ElicitRequestURLParams(message=message, url=url)
        else:
            return None
        return types.InputRequiredResult(
            input_requests={input_key(action): types.ElicitRequest(params=params)},
            request_state=self._signed(action),
        )

    def _inbox(self, req: McpRequest, action_id: str) -> str | None:
        inbox = self.inbox_url(req) if callable(self.inbox_url) else self.inbox_url
        if inbox is None:
            return None
        if "{action_id}" in inbox:
            return inbox.replace("{action_id}", action_id)
        return f"{inbox.rstrip('/')}/{action_id}"

    async def _retry(
        self,
        req: McpRequest,
        params: types.CallToolRequestParams,
        principal: Principal | None,
        name: str,
    ) -> Answer:
        action_id = self._verified(params.request_state or "", name)
        action = await self.backend.action(action_id, principal)
        if action is None or action.name != name:
            # another principal's action does not exist for this one
            return _error(ErrorCode.UNKNOWN_ACTION, "No pending action for this request state.")
        if action.state != "pending":
            return await self._settled(req, action, params.name, principal)
        return await self._respond(req, action, params.name, principal, params.input_responses)

    async def _respond(
        self,
        req: McpRequest,
        action: ActionRecord,
        wire: str,
        principal: Principal | None,
        responses: Mapping[str, Any] | None,
    ) -> Answer:
        """The client's answer to the pending ``action`` (its response under the action's key;
        other keys are ignored): an accepted form submitted, a decline cancelling the call, a
        dismissal leaving it pending; none, or one the resume schema refuses, asks again."""
        response = (responses or {}).get(input_key(action))
        if not isinstance(response, types.ElicitResult):
            return await self._again(req, action, wire, principal, None)
        if response.action == "decline":
            cancelled = await self.backend.cancel(
                action.action_id, "declined by the user", principal
            )
            return await self._answer(req, cancelled, wire, principal)
        if response.action == "cancel" or response.content is None:
            # dismissed, or a URL elicitation the user agreed to open: the action waits on
            return await self._settled(req, action, wire, principal)
        answer: dict[str, Any] = dict(response.content)
        submitted = await self.backend.submit(action.action_id, answer, principal)
        if submitted.status == "error" and submitted.code == ErrorCode.INVALID_SUBMISSION:
            return await self._again(req, action, wire, principal, submitted.message)
        return await self._answer(req, submitted, wire, principal)

    async def _again(
        self,
        req: McpRequest,
        action: ActionRecord,
        wire: str,
        principal: Principal | None,
        note: str | None,
    ) -> Answer:
        asked = await self._elicit_now(req, action, wire, principal, note)
        if asked is None:
            asked = self._ask(req, action, note)
        if asked is not None:
            return asked
        return self._pending_result(_pending_json(action), wire, action.action_id)

    async def _elicit_now(
        self,
        req: McpRequest,
        action: ActionRecord,
        wire: str,
        principal: Principal | None,
        note: str | None,
    ) -> Answer | None:
        """On the protocol versions before 2026-07-28 (no input-required results), the form
        asked within the request (``elicitation/create``) where the connection can carry it
        (stdio, HTTP with sessions) and the client can elicit, and the call resumed with the
        answer; None where it cannot be asked so."""
        ctx = req.context
        if ctx is None or req.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None
        capabilities = req.capabilities
        elicitation = None if capabilities is None else capabilities.elicitation
        form = flat_form_schema(action.submit_schema)
        if elicitation is None or form is None:
            return None
        if elicitation.form is None and elicitation.url is not None:
            return None  # the client takes URLs only, and the inbox is its answer
        try:
            response = await ctx.session.elicit_form(
                _message(action, note), form, related_request_id=ctx.request_id
            )
        except Exception as error:  # no back channel (stateless HTTP), or the client refused
            log.info("elicitation for %s not asked in the request: %s", action.action_id, error)
            return None
        return await self._respond(req, action, wire, principal, {input_key(action): response})

    async def _settled(
        self, req: McpRequest, action: ActionRecord, wire: str, principal: Principal | None
    ) -> TextResult | types.CallToolResult:
        """What the action's call has come to, as the backend has it (another worker, the
        inbox or an operator may have resolved it): its result once settled, or the pending
        action while it waits."""
        if action.state == "pending":
            return self._pending_result(_pending_json(action), wire, action.action_id)
        view = await self.backend.call_view(action.call_id, principal)
        recorded = None if view is None else view.result
        if recorded is not None and recorded.get("status") in ("error", "success"):
            return _settled(Outcome.stored(recorded), req.protocol_version)
        if view is not None and view.waiting is not None:
            # the call went on to wait on a newer action: the model asks about that one
            newer = view.waiting
            return self._pending_result(_pending_json(newer), wire, newer.action_id)
        return self._pending_result(
            {"pending": _action_name(action), "action_id": action.action_id, "resolved": True},
            wire,
            action.action_id,
        )

    def _signed(self, action: ActionRecord) -> str:
        """The request state of ``action``'s input request: its id and tool, signed (HMAC-SHA256)
        with this server's key, so that the server trusts no state it did not make."""
        body = _b64(f"{action.name}\0{action.action_id}".encode())
        tag = hmac.new(self.state_key, body.encode(), hashlib.sha256).digest()
        return f"{_STATE_PREFIX}{body}.{_b64(tag)}"

    def _verified(self, state: str, name: str) -> str:
        """The action id a request state of this server's names for the tool ``name``; a state
        tampered with (or made by another key) is refused with a JSON-RPC error, as the
        protocol requires."""
        try:
            if not state.startswith(_STATE_PREFIX):
                raise ValueError("not ours")
            body, _, tag = state[len(_STATE_PREFIX) :].partition(".")
            expected = hmac.new(self.state_key, body.encode(), hashlib.sha256).digest()
            if not hmac.compare_digest(_unb64(tag), expected):
                raise ValueError("the signature does not match")
            tool, _, action_id = _unb64(body).decode().partition("\0")
        except (ValueError, UnicodeError) as error:
            log.warning("a request state was refused: %s", error)
            raise MCPError(
                INVALID_PARAMS, INVALID_STATE, {"reason": "invalid_request_state"}
            ) from None
        if tool != name:
            raise MCPError(INVALID_PARAMS, INVALID_STATE, {"reason": "invalid_request_state"})
        return action_id

    def _pending_result(self, content: JsonValue, wire: str, action_id: str) -> TextResult:
        structured = self._announces_output(wire)
        return TextResult(
            compact_json(content),
            None if structured else content,
            is_error=structured,
            meta={META: {"status": "pending", "action_id": action_id}},
        )


@dataclass(frozen=True, slots=True)
class TextResult:
    """A tools/call result of one text block: a success, an error or a pending action, what
    almost every call answers. The SDK's handler gets its model; the HTTP fast path writes its
    wire form itself, instead of building the model, dumping it and having the SDK validate and
    dump it again for the protocol version (three pydantic passes, a third of the fast path's
    own cost)."""

    text: str
    structured: JsonValue = None
    is_error: bool = False
    meta: dict[str, Any] | None = None

    def model(self) -> types.CallToolResult:
        return types.CallToolResult(
            content=[types.TextContent(text=self.text)],
            structured_content=self.structured,
            is_error=self.is_error,
            _meta=self.meta,
        )

    def wire(self) -> dict[str, Any]:
        """What ``methods.serialize_server_result`` gives for the model's dump on
        ``WIRE_VERSION``, for JSON content, which is all a result holds (a test holds the two
        equal)."""
        shaped: dict[str, Any] = {
            "content": [{"text": self.text, "type": "text"}],
            "isError": self.is_error,
            "resultType": "complete",
        }
        if self.structured is not None:
            shaped["structuredContent"] = self.structured
        if self.meta is not None:  # a model whose None fields the dump leaves out
            shaped["_meta"] = {key: value for key, value in self.meta.items() if value is not None}
        return shaped


WIRE_VERSION = "2026-07-28"
"""The protocol version whose surface ``TextResult.wire`` writes."""

Answer: TypeAlias = TextResult | types.CallToolResult | types.InputRequiredResult


def _settled(outcome: Outcome, version: str) -> TextResult | types.CallToolResult:
    """A settled call's answer. The tool's ``ctx.metadata`` and the effects it emitted
    (``ctx.effects``) ride in ``_meta`` (``{"io.blade": {"metadata": ..., "effects": [...]}}``,
    each where there is one), beside what the model reads, which holds neither."""
    ours: dict[str, Any] = {}
    if outcome.metadata is not None:
        ours["metadata"] = outcome.metadata
    if outcome.effects:
        ours["effects"] = effects_json(outcome.effects)
    if outcome.status == "error":
        return _error(outcome.code, outcome.message, ours)
    return _success(outcome.content, version, outcome.projected, ours)


def _success(
    content: JsonValue,
    version: str,
    projected: bool = False,
    ours: dict[str, Any] | None = None,
) -> TextResult | types.CallToolResult:
    """A success: what the model reads as content (content blocks as they are, a sentence as
    text, other JSON as its text) and as structured content. ``projected``: ``content`` is the
    registration's projection of the output: the whole output never reaches the client, and a
    sentence or content blocks have no structured content. ``ours``: what ``_meta`` carries
    under ``io.blade`` (nothing when empty)."""
    structured = (
        content if isinstance(content, dict) or version in MODERN_PROTOCOL_VERSIONS else None
    )
    if projected and (isinstance(content, str) or is_blocks(content)):
        structured = None
    meta = {META: ours} if ours else None
    if is_blocks(content):
        return types.CallToolResult.model_validate(
            {"content": to_mcp(content), "structuredContent": structured, "_meta": meta}
        )
    text = content if isinstance(content, str) else compact_json(content)
    return TextResult(text, structured, meta=meta)


def _request_context(principal: Principal | None, meta: Any) -> CallContext:
    """A tools/call's context from its ``_meta``: the trace context it carries
    (``traceparent``), and the thread and executing agent the client names (``io.blade``:
    ``{"thread_id": ..., "agent_id": ...}``; what is not an id of 1 to 200 printable
    characters is left out, as a malformed ``traceparent`` is)."""
    if not isinstance(meta, dict):
        return call_context(principal, None)
    ours = meta.get(META)
    ours = ours if isinstance(ours, dict) else {}
    thread, agent = (
        value if isinstance(value, str) and storable_id(value) else None
        for value in (ours.get("thread_id"), ours.get("agent_id"))
    )
    return call_context(principal, traceparent(meta.get("traceparent")), thread, agent)


def _error(code: ErrorCode, message: str, ours: dict[str, Any] | None = None) -> TextResult:
    content: JsonValue = {"error": code.value, "message": message}
    meta: dict[str, Any] = {"status": "error", "code": code.value, **(ours or {})}
    return TextResult(compact_json(content), content, is_error=True, meta={META: meta})


def _action_name(action: ActionRecord) -> str:
    return action.name if action.point is None else f"{action.name}.{action.point}"


def _pending_json(action: ActionRecord) -> JsonValue:
    return {"pending": _action_name(action), "action_id": action.action_id}


_PROMPTS = ("prompt", "question", "message", "title", "summary", "description")
"""Keys of a suspend payload whose text is the question to show a person."""


def _message(action: ActionRecord, note: str | None) -> str:
    """What an elicitation shows a person: the payload's question (``prompt`` and its like),
    else the action and the payload's fields, one per line, as words rather than JSON."""
    payload = action.payload
    text = None
    if isinstance(payload, dict):
        text = next(
            (v for k in _PROMPTS if isinstance(v := payload.get(k), str) and v.strip()), None
        )
    if text is None:
        text = f"{_action_name(action)} asks for your answer."
        if isinstance(payload, dict):
            text += "".join(f"\n{key}: {_readable(value)}" for key, value in payload.items())
        elif payload is not None:
            text += f"\n{_readable(payload)}"
    return text if note is None else f"{text}\n\nThe last answer was refused: {note}"


def _readable(value: JsonValue) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(item, str | int | float) for item in value):
        return ", ".join(str(item) for item in value)
    return compact_json(value)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    """The strict inverse of ``_b64``: only the canonical form decodes."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(raw) != text:
        raise ValueError("not canonical base64url")
    return raw


def state_key() -> bytes:
    """The signing key of request states: ``$BLADE_MCP_STATE_KEY`` (at least 32 bytes), else
    one of this process's own."""
    configured = os.environ.get(STATE_KEY_ENV)
    if configured is None:
        return secrets.token_bytes(32)
    if len(configured.encode()) < 32:
        raise ValueError(f"${STATE_KEY_ENV} must hold at least 32 bytes (secrets.token_hex(32))")
    return configured.encode()


INVALID_STATE = "Invalid or expired requestState"  # the SDK's own words for it


# -- servers and transports ---------------------------------------------------------------------


def mcp_server(
    runtime: Runtime | McpBackend,
    *,
    name: str = "blade-runtime",
    principal: Principal | None = None,
    authenticate: Authenticate | None = None,
    inbox_url: str | Callable[[McpRequest], str | None] | None = None,
    run_id: str = "mcp",
    signing_key: bytes | None = None,
) -> Server[Any]:
    """A low-level MCP server serving ``runtime``'s tools, or a backend's (see the module's
    doc)."""
    tools = McpTools(
        runtime,
        principal=principal,
        authenticate=authenticate,
        inbox_url=inbox_url,
        run_id=run_id,
        signing_key=signing_key,
    )
    return _server(tools, name)


def _security(host: str) -> Any:
    """The SDK's DNS-rebinding protection for a loopback host (as streamable_http_app sets)."""
    from mcp.server.transport_security import TransportSecuritySettings

    if host not in ("127.0.0.1", "localhost", "::1"):
        return None
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )


def _server(tools: McpTools, name: str = "blade-runtime") -> Server[Any]:
    from blade_runtime import __version__

    with warnings.catch_warnings():  # logging/setLevel: served for the older versions
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        return Server(
            name,
            version=__version__,
            # the tools' guidance for the model (the seed's skills), sent once at initialize
            instructions=tools.runtime.guidance,
            on_list_tools=tools.list_tools,
            on_call_tool=tools.call_tool,
            on_read_resource=tools.read_resource,
            on_set_logging_level=tools.set_logging_level,
            # Mcp-Param header checks read the schema here instead of running tools/list
            get_tool_input_schema=tools.input_schema,
        )


async def serve_stdio(
    runtime: Runtime | McpBackend,
    *,
    principal: Principal | None = None,
    inbox_url: str | None = None,
    limits: StdioLimits = STDIO_LIMITS,
    stop: Any = None,
) -> None:
    """Serve ``runtime`` over this process's stdin and stdout until the client closes stdin (or
    its end of stdout: ``BrokenPipe``), or ``stop`` (an ``anyio.Event``) is set. Every message
    is answered as JSON-RPC requires and what a client can make the server hold is bounded by
    ``limits`` (see ``blade_runtime.serving.mcp_stdio``)."""
    import anyio

    from blade_runtime.serving.mcp_stdio import claimed_stdio, serve_connection

    tools = McpTools(runtime, principal=principal, inbox_url=inbox_url)
    tools.requests = {}
    server = _server(tools)
    with claimed_stdio() as wire:
        await serve_connection(
            server,
            wire,
            limits,
            tools,
            stop if stop is not None else anyio.Event(),
        )


_MODERN = frozenset(version.encode() for version in MODERN_PROTOCOL_VERSIONS)
MAX_BODY_BYTES = 4 * 1024 * 1024  # the SDK's default request body limit


class FastPath:
    """Streamable HTTP with a short path for the common request: a stateless 2026-07-28
    ``tools/call`` wanting a JSON response, without ``Mcp-Param-*`` headers.

    It passes the SDK's own checks (transport security, Accept, duplicated routing headers, the
    envelope classifier) and answers with the SDK's wire form of the result (a text result's
    written by ``TextResult.wire``, tested equal to the SDK's serialization), but calls the
    handler directly instead of through the SDK's per-request server loop (a
    connection, a runner, the middleware chain: most of a call's cost over HTTP). Every other
    request, and any request these checks would refuse, goes to the SDK's app unchanged (its body
    replayed), so the SDK gives its answer and its error. Nothing here is traced by the SDK's
    OpenTelemetry middleware."""

    def __init__(
        self,
        app: Any,
        server: Server[Any],
        tools: McpTools,
        path: str,
        security: Any,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        # Imported here, once, not in _answer: each import statement there cost about a
        # microsecond on every request (and serving over stdio never imports these).
        from mcp.server.runner import modern_error_data
        from mcp.server.streamable_http import check_accept_headers
        from mcp.server.transport_security import TransportSecurityMiddleware
        from mcp.shared.inbound import (
            ERROR_CODE_HTTP_STATUS,
            InboundModernRoute,
            classify_inbound_request,
            find_duplicated_routing_header,
        )
        from mcp_types import methods
        from starlette.requests import Request
        from starlette.responses import Response

        self._error_data = modern_error_data
        self._accepts = check_accept_headers
        self._route = InboundModernRoute
        self._classify = classify_inbound_request
        self._duplicated = find_duplicated_routing_header
        self._serialize = methods.serialize_server_result
        self._validate = methods.validate_client_request
        self._status = ERROR_CODE_HTTP_STATUS
        self._request = Request
        self._response = Response
        self.app = app
        self.server = server
        self.tools = tools
        self.path = path
        self.security = TransportSecurityMiddleware(security)
        self.max_body_bytes = max_body_bytes
        self.served = 0  # requests answered here rather than by the SDK's app
        self._stamp: dict[str, Any] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if not self._candidate(scope):
            await self.app(scope, receive, send)
            return
        body, whole = await _body(receive, self.max_body_bytes)
        replayed = _replay(body, whole, receive)
        if not whole:  # the SDK's app reads the rest (and refuses a body over its limit)
            await self.app(scope, replayed, send)
            return
        answered = await self._answer(scope, replayed, body, receive)
        if answered is None:
            await self.app(scope, replayed, send)
        else:
            self.served += 1
            await answered(scope, replayed, send)

    def _candidate(self, scope: Any) -> bool:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path:
            return False
        version = method = None
        for key, value in scope["headers"]:
            if key == b"mcp-protocol-version":
                version = value
            elif key == b"mcp-method":
                method = value
            elif (
                key.startswith(b"mcp-param-")
                or key == b"mcp-session-id"
                or (
                    key == b"content-length"
                    and (not value.isdigit() or int(value) > self.max_body_bytes)
                )
            ):
                return False
        return version in _MODERN and method == b"tools/call"

    async def _answer(self, scope: Any, receive: Any, body: bytes, wire: Any) -> Any:
        """The response to send, or None: the SDK's app answers. ``receive`` replays the body
        (for the application's authenticate); ``wire`` is the server's own, read only for the
        client's disconnect."""
        Request, Response = self._request, self._response
        request = Request(scope, receive)
        if await self.security.validate_request(request, is_post=True) is not None:
            return None
        accepts_json, accepts_sse = self._accepts(request)
        if not (accepts_json and accepts_sse):  # the SDK's app (SSE mode) refuses it: 406
            return None
        items = request.headers.items()
        if self._duplicated(items) is not None:
            return None
        try:  # pydantic-core's parser: half json.loads' cost; what it refuses that json.loads
            # reads (a lone surrogate's escape, a byte-order mark) goes to the SDK's app
            decoded = from_json(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(decoded, dict) or decoded.get("method") != "tools/call":
            return None
        request_id = decoded.get("id")
        if decoded.get("jsonrpc") != "2.0" or isinstance(request_id, bool):
            return None
        if not isinstance(request_id, str | int):
            return None
        # dict(request.headers) as one pass over them (it looked each name up again, decoding
        # every header per name): the first value of a repeated name, as a lookup gives
        headers: dict[str, str] = {}
        for key, value in items:
            headers.setdefault(key, value)
        verdict = self._classify(decoded, headers=headers)
        if not isinstance(verdict, self._route):
            return None
        version = verdict.protocol_version
        raw = decoded.get("params")
        if not isinstance(raw, dict):
            return None
        arguments = raw.get("arguments")
        if arguments is not None and not isinstance(arguments, dict):
            return None
        meta = raw.get("_meta")
        if isinstance(meta, dict) and "progressToken" in meta:
            return None  # progress streams as SSE: the SDK's app has the channel for it
        name = raw.get("name")
        if not isinstance(name, str) or self.tools.declares_headers(name):
            return None  # its Mcp-Param headers are the SDK's to check (SEP-2243)
        stripped = raw if arguments is None else {**raw, "arguments": {}}
        try:  # the SDK's parse of a request (its version's surface, then the model, by wire
            # names only), of the params alone and without the arguments, whose dict the two
            # would rebuild key by key
            self._validate("tools/call", version, stripped)
            params = types.CallToolRequestParams.model_validate(stripped, by_name=False)
        except (ValidationError, ValueError, KeyError):
            return None
        if arguments is not None:
            params.arguments = arguments
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        try:
            call_id = next(_CALL_IDS)
            result = await _unless_gone(
                self.tools.handle(
                    McpRequest(version, verdict.client_capabilities, request, call_id=call_id),
                    params,
                ),
                wire,
                lambda: self.tools.backend.cancel_call(call_id, CLOSED_REQUEST),
            )
            if result is None:  # the client went away (a cancelled request): the call is too
                return Response(status_code=499)
            if isinstance(result, TextResult) and version == WIRE_VERSION:
                shaped = result.wire()
            else:
                model = result.model() if isinstance(result, TextResult) else result
                dumped = model.model_dump(mode="json", by_alias=True, exclude_none=True)
                shaped = self._serialize("tools/call", version, dumped)
        except Exception as error:  # the SDK's mapping of a handler's failure
            if not isinstance(error, MCPError):  # a refusal is an answer, not a failure
                log.exception("tools/call %s failed", params.name)
            data = self._error_data(error)
            reply["error"] = data.model_dump(mode="json", by_alias=True, exclude_none=True)
            status = self._status.get(data.code, 200)  # the SDK's table of error statuses
            return Response(compact_json(reply), status, media_type="application/json")
        shaped.setdefault("resultType", "complete")
        meta = shaped.get("_meta")
        if self._stamp is None:  # the server's identity is fixed once it is built
            # a copy of our own, only ever serialized (the SDK deep-copies it on every read)
            self._stamp = {types.SERVER_INFO_META_KEY: self.server.server_info_stamp}
        stamp = self._stamp
        shaped["_meta"] = stamp if not isinstance(meta, dict) else {**meta, **stamp}
        reply["result"] = shaped
        return Response(compact_json(reply), media_type="application/json")


CLOSED_REQUEST = "the MCP client closed its HTTP request (its way to cancel a call)"


async def _unless_gone(
    work: Coroutine[Any, Any, T], receive: Any, cancel: Callable[[], Any] | None = None
) -> T | None:
    """``work``'s result, or None once the client disconnects, ``work`` then cancelled: a
    client that cancels a tools/call over stateless HTTP closes its request (its
    notifications/cancelled has no session to reach this one by), and the runtime's call
    must stop as it would on stdio.

    ``work`` runs in this task, and the disconnect is watched only from its first suspension
    on: a call that never waits (most) costs no task and no ``asyncio.wait``."""
    watch = _Watch(receive, cancel)
    try:
        result = await _watched(work, watch)
    except asyncio.CancelledError:
        if not watch.gone or watch.uncancel() > 0:  # cancelled from outside too: not ours
            raise
        return None  # its cancellation ran to its end (the call settled CANCELLED)
    finally:
        watch.stop()
    if watch.gone:  # the work swallowed the cancellation the watcher asked for
        watch.uncancel()
        return None
    return result


class _Watch:
    """Whether the client of the request running ``work`` went away; on that, the request's
    task is cancelled (and the work with it, where it waits)."""

    __slots__ = ("cancel", "gone", "owner", "receive", "watcher")

    def __init__(self, receive: Any, cancel: Callable[[], Any] | None = None) -> None:
        self.receive = receive
        self.cancel = cancel  # says why first (the call's record), where it can
        self.owner: asyncio.Task[Any] | None = None
        self.watcher: asyncio.Task[None] | None = None
        self.gone = False

    def start(self) -> None:
        self.owner = asyncio.current_task()
        self.watcher = asyncio.ensure_future(self._disconnected())

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()

    def uncancel(self) -> int:
        """Take back the watcher's cancellation; the request's remaining count."""
        assert self.owner is not None
        return self.owner.uncancel()

    async def _disconnected(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass  # a server that sends more of the (already read) body
        self.gone = True
        if self.cancel is not None:
            self.cancel()
        assert self.owner is not None
        self.owner.cancel()


@types_coroutine
def _watched(coroutine: Coroutine[Any, Any, T], watch: _Watch) -> Generator[Any, Any, T]:
    """``await coroutine``, starting ``watch`` when it first suspends."""
    sent: Any = None
    thrown: BaseException | None = None
    while True:
        try:
            yielded = coroutine.send(sent) if thrown is None else coroutine.throw(thrown)
        except StopIteration as finished:
            result: T = finished.value
            return result
        if watch.watcher is None:
            watch.start()
        sent, thrown = None, None
        try:
            sent = yield yielded
        except GeneratorExit:
            coroutine.close()
            raise
        except BaseException as error:
            thrown = error


async def _body(receive: Any, limit: int) -> tuple[bytes, bool]:
    """The request body as read, and whether it is whole: not once it is larger than the limit
    (a chunked body has no length to refuse it by first) or the client went away."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunk = message.get("body", b"")
        size += len(chunk)
        chunks.append(chunk)
        if size > limit:
            return b"".join(chunks), False
        if not message.get("more_body", False):
            return b"".join(chunks), True


def _replay(body: bytes, whole: bool, receive: Any) -> Any:
    """A receive that hands out ``body`` first (as one message), then what ``receive`` gives:
    the rest of the body, when it was not read whole."""
    sent = False

    async def replayed() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": not whole}
        return await receive()

    return replayed


def mcp_asgi_app(
    runtime: Runtime | McpBackend,
    *,
    authenticate: Authenticate | None = None,
    principal: Principal | None = None,
    anonymous: bool = False,
    inbox_url: str | Callable[[McpRequest], str | None] | None = None,
    path: str = "/mcp",
    host: str = "127.0.0.1",
    stateless: bool = True,
    fast_path: bool = True,
    max_body_bytes: int = MAX_BODY_BYTES,
    signing_key: bytes | None = None,
) -> Any:
    """The streamable-HTTP MCP endpoint at ``path`` as an ASGI app (its lifespan runs the SDK's
    session manager). Every request is authenticated by ``authenticate``; with neither it nor a
    fixed ``principal``, pass ``anonymous=True`` (for loopback only: ``host`` sets the SDK's DNS
    rebinding protection). ``stateless``: no MCP session affinity, so any worker sharing the
    store answers any request. ``fast_path``: serve plain 2026-07-28 tool calls without the
    SDK's per-request server loop (``FastPath``; the SDK's app serves everything else)."""
    if authenticate is None and principal is None and not anonymous:
        raise ValueError("pass authenticate= (or principal=), or anonymous=True for loopback")
    tools = McpTools(
        runtime,
        principal=principal,
        authenticate=authenticate,
        inbox_url=inbox_url,
        anonymous=anonymous,
        signing_key=signing_key,
    )
    server = _server(tools)
    app = server.streamable_http_app(
        streamable_http_path=path,
        stateless_http=stateless,
        json_response=False,  # JSON, unless there is progress to stream (then SSE)
        host=host,
        max_request_body_size=max_body_bytes,
    )
    if not fast_path:
        return app
    return FastPath(app, server, tools, path, _security(host), max_body_bytes)


class McpMount:
    """The MCP endpoint as another ASGI app's route (``create_app(runtime, mcp=True)`` of
    ``blade_runtime.serving.http`` mounts it at ``/mcp``): that app's authentication decides who the
    caller is, and a URL elicitation points at its approval inbox.

    ``principal_of(request)`` returns the Principal or raises; ``refused(error)`` turns what it
    raised into the response to send (None: re-raise). Run ``lifespan`` in the host app's
    lifespan (the SDK's session manager)."""

    def __init__(
        self,
        runtime: Runtime | McpBackend,
        principal_of: Callable[[Any], Awaitable[Principal]],
        refused: Callable[[Exception], Any],
        *,
        path: str = "/mcp",
        inbox_path: str | None = "/inbox",
    ) -> None:
        self.principal_of = principal_of
        self.refused = refused
        self.inbox_path = inbox_path
        self.app = mcp_asgi_app(
            runtime,
            authenticate=self._authenticated,
            inbox_url=self._inbox_url,
            path=path,
            host="",  # no loopback-only Host check: the host app authenticates every request
        )
        inner = self.app.app if isinstance(self.app, FastPath) else self.app
        self.lifespan = inner.router.lifespan_context

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from starlette.requests import Request

        try:
            scope[_PRINCIPAL] = await self.principal_of(Request(scope, receive))
        except Exception as error:
            response = self.refused(error)
            if response is None:
                raise
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _authenticated(req: McpRequest) -> Principal | None:
        found = None if req.http is None else req.http.scope.get(_PRINCIPAL)
        return found if isinstance(found, Principal) else None

    def _inbox_url(self, req: McpRequest) -> str | None:
        if self.inbox_path is None or req.http is None:
            return None
        return f"{str(req.http.base_url).rstrip('/')}{self.inbox_path}#action={{action_id}}"


_PRINCIPAL = "blade.principal"  # the scope key McpMount leaves the authenticated principal in


_LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_CANCELLED = ""  # a request cancelled before its call started, in McpTools.requests
_CALL_IDS = (f"mcp_{secrets.token_hex(6)}_{n}" for n in itertools.count(1))
"""Call ids this server gives (where it must be able to cancel a call by its id): unique, and
cheaper than a UUID on every HTTP call."""


def client_cancelled(reason: str | None) -> str:
    """What a cancelled call's record says of an MCP client's cancellation."""
    if reason is None or not reason.strip():
        return "the MCP client cancelled its request (it gave no reason)"
    return f"the MCP client cancelled its request, saying {reason.strip()!r}"


def _wants_progress(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the client asked for progress on this request, so that a call nobody watches
    costs no subscription: a ``_meta.progressToken`` over JSON-RPC (stdio, HTTP: the SDK's
    context holds it as ``progress_token``), a progress callback on the SDK's in-process
    client (which says so only to its dispatch context)."""
    meta: Any = ctx.meta or {}
    if isinstance(meta, Mapping) and (
        meta.get("progress_token") is not None or meta.get("progressToken") is not None
    ):
        return True
    outbound = getattr(ctx.session, "_request_outbound", None)
    direct = getattr(outbound, "_inner", outbound)
    return getattr(direct, "_on_progress", None) is not None
