"""The HTTP API's calls and pending actions over Temporal (``blade-runtime[http,temporal]``).

``create_temporal_app(tools, authenticate)`` serves the routes of ``create_app`` that calls and
pending actions need, answered by the call workflows of ``blade_runtime.temporal`` through
``TemporalTools``: the same paths, bodies, statuses and per-tenant rules (another tenant's
action does not exist: 404; the ``operator`` role sees all), so the typed ``HttpTransport``
client and the approval inbox (``/inbox``) work against it. A submission is the workflow's
update, validated before anything is recorded. The actions listing reads Temporal's visibility
store (no worker is asked), newest call first, paged with Temporal's page token.

    GET  /v1/tools                   the tools the principal may call (``tools.runtime``'s)
    POST /v1/tools/{name}/calls      the tool's arguments; Idempotency-Key: the call id
    GET  /v1/calls/{call_id}         the call as its workflow holds it
    GET  /v1/actions                 pending actions (?run_id=, ?tool=, ?limit=, ?cursor=,
                                     ?waiting_over=, ?waiting_under=; ?state=pending only)
    GET  /v1/actions/{id}            one pending action
    POST /v1/actions/{id}/submit     the payload
    POST /v1/actions/{id}/cancel     {"reason": ...} (optional)
    POST /v1/actions/{id}/fail       {"error": ...}
    POST /mcp                        with ``mcp=True``: the MCP endpoint (streamable HTTP) over
                                     the same tools, behind the same authentication
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.records import ago, suspension_json
from blade_runtime.core.results import ErrorCode
from blade_runtime.core.store import ActionRecord, BadCursor, storable_id
from blade_runtime.runtime import Runtime
from blade_runtime.serving.http.app import (
    DEFAULT_MAX_BODY_BYTES,
    Refused,
    _inbox_routes,
    _page_response,
    _paging,
    _seconds,
    action_body,
    anonymous,
    callable_by,
    error_response,
    file_response,
    json_response,
    tools_body,
)
from blade_runtime.serving.http.auth import (
    DEFAULT_AUTH_THREADS,
    Authenticate,
    AuthenticationFailed,
    Authenticator,
)
from blade_runtime.serving.http.errors import HttpError, status_of
from blade_runtime.serving.http.sites import Sites, TrustedSites
from blade_runtime.serving.trace_context import misplaced
from blade_runtime.temporal.client import TemporalTools, shares_files


def create_temporal_app(
    tools: TemporalTools,
    authenticate: Authenticate,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (),
    auth_threads: int = DEFAULT_AUTH_THREADS,
    inbox: bool = True,
    mcp: bool = False,
    allow_anonymous: bool = False,
) -> Starlette:
    """An ASGI app over ``tools``; ``authenticate(request)`` returns the Principal or None
    (401): an ``async def`` runs on the event loop, a plain function in a worker thread. The
    hosts, origins and JSON bodies it answers are ``create_app``'s (``allowed_hosts``,
    ``allowed_origins``); ``inbox``: serve the approval inbox at ``/inbox``; ``mcp``:
    ``blade-runtime[mcp]``'s MCP endpoint at ``/mcp`` (``TemporalBackend``), its callers those
    ``authenticate`` vouches for; ``allow_anonymous``: as ``create_app``'s (an operator, on
    loopback only)."""
    sites = Sites.of(allowed_hosts, allowed_origins)
    authenticated = Authenticator(authenticate, auth_threads)

    async def principal_of(request: Request) -> Principal:
        try:
            found = await authenticated(request)
        except AuthenticationFailed as failed:
            raise Refused(failed.code, failed.message) from None
        if found is None:
            if allow_anonymous:
                return anonymous(request)
            raise Refused(HttpError.UNAUTHENTICATED, "Authentication required.")
        return found

    async def body_of(request: Request, *, optional: bool = False) -> Any:
        raw = await request.body()
        if len(raw) > max_body_bytes:
            raise Refused(
                HttpError.BODY_TOO_LARGE, f"The body is larger than {max_body_bytes} bytes."
            )
        if not raw.strip():
            if optional:
                return None
            raise Refused(HttpError.MALFORMED_REQUEST, "The request needs a JSON body.")
        try:  # declared JSON: TrustedSites refused any other type before the route ran
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as error:
            raise Refused(HttpError.MALFORMED_REQUEST, f"The body is not JSON: {error}.") from None

    def route(
        handler: Callable[[Request, Principal], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request, await principal_of(request))
            except Refused as refused:
                return error_response(refused.code, refused.message)
            except BadCursor as bad:
                return error_response(HttpError.BAD_CURSOR, str(bad))

        return endpoint

    def runtime() -> Runtime:
        if tools.runtime is None:
            raise TypeError("create_temporal_app needs TemporalTools(runtime=...)")
        return tools.runtime

    def action_json(found: dict[str, Any]) -> dict[str, Any]:
        record = ActionRecord(**{k: v for k, v in found.items() if k in _ACTION_FIELDS})
        registration = (
            None if tools.runtime is None else tools.runtime.tools.by_name.get(record.name)
        )
        return action_body(record, registration)

    def answer(done: dict[str, Any]) -> Response:
        """A result as ``create_app`` answers it: an error as ``{code, message}``."""
        status = done.get("status")
        if status == "error":
            code = str(done.get("code"))
            return json_response({"code": code, "message": done.get("message")}, status_of(code))
        ids = {"call_id": done.get("call_id"), "run_id": done.get("run_id")}
        if status == "pending":
            return json_response(
                {"status": "pending", **ids, "action": action_json(done["action"])}, 202
            )
        content = done.get("content")
        return json_response(
            {"status": "success", **ids, "output": done.get("output", content), "content": content}
        )

    async def list_tools(request: Request, principal: Principal) -> Response:
        return json_response(tools_body(callable_by(runtime(), principal)))

    async def call(request: Request, principal: Principal) -> Response:
        call_id = request.headers.get("idempotency-key") or request.query_params.get("call_id")
        if call_id is not None and not storable_id(call_id):
            raise Refused(HttpError.MALFORMED_REQUEST, "The idempotency key is 1 to 200 chars.")
        run_id = request.query_params.get("run_id", "default")
        if not run_id:
            raise Refused(HttpError.MALFORMED_REQUEST, "run_id must not be empty.")
        refused = misplaced(request.query_params)
        if refused is not None:
            raise Refused(
                HttpError.MALFORMED_REQUEST, f"{refused} is 1 to 200 printable characters."
            )
        arguments = await body_of(request)
        if not isinstance(arguments, dict):
            raise Refused(HttpError.MALFORMED_REQUEST, "The arguments are a JSON object.")
        done = await tools.call(
            request.path_params["name"],
            arguments,
            call_id=call_id,
            run_id=run_id,
            context=CallContext(
                principal,
                thread_id=request.query_params.get("thread_id"),
                agent_id=request.query_params.get("agent_id"),
            ),
        )
        return answer(done)

    async def read_call(request: Request, principal: Principal) -> Response:
        call_id = request.path_params["call_id"]
        found = await tools.state(call_id, principal=principal) if storable_id(call_id) else None
        if found is None:
            raise Refused(HttpError.UNKNOWN_CALL, f"No call {call_id!r}.")
        spec_id = found.get("spec_id")
        if spec_id is None:  # a call that never waited: its tool's registration names it
            registration = runtime().tools.by_name.get(found["name"])
            spec_id = None if registration is None else registration.spec.id
        channel = request.query_params.get("channel")
        data: dict[str, list[dict[str, Any]]] = {}
        for item in found.get("data") or ():
            if channel in (None, item["channel"]):
                data.setdefault(item["channel"], []).append(
                    {
                        "id": item["item_id"],
                        "value": item["value"],
                        "updated_at": item["updated_at"],
                    }
                )
        result = found["result"]
        if isinstance(result, dict) and result.get("status") == "pending":
            result = None  # as a store keeps a waiting call: no result yet
        episodes = _suspensions(found)
        return json_response(
            {
                "call_id": found["call_id"],
                "run_id": found["run_id"],
                "name": found["name"],
                "spec_id": spec_id,
                "state": found.get("state", "running"),
                "started_at": found.get("started_at"),
                "input": found["input"],
                "result": result,
                "thread_id": found.get("thread_id"),
                "agent_id": found.get("agent_id"),
                "data": data,
                "suspensions": episodes,
                "pending_suspension": next((e for e in episodes if e["state"] == "pending"), None),
                # Slots and locks bind within each worker's runtime on Temporal (its activity
                # store), out of this app's sight: it lists none (docs/temporal.md).
                "slots": [],
                "waiting": False,
            }
        )

    async def list_actions(request: Request, principal: Principal) -> Response:
        query = request.query_params
        if query.get("state", "pending") != "pending":
            raise Refused(
                HttpError.MALFORMED_REQUEST,
                "state is pending on Temporal: its visibility store lists waiting calls only.",
            )
        limit, cursor = _paging(request)
        over, under = _seconds(query, "waiting_over"), _seconds(query, "waiting_under")
        page = await tools.pending_page(
            principal=principal,
            run_id=query.get("run_id"),
            tool=query.get("tool"),
            limit=limit,
            cursor=cursor,
        )
        items = page.items
        # waiting times narrow the page here (a page may then hold fewer than ``limit``)
        if over is not None:
            items = [a for a in items if a["suspended_at"] <= ago(over)]
        if under is not None:
            items = [a for a in items if a["suspended_at"] >= ago(under)]
        return _page_response(request, "actions", [action_json(a) for a in items], page)

    async def visible(action_id: str, principal: Principal) -> dict[str, Any]:
        found = await tools.action(action_id, principal=principal)
        if found is None:
            raise Refused(ErrorCode.UNKNOWN_ACTION, f"No pending action {action_id!r}.")
        return found

    async def read_action(request: Request, principal: Principal) -> Response:
        return json_response(
            action_json(await visible(request.path_params["action_id"], principal))
        )

    async def submit(request: Request, principal: Principal) -> Response:
        payload = await body_of(request)
        action_id = request.path_params["action_id"]
        return answer(await tools.submit(action_id, payload, principal=principal))

    async def settle(request: Request, principal: Principal) -> Response:
        fields = await body_of(request, optional=True)
        if fields is not None and not isinstance(fields, dict):
            raise Refused(HttpError.MALFORMED_REQUEST, "The body is a JSON object.")
        cancelling = request.url.path.endswith("/cancel")
        key = "reason" if cancelling else "error"
        text = (fields or {}).get(key, "cancelled" if cancelling else None)
        if not isinstance(text, str) or not text.strip() or "\x00" in text:
            raise Refused(HttpError.MALFORMED_REQUEST, f"{key} is a non-empty string without NUL.")
        action_id = request.path_params["action_id"]
        if cancelling:
            done = await tools.cancel(action_id, text, principal=principal)
        else:
            done = await tools.fail(action_id, text, principal=principal)
        if done.get("code") in ("CANCELLED", "TOOL_FAILED"):  # what was asked: settled so
            fields_of = ("status", "call_id", "run_id", "code", "message")
            return json_response({name: done.get(name) for name in fields_of})
        return answer(done)

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(HttpError.NOT_FOUND, f"No route {request.url.path}.")

    def not_served(why: str) -> Callable[[Request], Awaitable[Response]]:
        async def refuse(request: Request, principal: Principal) -> Response:
            raise Refused(HttpError.NOT_SERVED, f"{request.url.path}: {why}")

        return route(refuse)

    async def read_file(request: Request, principal: Principal) -> Response:
        file_id = request.path_params["file_id"]
        return file_response(file_id, await tools.file(file_id, principal))

    # files live in the workers' backend: served where the registrations name the shared one
    files_here = tools.runtime is not None and shares_files(tools.runtime)
    routes = [
        Route("/v1/tools", route(list_tools), methods=["GET"]),
        Route("/v1/tools/{name}/calls", route(call), methods=["POST"]),
        Route("/v1/calls/{call_id:path}", route(read_call), methods=["GET"]),  # ids may hold "/"
        Route("/v1/actions", route(list_actions), methods=["GET"]),
        Route("/v1/actions/{action_id}", route(read_action), methods=["GET"]),
        Route("/v1/actions/{action_id}/submit", route(submit), methods=["POST"]),
        Route("/v1/actions/{action_id}/cancel", route(settle), methods=["POST"]),
        Route("/v1/actions/{action_id}/fail", route(settle), methods=["POST"]),
        # create_app's other routes, each with why Temporal does not serve it (docs/temporal.md)
        Route("/v1/runs/{run_id}/events", not_served(NO_EVENTS), methods=["GET"]),
        Route("/v1/runs/{run_id}/calls", not_served(NO_LISTING), methods=["GET"]),
        Route("/v1/runs/{run_id}/context", not_served(NO_RUN_CONTEXT), methods=["GET"]),
        Route(
            "/v1/files/{file_id}",
            route(read_file) if files_here else not_served(NO_FILES),
            methods=["GET"],
        ),
        Route("/v1/grants", not_served(NO_GRANTS), methods=["GET"]),
        Route("/v1/grants/{grant_id}", not_served(NO_GRANTS), methods=["DELETE"]),
    ]
    if inbox:
        routes += _inbox_routes()
    lifespan = None
    if mcp:
        from blade_runtime.serving.mcp import McpMount
        from blade_runtime.serving.mcp_temporal import TemporalBackend

        def refused(error: Exception) -> Response | None:
            return error_response(error.code, error.message) if isinstance(error, Refused) else None

        mount = McpMount(
            TemporalBackend(tools), principal_of, refused, inbox_path="/inbox" if inbox else None
        )
        routes.append(Route("/mcp", mount))
        lifespan = mount.lifespan
    return Starlette(
        routes=routes,
        middleware=[Middleware(TrustedSites, sites=sites)],
        exception_handlers={404: not_found},
        lifespan=lifespan,
    )


NO_EVENTS = (
    "run event streams are not served from Temporal: a worker's ActivityStore drops a call's "
    "events when its activity returns, and a workflow's history holds steps, not events; read "
    "a call with GET /v1/calls/{call_id}"
)
NO_LISTING = (
    "no visibility query lists a run's settled calls; read a call with GET /v1/calls/{call_id}"
)
NO_RUN_CONTEXT = (
    "a run's context is what its tools' context patches made, kept by a store the workers "
    "share, which tools on Temporal do not have; a call's answer lists the effects it emitted"
)
NO_FILES = (
    "files live in the workers' file backend; this app serves them when the registrations it "
    "was given name the one the workers share (Runtime(files=FolderFiles(path)))"
)
NO_GRANTS = "standing grants are kept by a store, which tools on Temporal do not have"

_ACTION_FIELDS = frozenset(ActionRecord.__dataclass_fields__)


def _suspensions(found: dict[str, Any]) -> list[dict[str, Any]]:
    """The call's suspension episodes from its workflow: the actions of its last snapshot, each
    in the state the workflow has seen it resolved to since (an answer given after that
    snapshot has no ``resolved_at`` or ``resume`` here until the call's next one)."""
    resolved = found.get("resolved") or {}
    episodes = []
    for raw in found.get("actions") or ():
        action = ActionRecord(**raw)
        if action.point is None or action.point.startswith("@"):
            continue  # a client tool's output or a permission request
        told = resolved.get(action.action_id)
        if action.state == "pending" and told is not None:
            action = replace(action, state=told)
        episodes.append(suspension_json(action))
    return episodes
