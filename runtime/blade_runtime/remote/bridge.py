"""Remote MCP servers' tools as tools of a runtime: calls like any other, durable, in their place.

``await connect_mcp(runtime, server)`` binds a server in one line. Without ``specs``
(*dynamic*), the server's tools are registered as they are listed at connect, under
``prefix`` and through ``include``, and replaced or removed when the server says its list
changed (``notifications/tools/list_changed``) or after a reconnection. With ``specs`` (the ones
``blade-codegen import --from mcp`` made from the server: *typed*), each spec is registered with
an implementation that forwards to the server, and at connect (and on each list change) each
remote tool's schemas are compared with its spec's by ``blade-codegen check``'s rules
(``remote.drift``): a change our callers or readers would break on makes that tool unavailable
(TOOL_UNAVAILABLE, one log line naming the tool, the JSON pointer and the change), a compatible
one is logged and used, a tool the server dropped is unavailable.

Every registration says where it comes from (``source="mcp:<server>"``) and how far it is
trusted (``trust="remote"`` unless the application says otherwise), so a ``SourcePolicy`` and the
permission policy can keep remote tools in their place. A bridged tool is ``non_idempotent``
unless its spec (or ``side_effects=``, for a dynamic one) says otherwise: the server's
annotations are hints, never evidence that a replay is safe, so a call a crash interrupted
settles INTERRUPTED and never runs twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from blade_runtime.core.context import ResumeEntry, Suspended, ToolFailed
from blade_runtime.core.registry import NAME, Trust
from blade_runtime.core.spec import BackendToolSpec, JsonObject, SideEffect, SuspendPoint
from blade_runtime.remote.drift import drift
from blade_runtime.remote.results import answer, failure
from blade_runtime.remote.servers import Connection, McpServer, ServerUnavailable

log = logging.getLogger("blade_runtime.mcp")

DEFAULT_TIMEOUT_MS = 120_000
ELICITATION = "elicitation"
ASKING = SuspendPoint[Any, Any](
    ELICITATION,
    suspend_schema={
        "type": "object",
        "properties": {
            "message": {"type": "string"},
            "requestedSchema": {"type": "object"},
            "key": {"type": "string"},
            "requestState": {"type": ["string", "null"]},
        },
        "required": ["message", "requestedSchema", "key"],
    },
    resume_schema={"type": "object"},  # each suspension's own: the server's form schema
    suspend_type=Any,
    resume_type=Any,
)
"""Where a bridged call waits for a person to answer the server's form (``elicitation/create``
in a 2026-07-28 ``input_required`` result): the action's submit schema is the form's."""
MAX_ROUNDS = 8  # input_required rounds answered without a person, before the call gives up
MAX_RESULT_BYTES = 4 * 1024 * 1024


class RemoteArguments(BaseModel):
    """The typed input of a dynamic remote tool: its arguments as the server's schema has them
    (validated against that schema before the call is sent)."""

    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True, slots=True)
class RemoteTool:
    """One tool as the server lists it (its JSON, camelCase as on the wire)."""

    name: str
    description: str
    input_schema: JsonObject
    output_schema: JsonObject | None
    annotations: JsonObject

    @classmethod
    def of(cls, tool: Any) -> RemoteTool:
        listed = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
        return cls(
            listed["name"],
            listed.get("description") or listed.get("title") or listed["name"],
            listed.get("inputSchema") or {"type": "object"},
            listed.get("outputSchema"),
            listed.get("annotations") or {},
        )


class McpBridge:
    """The tools of one remote MCP server, bound to one runtime (see the module's text)."""

    def __init__(
        self,
        runtime: Any,
        server: McpServer,
        *,
        specs: Collection[BackendToolSpec[Any, Any, Any, Any, Any]] | None = None,
        names: Mapping[str, str] | None = None,
        prefix: str = "",
        include: Callable[[RemoteTool], bool] | None = None,
        trust: Trust = "remote",
        side_effects: Mapping[str, SideEffect] | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        max_result_bytes: int = MAX_RESULT_BYTES,
        sampling: Any = None,
        elicit: Any = None,
    ) -> None:
        self.runtime = runtime
        self.server = server
        self.source = f"mcp:{server.name}"
        self.specs = list(specs) if specs is not None else None
        self.names = dict(names or {})  # spec id -> the remote tool's name (default: its name)
        self.prefix = prefix
        self.include = include
        self.trust = trust
        self.side_effects = dict(side_effects or {})
        self.timeout_ms = timeout_ms
        self.max_result_bytes = max_result_bytes
        self.listed: dict[str, RemoteTool] = {}
        self.unavailable: dict[str, str] = {}  # remote name -> why (drift, dropped)
        self.registered: dict[str, str] = {}  # our name -> remote name
        self._fingerprints: dict[str, str] = {}
        self._in_flight: dict[int, Any] = {}  # id(ctx) -> ctx: server log lines reach them
        self._syncing: asyncio.Task[None] | None = None
        callbacks: dict[str, Any] = {
            "message_handler": self._on_message,
            "logging_callback": self._on_log,
            # Advertises form elicitation. On a 2026-07-28 connection a server's question comes
            # in an input_required result and becomes a pending action (``_asked``); a server
            # of an older protocol asks in the middle of the call, with the request held open,
            # which no person on another worker could answer: ``elicit`` answers it (else it
            # is declined).
            "elicitation_callback": self._elicit_in_call,
        }
        self.elicit = elicit
        self.sampling = sampling
        if sampling is not None:  # else the SDK refuses sampling/createMessage for us
            callbacks["sampling_callback"] = sampling
        self.connection = Connection(server, callbacks, self._opened)

    # -- life --------------------------------------------------------------------------------

    async def start(self) -> McpBridge:
        if self.specs is not None:
            for spec in self.specs:
                asking = dataclasses.replace(spec, suspend={ELICITATION: ASKING, **spec.suspend})
                self._register(asking, self.names.get(spec.id, spec.name))
        await self.connection.start()
        return self

    async def close(self) -> None:
        """Close the session (and stop a stdio server's process); the tools stay registered and
        their calls fail TOOL_UNAVAILABLE (``unbind`` removes them)."""
        await self.connection.close()
        if self._syncing is not None and not self._syncing.done():
            self._syncing.cancel()

    def unbind(self) -> None:
        """Remove every tool this bridge registered."""
        for name in list(self.registered):
            self._unregister(name)

    async def __aenter__(self) -> McpBridge:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the server's list -------------------------------------------------------------------

    async def _opened(self, client: Any) -> None:
        await self._sync(client)

    async def _on_message(self, message: Any) -> None:
        method = getattr(getattr(message, "root", message), "method", None)
        if method == "notifications/tools/list_changed" and self.connection.client is not None:
            client = self.connection.client
            self._syncing = asyncio.get_running_loop().create_task(self._resync(client))

    async def _resync(self, client: Any) -> None:
        try:
            await self._sync(client)
        except Exception as error:
            log.warning("MCP server %r: re-listing its tools failed: %s", self.server.name, error)

    async def _sync(self, client: Any) -> None:
        tools: dict[str, RemoteTool] = {}
        cursor = None
        while True:
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            for tool in page.tools:
                remote = RemoteTool.of(tool)
                tools[remote.name] = remote
            cursor = page.next_cursor
            if cursor is None:
                break
        self.listed = tools
        if self.specs is None:
            self._sync_dynamic(tools)
        else:
            self._check_typed(tools)

    def _check_typed(self, tools: Mapping[str, RemoteTool]) -> None:
        unavailable: dict[str, str] = {}
        for spec in self.specs or ():
            remote_name = self.names.get(spec.id, spec.name)
            remote = tools.get(remote_name)
            if remote is None:
                unavailable[remote_name] = "the server no longer offers it"
                log.error(
                    "MCP server %r: %s (%s) is unavailable: the server dropped the tool %r",
                    self.server.name, spec.name, spec.id, remote_name,
                )  # fmt: skip
                continue
            for slot, ours, theirs in (
                ("inputSchema", spec.input_schema, remote.input_schema),
                ("outputSchema", spec.output_schema, remote.output_schema),
            ):
                for found in drift(ours, theirs, slot):
                    if found.breaks:
                        unavailable.setdefault(remote_name, f"{found.pointer}: {found.change}")
                        log.error(
                            "MCP server %r: %s (%s) is unavailable: an incompatible change at "
                            "%s: %s",
                            self.server.name, spec.name, spec.id, found.pointer, found.change,
                        )  # fmt: skip
                    else:
                        log.info(
                            "MCP server %r: %s (%s) changed compatibly at %s: %s",
                            self.server.name, spec.name, spec.id, found.pointer, found.change,
                        )  # fmt: skip
        self.unavailable = unavailable

    def _sync_dynamic(self, tools: Mapping[str, RemoteTool]) -> None:
        wanted: dict[str, RemoteTool] = {}
        for remote in tools.values():
            if self.include is not None and not self.include(remote):
                continue
            name = self.prefix + remote.name
            if not NAME.fullmatch(name):
                name = self.prefix + re.sub(r"[^A-Za-z0-9_.-]", "_", remote.name)
                name = name if name[:1].isalpha() else f"t_{name}"
            wanted[name] = remote
        for name in [n for n in self.registered if n not in wanted]:
            self._unregister(name)
            log.info("MCP server %r: %s removed (the server dropped it)", self.server.name, name)
        for name, remote in wanted.items():
            spec = self._dynamic_spec(name, remote)
            if self._fingerprints.get(name) == spec.fingerprint:
                continue
            try:
                if name in self.registered:
                    self._unregister(name)
                self._register(spec, remote.name, name=name)
            except Exception as error:  # one tool that cannot be registered: not the others
                log.error("MCP server %r: %s not registered: %s", self.server.name, name, error)

    def _dynamic_spec(
        self, name: str, remote: RemoteTool
    ) -> BackendToolSpec[Any, Any, Any, Any, Any]:
        schemas = json.dumps([remote.input_schema, remote.output_schema], sort_keys=True)
        return BackendToolSpec(
            id=f"mcp.{self.server.name}.{remote.name}",
            name=name,
            description=remote.description,
            kind="read_only" if remote.annotations.get("readOnlyHint") is True else None,
            side_effect=self.side_effects.get(remote.name, "non_idempotent"),
            timeout_ms=self.timeout_ms,
            fingerprint=hashlib.sha256(f"{remote.description}\0{schemas}".encode()).hexdigest()[
                :16
            ],
            source=self.source,
            input_schema=remote.input_schema,
            input_type=RemoteArguments,
            output_schema=remote.output_schema,
            output_type=None,
            context_schema=None,
            context_type=None,
            suspend={ELICITATION: ASKING},
        )

    def _register(self, spec: Any, remote_name: str, *, name: str | None = None) -> None:
        registered = self.runtime.register(
            spec,
            self._forwarder(remote_name, spec.output_schema is not None),
            name=name,
            source=self.source,
            trust=self.trust,
        )
        self.registered[registered.name] = remote_name
        self._fingerprints[registered.name] = spec.fingerprint

    def _unregister(self, name: str) -> None:
        self.registered.pop(name, None)
        self._fingerprints.pop(name, None)
        with contextlib.suppress(Exception):  # the application removed it already
            self.runtime.unregister(name)

    # -- calls -------------------------------------------------------------------------------

    def _forwarder(self, remote_name: str, structured: bool) -> Callable[[Any], Any]:
        async def forward(ctx: Any) -> Any:
            why = self.unavailable.get(remote_name)
            if why is not None:
                raise ToolFailed(
                    f"The tool {ctx.call.name} is unavailable: {why}.", "TOOL_UNAVAILABLE"
                )
            try:
                client = await self.connection.ready()
            except ServerUnavailable as error:
                raise ToolFailed(
                    f"The tool {ctx.call.name} is unavailable: {error}.", "TOOL_UNAVAILABLE"
                ) from None
            arguments = dict(getattr(ctx, "_arguments", None) or ctx.input.model_dump(mode="json"))

            async def progress(progress: float, total: float | None, message: str | None) -> None:
                ctx.progress(message or "", completed=progress, total=total)

            responses, state = _answers(ctx)
            self._in_flight[id(ctx)] = ctx
            try:
                for _ in range(MAX_ROUNDS):
                    result = await client.session.call_tool(
                        remote_name,
                        arguments,
                        progress_callback=progress,
                        input_responses=responses,
                        request_state=state,
                        allow_input_required=True,
                    )
                    if getattr(result, "result_type", None) != "input_required":
                        break
                    responses, state = await self._asked(ctx, result)
                else:
                    raise ToolFailed(
                        f"The remote tool {ctx.call.name} kept asking for input.", "TOOL_ERROR"
                    )
            except (ToolFailed, Suspended, asyncio.CancelledError):
                raise
            except Exception as error:
                code = getattr(error, "code", None)
                if code == -32000 or (not isinstance(code, int) and _transport(error)):
                    self.connection.broken(client)
                    error = _Closed()
                log.warning(
                    "MCP server %r: %s (call %s) failed: %s",
                    self.server.name, remote_name, ctx.call.call_id, type(error).__name__,
                )  # fmt: skip
                raise failure(error, ctx.call.name) from None
            finally:
                self._in_flight.pop(id(ctx), None)
            output = answer(
                result.model_dump(mode="json", by_alias=True, exclude_none=True),
                structured=structured,
                tool=ctx.call.name,
                limit=self.max_result_bytes,
            )
            if structured and ctx.call.spec_id in _typed_ids(self.specs):
                registration = self.runtime.tools.by_name.get(ctx.call.name)
                if registration is not None and registration.output is not None:
                    if not registration.output_validator.is_valid(output):
                        raise ToolFailed(
                            f"The remote tool {ctx.call.name} returned output its spec's output "
                            "schema rejects.",
                            "INVALID_OUTPUT",
                        )
                    return registration.output_adapter.validate_python(output)
            return output

        return forward

    async def _asked(self, ctx: Any, result: Any) -> tuple[Any, str | None]:
        """The server needs input: a form becomes this call's suspension (``ctx.suspend``
        raises), with the form's schema as what the answer must meet; a roots request is
        answered here (none), sampling by the application's ``sampling`` callback (with no
        request context), for the next round; the rest is refused."""
        import mcp_types as types

        state = result.request_state
        answers: dict[str, Any] = {}
        for key, request in (result.input_requests or {}).items():
            asked = request.model_dump(mode="json", by_alias=True, exclude_none=True)
            method, params = asked.get("method"), asked.get("params") or {}
            if method == "elicitation/create" and "requestedSchema" in params:
                payload = {
                    "message": str(params.get("message", "")),
                    "requestedSchema": params["requestedSchema"],
                    "key": key,
                    "requestState": state,
                }
                try:
                    ctx.suspend(ELICITATION, payload)
                except Suspended as suspended:
                    suspended.resume_schema = params["requestedSchema"]
                    raise
            if method == "roots/list":
                answers[key] = types.ListRootsResult(roots=[])
                continue
            if method == "sampling/createMessage" and self.sampling is not None:
                asked_for = types.CreateMessageRequestParams.model_validate(params)
                answers[key] = await self.sampling(None, asked_for)
                continue
            raise ToolFailed(  # a URL form, or sampling: the server decides what that means
                f"The remote tool {ctx.call.name} asked for {method}, which this bridge does "
                "not answer.",
                "TOOL_FAILED",
            )
        return answers, state

    async def _elicit_in_call(self, context: Any, params: Any) -> Any:
        import mcp_types as types

        if self.elicit is not None:
            return await self.elicit(context, params)
        log.warning(
            "MCP server %r asked a question in the middle of a call (an older protocol's "
            "elicitation): declined (pass elicit= to answer it)",
            self.server.name,
        )
        return types.ElicitResult(action="decline")

    async def _on_log(self, params: Any) -> None:
        level = getattr(params, "level", "info")
        data = getattr(params, "data", None)
        loud = level in ("warning", "error", "critical", "alert", "emergency")
        log.log(
            logging.WARNING if loud else logging.INFO,
            "MCP server %r log (%s): %s", self.server.name, level, str(data)[:2000],
        )  # fmt: skip
        if len(self._in_flight) == 1:  # a log line is for the call it came during
            (ctx,) = self._in_flight.values()
            ctx.message({"level": level, "data": data})


def _answers(ctx: Any) -> tuple[Any, str | None]:
    """For an entry that resumes the server's question: the person's answer as the input
    response the server asked for, and its request state (else nothing to send)."""
    entry = getattr(ctx, "entry", None)
    if not isinstance(entry, ResumeEntry) or entry.point != ELICITATION:
        return None, None
    import mcp_types as types

    episode = next(
        e for e in reversed(ctx.suspend_history) if e.action_id == entry.action.action_id
    )
    asked = episode.payload
    answer = types.ElicitResult(action="accept", content=entry.payload)
    return {asked["key"]: answer}, asked.get("requestState")


class _Closed(Exception):
    code = -32000
    message = "connection closed"


def _transport(error: BaseException) -> bool:
    """Whether ``error`` says the connection itself broke (not the call)."""
    import anyio

    broken = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError)
    return isinstance(error, broken) or type(error).__module__.startswith(("httpx", "httpcore"))


def _typed_ids(specs: Any) -> frozenset[str]:
    return frozenset(spec.id for spec in specs or ())


async def connect_mcp(runtime: Any, server: McpServer, **options: Any) -> McpBridge:
    """Bind ``server``'s tools to ``runtime`` (options: ``McpBridge``'s) and connect."""
    return await McpBridge(runtime, server, **options).start()
