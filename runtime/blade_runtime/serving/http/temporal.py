"""The HTTP API's calls and pending actions over Temporal (``blade-runtime[http,temporal]``).

``create_temporal_app(tools, authenticate)`` serves the routes of ``create_app`` that calls and
pending actions need, answered by the call workflows of ``blade_runtime.temporal`` through
``TemporalTools``: the same paths, bodies, statuses and per-tenant rules (another tenant's
action does not exist: 404; the ``operator`` role sees all). A submission is the workflow's
update, validated before anything is recorded.

    POST /v1/tools/{name}/calls      the tool's arguments; Idempotency-Key: the call id
    GET  /v1/calls/{call_id}         the call as its workflow holds it
    GET  /v1/actions                 pending actions (?run_id=, ?tool=)
    GET  /v1/actions/{id}            one pending action
    POST /v1/actions/{id}/submit     the payload
    POST /v1/actions/{id}/cancel     {"reason": ...} (optional)
    POST /v1/actions/{id}/fail       {"error": ...}
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.results import ErrorCode
from blade_runtime.core.store import storable_id
from blade_runtime.serving.http.app import (
    DEFAULT_MAX_BODY_BYTES,
    Refused,
    error_response,
    json_response,
)
from blade_runtime.serving.http.auth import (
    DEFAULT_AUTH_THREADS,
    Authenticate,
    AuthenticationFailed,
    Authenticator,
)
from blade_runtime.serving.http.errors import HttpError, status_of
from blade_runtime.serving.http.sites import Sites, TrustedSites
from blade_runtime.temporal.client import TemporalTools

_STATUS_OF_SUCCESS = {"success": 200, "pending": 202}


def create_temporal_app(
    tools: TemporalTools,
    authenticate: Authenticate,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (),
    auth_threads: int = DEFAULT_AUTH_THREADS,
) -> Starlette:
    """An ASGI app over ``tools``; ``authenticate(request)`` returns the Principal or None
    (401): an ``async def`` runs on the event loop, a plain function in a worker thread. The
    hosts, origins and JSON bodies it answers are ``create_app``'s (``allowed_hosts``,
    ``allowed_origins``)."""
    sites = Sites.of(allowed_hosts, allowed_origins)
    authenticated = Authenticator(authenticate, auth_threads)

    async def principal_of(request: Request) -> Principal:
        try:
            found = await authenticated(request)
        except AuthenticationFailed as failed:
            raise Refused(failed.code, failed.message) from None
        if found is None:
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

        return endpoint

    def answer(result: dict[str, Any]) -> Response:
        if result.get("status") == "error":
            code = str(result.get("code"))
            return json_response(result, status_of(code))
        return json_response(result, _STATUS_OF_SUCCESS.get(str(result.get("status")), 200))

    async def call(request: Request, principal: Principal) -> Response:
        call_id = request.headers.get("idempotency-key") or request.query_params.get("call_id")
        if call_id is not None and not storable_id(call_id):
            raise Refused(HttpError.MALFORMED_REQUEST, "The idempotency key is 1 to 200 chars.")
        arguments = await body_of(request)
        if not isinstance(arguments, dict):
            raise Refused(HttpError.MALFORMED_REQUEST, "The arguments are a JSON object.")
        done = await tools.call(
            request.path_params["name"],
            arguments,
            call_id=call_id,
            run_id=request.query_params.get("run_id", "default"),
            context=CallContext(principal, thread_id=request.query_params.get("thread_id")),
        )
        return answer(done)

    async def read_call(request: Request, principal: Principal) -> Response:
        call_id = request.path_params["call_id"]
        found = await tools.state(call_id, principal=principal) if storable_id(call_id) else None
        if found is None:
            raise Refused(HttpError.UNKNOWN_CALL, f"No call {call_id!r}.")
        return json_response(found)

    async def list_actions(request: Request, principal: Principal) -> Response:
        query = request.query_params
        found = await tools.pending(principal=principal, run_id=query.get("run_id"))
        tool = query.get("tool")
        return json_response({"actions": [a for a in found if tool in (None, a["name"])]})

    async def visible(action_id: str, principal: Principal) -> dict[str, Any]:
        found = await tools.action(action_id, principal=principal)
        if found is None:
            raise Refused(ErrorCode.UNKNOWN_ACTION, f"No pending action {action_id!r}.")
        return found

    async def read_action(request: Request, principal: Principal) -> Response:
        return json_response(await visible(request.path_params["action_id"], principal))

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
        if not isinstance(text, str) or not text.strip():
            raise Refused(HttpError.MALFORMED_REQUEST, f"{key} is a non-empty string.")
        action_id = request.path_params["action_id"]
        if cancelling:
            done = await tools.cancel(action_id, text, principal=principal)
        else:
            done = await tools.fail(action_id, text, principal=principal)
        if done.get("code") in ("CANCELLED", "TOOL_FAILED"):
            return json_response(done)  # what was asked for: the call settled so
        return answer(done)

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(HttpError.NOT_FOUND, f"No route {request.url.path}.")

    routes = [
        Route("/v1/tools/{name}/calls", route(call), methods=["POST"]),
        Route("/v1/calls/{call_id}", route(read_call), methods=["GET"]),
        Route("/v1/actions", route(list_actions), methods=["GET"]),
        Route("/v1/actions/{action_id}", route(read_action), methods=["GET"]),
        Route("/v1/actions/{action_id}/submit", route(submit), methods=["POST"]),
        Route("/v1/actions/{action_id}/cancel", route(settle), methods=["POST"]),
        Route("/v1/actions/{action_id}/fail", route(settle), methods=["POST"]),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(TrustedSites, sites=sites)],
        exception_handlers={404: not_found},
    )
