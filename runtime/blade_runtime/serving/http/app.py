"""The ASGI app: the runtime's calls, pending actions and events over HTTP, per tenant.

A request reaches a route only when its Host, its browser Origin and a POST's declared JSON body
pass ``TrustedSites`` (``sites.py``). Every request is then authenticated by the application's
``authenticate(request)`` (``auth.py``: a Principal, or None: refused with 401) before anything
is read or written. A principal sees only its tenant's
calls, actions, files and event streams (another tenant's do not exist: 404); the ``operator``
role sees all. Every read goes through ``runtime.records`` with the request's principal, and
every submit, cancel and fail takes it: the store's record decides whose a call is, never a
memory of this process (another process sharing the store may have made the call a key names).
Progress and messages (``ctx.progress``, ``ctx.message``) reach the run's event stream as
transient events without an ``id``, in order with the stored ones. A call is keyed
by its ``Idempotency-Key`` (its call id): a retry, or the same request sent twice at once,
returns the first call's result and never runs the tool again; the store's record of the call
answers it, and this process keeps answers only of calls the store does not record
(``idempotency.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final
from urllib.parse import quote

from pydantic import JsonValue
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.context import CallInfo
from blade_runtime.core.effects import Effect, effects_json
from blade_runtime.core.events import WINDOW, Subscription
from blade_runtime.core.files import FileBody
from blade_runtime.core.outcomes import stored_effects, stored_metadata
from blade_runtime.core.records import MAX_PAGE_SIZE, Page, visible
from blade_runtime.core.registry import Registration
from blade_runtime.core.results import (
    ErrorCode,
    ToolError,
    ToolPending,
    ToolResult,
    ToolSkipped,
    ToolSuccess,
)
from blade_runtime.core.store import (
    ActionRecord,
    ActionState,
    BadCursor,
    CallRecord,
    Event,
    GrantRecord,
    StoreUnavailable,
    encodable,
    storable_id,
)
from blade_runtime.core.tools import enabled_for
from blade_runtime.runtime import Runtime
from blade_runtime.serving.http.auth import (
    DEFAULT_AUTH_THREADS,
    Authenticate,
    AuthenticationFailed,
    Authenticator,
)
from blade_runtime.serving.http.errors import MAX_HEADER_BYTES, HttpError, one_line, status_of
from blade_runtime.serving.http.idempotency import NOTHING_RAN, Answer, Answers, fingerprint
from blade_runtime.serving.http.openapi import openapi_document
from blade_runtime.serving.http.sites import Sites, TrustedSites, loopback
from blade_runtime.serving.trace_context import call_context, misplaced, traceparent

log = logging.getLogger("blade_runtime.serving.http")

DEFAULT_MAX_BODY_BYTES: Final = 1 << 20
IN_PROGRESS_WAIT_S: Final = 30.0  # how long a retry waits for a call running elsewhere
HEARTBEAT_S: Final = 15.0
DEFAULT_MAX_STREAMS: Final = 8
"""Event streams one principal may hold open on one server at once (one more is 429)."""
DEFAULT_LAG_LIMIT_S: Final = 30.0
"""How long a stream's reader may stay a whole window behind before it is told to resume."""
DEFAULT_WRITE_TIMEOUT_S: Final = 60.0
"""How long one write of a stream may wait for a client that reads nothing, before it is cut."""
OPENAPI_KEPT: Final = 64  # OpenAPI documents kept, one per set of tools callers may call
ANONYMOUS: Final = Principal("anonymous", "", frozenset({"operator"}))
ACTION_STATES: Final = ("pending", "submitted", "cancelled", "failed", "expired")


class Refused(Exception):
    """A request answered with an error body ``{code, message}``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = one_line(message)


def error_response(code: str, message: str) -> Response:
    return json_response({"code": str(code), "message": one_line(message)}, status_of(code))


def json_response(data: Any, status: int = 200) -> Response:
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        body = text.encode()
    except UnicodeEncodeError:  # a lone surrogate an implementation wrote: JSON escapes hold it
        body = json.dumps(data, allow_nan=False, separators=(",", ":")).encode()
    return Response(body, status, media_type="application/json")


@dataclass(slots=True)
class _Outcome:
    """What a call answered (its arguments kept only while it is in flight, for a concurrent
    request with the same key to be compared with)."""

    tenant: str
    context: JsonValue  # the caller's CallContext as JSON: who may retry or read it (``visible``)
    name: str
    arguments: JsonValue
    status: int
    body: JsonValue
    run_id: str = ""


def kept_call_json(
    answer: Answer, call_id: str, spec_id: str, data: dict[str, JsonValue]
) -> dict[str, JsonValue]:
    """A call the store keeps no record of, as ``GET /v1/calls/{id}`` shows a stored one, from
    its kept first answer (its input is not kept: null)."""
    body = json.loads(answer.body) if answer.body is not None else None
    result: JsonValue = None
    if isinstance(body, dict):
        if body.get("status") in ("success", "skipped"):
            result = {"status": "success", "content": body.get("content")}
        else:
            result = {"status": "error", "code": body.get("code"), "message": body.get("message")}
    return {
        "call_id": call_id,
        "run_id": answer.run_id,
        "name": answer.name,
        "spec_id": spec_id,
        "state": "settled",
        "started_at": None,
        "input": None,
        "result": result,
        **placement(answer.context),
        "data": data,
    }


def placement(context: JsonValue) -> dict[str, JsonValue]:
    """Where a call runs, from its stored caller context: its thread and executing agent."""
    found = CallContext.from_json(context)
    if found is None:
        return {"thread_id": None, "agent_id": None}
    return {"thread_id": found.thread_id, "agent_id": found.agent_id}


class Api:
    """The routes' shared state: the runtime, the authentication, the idempotency table."""

    def __init__(
        self,
        runtime: Runtime,
        authenticate: Authenticate,
        allow_anonymous: bool,
        max_body_bytes: int,
        auth_threads: int = DEFAULT_AUTH_THREADS,
    ) -> None:
        self.runtime = runtime
        self.authenticate = Authenticator(authenticate, auth_threads)
        self.allow_anonymous = allow_anonymous
        self.max_body_bytes = max_body_bytes
        self.records = runtime.records
        self._inflight: dict[str, tuple[_Outcome, asyncio.Future[_Outcome]]] = {}
        self.answers = Answers()
        # Derived from the registrations, kept while they are the same (Tools.generation).
        self._openapi: dict[tuple[int, tuple[str, ...]], bytes] = {}
        self.streams: dict[tuple[str, str], set[Subscription]] = {}  # open, by principal
        self.max_streams = DEFAULT_MAX_STREAMS
        self.lag_limit_s = DEFAULT_LAG_LIMIT_S
        self.write_timeout_s = DEFAULT_WRITE_TIMEOUT_S
        self.window = WINDOW

    def open_stream(self, principal: Principal, run_id: str, after: int) -> Subscription:
        """A subscription to the run for ``principal``, within its share of streams (429)."""
        key = (principal.tenant, principal.id)
        open_now = self.streams.setdefault(key, set())
        if len(open_now) >= self.max_streams:
            raise Refused(
                HttpError.TOO_MANY_STREAMS,
                f"{len(open_now)} event streams are open for this principal, as many as this "
                "server allows; close one (or resume it with Last-Event-ID).",
            )
        subscription = self.runtime.subscribe(
            run_id, after=after, principal=principal, window=self.window
        )
        open_now.add(subscription)
        return subscription

    def end_stream(self, principal: Principal, subscription: Subscription) -> None:
        """The stream ended (its client went, or the server stops): no await, so a cancelled
        response's clean-up still ends it."""
        subscription.drop()
        open_now = self.streams.get((principal.tenant, principal.id))
        if open_now is not None:
            open_now.discard(subscription)
            if not open_now:
                del self.streams[(principal.tenant, principal.id)]

    def close_streams(self) -> None:
        """End every open event stream (a server shutting down): clients reconnect elsewhere
        with Last-Event-ID."""
        for open_now in list(self.streams.values()):
            for subscription in list(open_now):
                subscription.drop()

    # -- the request's principal and body ----------------------------------------------------

    async def principal(self, request: Request) -> Principal:
        try:
            found = await self.authenticate(request)
        except AuthenticationFailed as failed:
            raise Refused(failed.code, failed.message) from None
        if found is not None:
            return found
        if not self.allow_anonymous:
            raise Refused(HttpError.UNAUTHENTICATED, "Authentication required.")
        return anonymous(request)

    async def body(self, request: Request, *, optional: bool = False) -> JsonValue:
        """The request's JSON body, within the size limit (read no further than it). Its
        declared type is JSON: ``TrustedSites`` refused any other before the route ran."""
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            raise Refused(HttpError.BODY_TOO_LARGE, self._too_large())
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise Refused(HttpError.BODY_TOO_LARGE, self._too_large())
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw.strip():
            if optional:
                return None
            raise Refused(HttpError.MALFORMED_REQUEST, "The request needs a JSON body.")
        try:
            value: JsonValue = json.loads(raw, parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError) as error:
            raise Refused(HttpError.MALFORMED_REQUEST, f"The body is not JSON: {error}.") from None
        except RecursionError:
            raise Refused(HttpError.MALFORMED_REQUEST, "The body is nested too deeply.") from None
        if _SURROGATE_ESCAPE.search(raw) and _lone_surrogate(value):
            raise Refused(
                HttpError.MALFORMED_REQUEST,
                "The body's text holds a lone surrogate (an unpaired \\ud800-\\udfff "
                "escape): send valid Unicode.",
            )
        return value

    def _too_large(self) -> str:
        return f"The body is larger than {self.max_body_bytes} bytes."

    # -- visibility --------------------------------------------------------------------------

    async def visible_action(self, principal: Principal, action_id: str) -> ActionRecord:
        record = await self.records.action(action_id, principal=principal)
        if record is None:
            raise Refused(ErrorCode.UNKNOWN_ACTION, f"No pending action {action_id!r}.")
        return record

    # -- calls --------------------------------------------------------------------------------

    async def call(
        self,
        principal: Principal,
        name: str,
        arguments: JsonValue,
        *,
        call_id: str | None,
        run_id: str,
        thread_id: str | None,
        agent_id: str | None = None,
    ) -> _Outcome:
        where = (run_id, thread_id, agent_id)
        if call_id is None:
            return await self._call(principal, name, arguments, None, *where)
        inflight = self._inflight.get(call_id)
        if inflight is not None:
            self._same(principal, name, arguments, inflight[0])
            try:
                return await asyncio.shield(inflight[1])
            except asyncio.CancelledError:
                if not inflight[1].cancelled():
                    raise  # this request was cancelled
            # the first request was cancelled: this one answers from the store, or calls
            return await self.call(
                principal,
                name,
                arguments,
                call_id=call_id,
                run_id=run_id,
                thread_id=thread_id,
                agent_id=agent_id,
            )
        # In flight from here on, before anything awaits: a concurrent request with this key
        # waits for this one's answer instead of calling too.
        future: asyncio.Future[_Outcome] = asyncio.get_running_loop().create_future()
        asked = _Outcome(principal.tenant, _context_json(principal), name, arguments, 0, None)
        self._inflight[call_id] = (asked, future)
        earlier = None
        try:
            earlier = await self._earlier(principal, name, arguments, call_id)
            if earlier is not None:
                outcome = await earlier
            else:
                outcome = await self._call(principal, name, arguments, call_id, *where)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved: a lone request leaves no unobserved exception
            raise
        finally:
            del self._inflight[call_id]
        future.set_result(outcome)
        if earlier is None and self._unrecorded_run(outcome):
            body = json_response(outcome.body, outcome.status).body
            self.answers.keep(
                call_id,
                principal,
                Answer(
                    outcome.tenant,
                    outcome.context,
                    name,
                    fingerprint(name, arguments),
                    outcome.status,
                    bytes(body),
                    outcome.run_id,
                    0.0,
                ),
            )
        return outcome

    def _unrecorded_run(self, outcome: _Outcome) -> bool:
        """Whether a call ran that the store keeps no record of: its answer is kept here. A
        durable store records every registered tool's call before it runs; a refusal before
        anything ran keeps nothing."""
        body = outcome.body
        if isinstance(body, dict) and "status" not in body and body.get("code") in NOTHING_RAN:
            return False
        return not self.runtime.store.durable or self.registration(outcome.name) is None

    @staticmethod
    def _same(principal: Principal, name: str, arguments: JsonValue, earlier: _Outcome) -> None:
        """Refuse a request in flight with a key a request in flight took that is not that
        request again: another caller (as ``visible`` decides), another tool or arguments."""
        mine = visible(principal, earlier.tenant, earlier.context)
        refused = _mismatch(mine, earlier.name, name, earlier.arguments == arguments)
        if refused is not None:
            raise refused

    async def _earlier(
        self, principal: Principal, name: str, arguments: JsonValue, call_id: str
    ) -> Awaitable[_Outcome] | None:
        """The answer to a retry of a call made before (here, or by another process): the
        store's record first, whoever made it; this process's kept answer only where the store
        has no record of the call."""
        seen = await self.records.sees_call(call_id, principal=principal)
        if seen is False:  # the store's call, another caller's: refused before anything runs
            raise Refused(HttpError.IDEMPOTENCY_CONFLICT, ANOTHER_CALL)
        record = None if seen is None else await self.records.call(call_id, principal=principal)
        if record is not None:
            refused = _mismatch(True, record.name, name, dict(record.input) == arguments)
            if refused is not None:
                raise refused
            return self._from_record(record, principal, name, arguments)
        kept = self.answers.get(call_id)
        if kept is None:
            return None  # a new key (or one made meanwhile: runtime.call decides)
        mine = visible(principal, kept.tenant, kept.context)
        refused = _mismatch(mine, kept.name, name, kept.fingerprint == fingerprint(name, arguments))
        if refused is not None:
            raise refused
        if kept.body is None:
            raise Refused(
                HttpError.IDEMPOTENCY_CONFLICT,
                f"The call {call_id} ran under this key; its answer is no longer kept here: "
                "use a new key to call again.",
            )
        body = json.loads(kept.body)
        return _ready(
            _Outcome(kept.tenant, kept.context, name, arguments, kept.status, body, kept.run_id)
        )

    async def _from_record(
        self, record: CallRecord, principal: Principal, name: str, arguments: JsonValue
    ) -> _Outcome:
        """A stored call as its first request was answered (waiting while it runs elsewhere)."""
        waited = 0.0
        while record.state in ("running", "resumable"):
            if waited >= IN_PROGRESS_WAIT_S:
                raise Refused(
                    HttpError.CALL_IN_PROGRESS,
                    f"The call {record.call_id} is still running; retry later.",
                )
            await asyncio.sleep(0.02)
            waited += 0.02
            again = await self.records.call(record.call_id, principal=principal)
            if again is None:
                break
            record = again
        status, body = await self._stored_result(record, principal)
        context = record.context
        return _Outcome(record.tenant, context, name, arguments, status, body, record.run_id)

    async def _stored_result(
        self, record: CallRecord, principal: Principal
    ) -> tuple[int, JsonValue]:
        ids: dict[str, JsonValue] = {"call_id": record.call_id, "run_id": record.run_id}
        if record.state in ("suspended", "pending"):
            waiting = await self.records.actions(call_id=record.call_id, principal=principal)
            if waiting:
                action = self.action_json(waiting[0])
                return 202, {"status": "pending", **ids, "action": action}
        result = record.result
        metadata = stored_metadata(result)
        effects = stored_effects(result)
        if isinstance(result, dict) and result.get("status") == "error":
            code = str(result.get("code"))
            error: dict[str, JsonValue] = {"code": code, "message": str(result.get("message"))}
            return status_of(code), _with_result_fields(error, metadata, effects)
        content = result.get("content") if isinstance(result, dict) else None
        output = result.get("output", content) if isinstance(result, dict) else None
        answer: dict[str, JsonValue] = {"status": "success", **ids, "output": output}
        answer["content"] = content
        return 200, _with_result_fields(answer, metadata, effects)

    async def _call(
        self,
        principal: Principal,
        name: str,
        arguments: JsonValue,
        call_id: str | None,
        run_id: str,
        thread_id: str | None,
        agent_id: str | None,
    ) -> _Outcome:
        if not isinstance(arguments, dict):
            raise Refused(ErrorCode.INVALID_INPUT, "The arguments must be a JSON object.")
        context = call_context(principal, _TRACEPARENT.get(), thread_id, agent_id)
        generated = call_id is None
        call_id = f"call_{uuid.uuid4().hex}" if call_id is None else call_id
        result = await self.runtime.call(
            name, arguments, call_id=call_id, run_id=run_id, context=context
        )
        if isinstance(result, ToolError) and result.code == ErrorCode.DUPLICATE_CALL:
            # made meanwhile (by another request, or another process): the store's call, if
            # it is this caller's, else the key is another call's (409)
            record = None if generated else await self.records.call(call_id, principal=principal)
            if record is not None:
                refused = _mismatch(True, record.name, name, dict(record.input) == arguments)
                if refused is not None:
                    raise refused
                return await self._from_record(record, principal, name, arguments)
            if not generated:  # a call this principal may not see holds the key
                raise Refused(HttpError.IDEMPOTENCY_CONFLICT, ANOTHER_CALL)
        status, body = await self.result_json(result, principal)
        return _Outcome(principal.tenant, context.to_json(), name, arguments, status, body, run_id)

    async def result_json(
        self, result: ToolResult[Any], principal: Principal
    ) -> tuple[int, JsonValue]:
        """A runtime result as the API answers it: errors as ``{code, message}``."""
        if isinstance(result, ToolError):
            error: dict[str, JsonValue] = {"code": result.code.value, "message": result.message}
            return status_of(result.code), _with_result_fields(
                error, result.metadata, result.effects
            )
        ids: dict[str, JsonValue] = {"call_id": result.call.call_id, "run_id": result.call.run_id}
        if isinstance(result, ToolPending):
            record = await self.records.action(result.action.action_id, principal=principal)
            action: JsonValue = (
                self.action_json(record)
                if record is not None
                else {"action_id": result.action.action_id, "name": result.action.name}
            )
            return 202, {"status": "pending", **ids, "action": action}
        if isinstance(result, ToolSkipped):
            return 200, {
                "status": "skipped",
                **ids,
                "reason": result.reason,
                "content": result.content,
            }
        output = result.content if result.output_json is None else result.output_json
        answer: dict[str, JsonValue] = {"status": "success", **ids, "output": output}
        answer["content"] = result.content
        if isinstance(result, ToolSuccess) and result.artifact is not None:
            # what the model reads was over the tool's large_result_bytes: the whole of it
            answer["artifact"] = {
                "file_id": result.artifact,
                "url": f"/v1/files/{result.artifact}",
            }
        if isinstance(result, ToolSuccess):
            _with_result_fields(answer, result.metadata, result.effects)
        return 200, answer

    # -- records as JSON ---------------------------------------------------------------------

    def action_json(self, record: ActionRecord) -> dict[str, JsonValue]:
        return action_body(record, self.registration(record.name))

    def call_json(self, record: CallRecord) -> dict[str, Any]:
        return {
            "call_id": record.call_id,
            "run_id": record.run_id,
            "name": record.name,
            "spec_id": record.spec_id,
            "state": record.state,
            "started_at": record.started_at,
            "input": dict(record.input),
            "result": record.result,
            **placement(record.context),
        }

    async def data_json(
        self, call_id: str, channel: str | None, principal: Principal | None
    ) -> dict[str, JsonValue]:
        """The call's ToolData by channel, as ``principal`` may see it (None: a call the store
        keeps no record of, whose kept first answer the caller was found to own)."""
        channels: dict[str, JsonValue] = {}
        for item in await self.records.data(call_id, channel, principal=principal):
            items = channels.setdefault(item.channel, [])
            assert isinstance(items, list)
            items.append({"id": item.item_id, "value": item.value, "updated_at": item.updated_at})
        return channels

    async def slots_json(self, call_id: str) -> list[dict[str, JsonValue]]:
        """The call's places in the queues of its concurrency slots and resource locks, as
        every worker of the store sees them (``core.slots``): held, or waited for."""
        rows = await self.runtime.io(self.runtime.store.slots, call_id=call_id)
        return [{"key": r.slot_key, "held": r.held, "capacity": r.capacity} for r in rows]

    def registration(self, name: str) -> Registration[Any] | None:
        """The registration named ``name`` now."""
        return self.runtime.tools.by_name.get(name)

    def kept(self, call_id: str) -> Answer | None:
        return self.answers.get(call_id)

    def callable_by(self, principal: Principal) -> list[Registration[Any]]:
        return callable_by(self.runtime, principal)

    def openapi(self, principal: Principal) -> bytes:
        """The OpenAPI document of the tools ``principal`` may call, kept per set of tools
        while the registrations stay as they are."""
        chosen = self.callable_by(principal)
        key = (self.runtime.tools.generation, tuple(r.name for r in chosen))
        document = self._openapi.get(key)
        if document is None:
            if len(self._openapi) >= OPENAPI_KEPT:
                self._openapi.clear()  # registrations changed, or many distinct tool sets
            document = self._openapi[key] = json.dumps(openapi_document(chosen)).encode()
        return document


async def _ready(outcome: _Outcome) -> _Outcome:
    return outcome


ANOTHER_CALL: Final = "This idempotency key was used for another call; use a new key."


def _mismatch(mine: bool, earlier: str, name: str, same_arguments: bool) -> Refused | None:
    """The refusal of a request whose key an earlier call took (None: it is that call's
    retry). Another caller's call is not described; one's own says what differs."""
    if not mine:
        message = ANOTHER_CALL
    elif earlier != name:
        message = (
            f"This idempotency key was used for a call of {earlier}, not {name}: "
            "use a new key for another call."
        )
    elif not same_arguments:
        message = (
            f"This idempotency key was used for a call of {name} with other arguments: send "
            "the same arguments to retry that call, or use a new key for another call."
        )
    else:
        return None
    return Refused(HttpError.IDEMPOTENCY_CONFLICT, message)


def action_body(
    record: ActionRecord, registration: Registration[Any] | None
) -> dict[str, JsonValue]:
    """A pending action as the API answers it (``registration``: its tool's, for the
    description; ``create_temporal_app`` answers with the same)."""
    asker = record.principal or None  # who asked: its call's principal, on the record
    return {
        "kind": record.spec_id if record.point is None else f"{record.spec_id}#{record.point}",
        "action_id": record.action_id,
        "name": record.name if record.point is None else f"{record.name}.{record.point}",
        "tool": record.name,
        "spec_id": record.spec_id,
        "point": record.point,
        "call_id": record.call_id,
        "run_id": record.run_id,
        "principal_id": asker,
        "thread_id": record.thread_id,
        "agent_id": record.agent_id,
        "suspended_at": record.suspended_at,
        "input": record.payload,
        "state": record.state,
        "resolved_at": record.resolved_at,
        "reason": record.reason,
        "expires_at": record.expires_at,
        "description": None if registration is None else registration.spec.description,
        "title": None if registration is None else registration.title,
        "submit_schema": dict(record.submit_schema),
    }


def callable_by(runtime: Runtime, principal: Principal) -> list[Registration[Any]]:
    """The registrations ``principal`` may call now: allowed, and enabled for its calls."""
    context = CallContext(principal=principal)
    chosen = []
    for registration in runtime.registrations():
        if not runtime.is_allowed(registration.name):
            continue
        if registration.enabled is not None:
            call = CallInfo("", "default", registration.name, registration.spec.id, context)
            if not enabled_for(registration, call):
                continue
        chosen.append(registration)
    return chosen


def tools_body(registrations: Sequence[Registration[Any]]) -> dict[str, Any]:
    """``GET /v1/tools``: the tools a principal may call."""
    return {
        "tools": [
            {
                "name": r.name,
                "spec_id": r.spec.id,
                "execution": r.spec.execution,
                "description": r.spec.description,
                "points": sorted(r.points),
                "title": r.title,
                "aliases": list(r.aliases),
                "group": r.group,
                "exposure": r.exposure,
            }
            for r in registrations
        ]
    }


def grant_json(grant: GrantRecord) -> dict[str, JsonValue]:
    return {
        "grant_id": grant.grant_id,
        "tenant": grant.tenant,
        "principal": grant.principal,
        "tool": grant.tool,
        "subject": grant.subject,
        "created_at": grant.created_at,
        "action_id": grant.action_id,
        "spec_id": grant.spec_id,
        "point": grant.point,
    }


def _context_json(principal: Principal) -> JsonValue:
    """Who made a call, as ``visible`` reads it (the stored CallContext's principal)."""
    return CallContext(principal=principal).to_json()


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


# A \ud800-\udfff escape: only a body with one can hold a lone surrogate (UTF-8 has none).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _lone_surrogate(value: JsonValue) -> bool:
    """Whether a parsed body holds text no UTF-8 store or response can carry (json.loads
    pairs escaped surrogates that belong together; this finds the ones left alone)."""
    return not encodable(json.dumps(value, ensure_ascii=False))


def _refuse_large_headers(request: Request) -> None:
    """A head over ``MAX_HEADER_BYTES`` is refused whoever serves the app (``blade-runtime
    serve``'s server refuses larger ones with the same answer before they reach it)."""
    size = sum(len(name) + len(value) + 4 for name, value in request.scope["headers"])
    if size > MAX_HEADER_BYTES:
        raise Refused(
            HttpError.HEADERS_TOO_LARGE,
            f"The request's headers are larger than {MAX_HEADER_BYTES} bytes.",
        )


# The trace context the request carries (serving.trace_context), for the call it makes.
_TRACEPARENT: ContextVar[str | None] = ContextVar("blade_traceparent", default=None)


def _paging(request: Request) -> tuple[int | None, str | None]:
    """A listing's ``limit`` (at most ``MAX_PAGE_SIZE``; default ``PAGE_SIZE``) and
    ``cursor`` (the ``next`` of the page before)."""
    query = request.query_params
    limit = query.get("limit")
    if limit is not None and not (limit.isascii() and limit.isdigit() and int(limit) > 0):
        raise Refused(
            HttpError.MALFORMED_REQUEST,
            f"limit is a number of records from 1 to {MAX_PAGE_SIZE}, not {limit!r}.",
        )
    return (None if limit is None else int(limit)), query.get("cursor")


def _seconds(query: Any, name: str) -> float | None:
    text = query.get(name)
    if text is None:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= 12):
        raise Refused(HttpError.MALFORMED_REQUEST, f"{name} is a number of seconds, not {text!r}.")
    return float(text)


def _page_response(request: Request, key: str, items: list[Any], page: Page[Any]) -> Response:
    """``{key: [...], "next": cursor}``, and the next page's address in a ``Link`` header
    (RFC 8288, as GitHub's API pages)."""
    response = json_response({key: items, "next": page.next})
    if page.next is not None:
        following = request.url.include_query_params(cursor=page.next)
        response.headers["Link"] = f'<{following.path}?{following.query}>; rel="next"'
    return response


def _refuse_nul(request: Request) -> None:
    """A NUL in the path or the query names nothing (and PostgreSQL's text cannot hold it)."""
    values = (*request.path_params.values(), *request.query_params.values())
    if any("\x00" in value for value in values if isinstance(value, str)):
        raise Refused(HttpError.MALFORMED_REQUEST, "The path or query holds a NUL character.")


def anonymous(request: Request) -> Principal:
    """An unauthenticated request's principal where anonymous access is on: the operator
    ``ANONYMOUS``, only on a server bound to loopback, from loopback (local development);
    ``Refused`` otherwise."""
    server = request.scope.get("server")
    client = request.client
    # a proxy on this host makes remote callers look local: a forwarded request is refused
    forwarded = any(h in request.headers for h in ("forwarded", "x-forwarded-for"))
    local = server and loopback(server[0]) and client and loopback(client.host)
    if forwarded or not local:
        raise Refused(
            HttpError.ANONYMOUS_REFUSED,
            "Anonymous access is allowed only on a server bound to loopback.",
        )
    return ANONYMOUS


def create_app(
    runtime: Runtime,
    *,
    authenticate: Authenticate,
    allow_anonymous: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    inbox: bool = True,
    mcp: bool = False,
    allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (),
    auth_threads: int = DEFAULT_AUTH_THREADS,
    max_streams_per_principal: int = DEFAULT_MAX_STREAMS,
    stream_lag_limit_s: float = DEFAULT_LAG_LIMIT_S,
    stream_write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S,
    stream_window: int = WINDOW,
) -> Starlette:
    """The runtime's HTTP API (routes under ``/v1``, the approval inbox at ``/inbox``; with
    ``mcp=True``, ``blade-runtime[mcp]``'s streamable-HTTP MCP endpoint at ``/mcp``, behind the
    same authentication).

    ``authenticate(request)`` returns the request's Principal or None (401): an ``async def``
    runs on the event loop, a plain function in a worker thread (``auth_threads`` at most) so
    that a slow one blocks nobody else. With ``allow_anonymous=True`` a request it returns None
    for is an operator, but only on a server bound to loopback, from loopback (local
    development). Bodies over ``max_body_bytes`` are 413.

    Before anything else, a request must be addressed to a loopback name or one of
    ``allowed_hosts`` (``tools.example.com``, ``tools.example.com:8443``, ``*.example.com``; 421
    otherwise), come from no browser page or one of this server's own origin or
    ``allowed_origins`` (403), and a POST must declare a JSON body (415): see
    ``blade_runtime.serving.http.sites``. ``ValueError`` for an entry that is not a host or an
    origin.

    A run's event stream holds at most ``stream_window`` events for a client that reads
    slowly; one a window behind for ``stream_lag_limit_s`` is told to resume (``event:
    lagging``), one that reads nothing for ``stream_write_timeout_s`` is cut off, and a
    principal holds at most ``max_streams_per_principal`` streams (429 past it).
    """
    sites = Sites.of(allowed_hosts, allowed_origins)
    api = Api(runtime, authenticate, allow_anonymous, max_body_bytes, auth_threads)
    api.max_streams = max_streams_per_principal
    api.lag_limit_s = stream_lag_limit_s
    api.write_timeout_s = stream_write_timeout_s
    api.window = stream_window

    def route(
        handler: Callable[[Request, Principal], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                _refuse_large_headers(request)
                principal = await api.principal(request)
                _refuse_nul(request)
                return await handler(request, principal)
            except Refused as refused:
                return error_response(refused.code, refused.message)
            except BadCursor as bad:
                return error_response(HttpError.BAD_CURSOR, str(bad))
            except StoreUnavailable:
                return error_response(ErrorCode.STORE_UNAVAILABLE, "The store is unavailable.")

        return endpoint

    def run_of(request: Request) -> str:
        run_id = request.query_params.get("run_id", "default")
        if not run_id:
            raise Refused(HttpError.MALFORMED_REQUEST, "run_id must not be empty.")
        return run_id

    async def tools(request: Request, principal: Principal) -> Response:
        return json_response(tools_body(api.callable_by(principal)))

    async def call(request: Request, principal: Principal) -> Response:
        name = request.path_params["name"]
        call_id = request.headers.get("idempotency-key") or request.query_params.get("call_id")
        if call_id is not None and not storable_id(call_id):
            raise Refused(HttpError.MALFORMED_REQUEST, "The idempotency key is 1 to 200 chars.")
        run_id = run_of(request)
        refused = misplaced(request.query_params)
        if refused is not None:
            raise Refused(
                HttpError.MALFORMED_REQUEST, f"{refused} is 1 to 200 printable characters."
            )
        arguments = await api.body(request)
        _TRACEPARENT.set(traceparent(request.headers.get("traceparent")))
        outcome = await api.call(
            principal,
            name,
            arguments,
            call_id=call_id,
            run_id=run_id,
            thread_id=request.query_params.get("thread_id"),
            agent_id=request.query_params.get("agent_id"),
        )
        return json_response(outcome.body, outcome.status)

    async def read_call(request: Request, principal: Principal) -> Response:
        call_id = request.path_params["call_id"]
        channel = request.query_params.get("channel")
        record = await api.records.call(call_id, principal=principal)
        if record is not None:
            found = api.call_json(record)
            found["data"] = await api.data_json(call_id, channel, principal)
            episodes = await api.records.suspensions(call_id, principal=principal)
            found["suspensions"] = episodes
            found["pending_suspension"] = next(
                (e for e in episodes if e["state"] == "pending"), None
            )
            found["slots"] = slots = await api.slots_json(call_id)
            found["waiting"] = any(not slot["held"] for slot in slots)
            return json_response(found)
        # no record this principal may see: where the store has none at all (a MemoryStore's
        # call that neither waited nor was kept), the first answer kept here, if it was theirs
        kept = api.kept(call_id)
        if (
            kept is None
            or not visible(principal, kept.tenant, kept.context)
            or await api.records.sees_call(call_id, principal=principal) is not None
        ):
            raise Refused(HttpError.UNKNOWN_CALL, f"No call {call_id!r}.")
        registration = api.registration(kept.name)
        spec_id = "" if registration is None else registration.spec.id
        data = await api.data_json(call_id, channel, None)
        return json_response(kept_call_json(kept, call_id, spec_id, data))

    async def run_calls(request: Request, principal: Principal) -> Response:
        run_id = request.path_params["run_id"]
        limit, cursor = _paging(request)
        page = await api.records.calls_page(
            run_id=run_id, principal=principal, limit=limit, cursor=cursor
        )
        return _page_response(request, "calls", [api.call_json(r) for r in page.items], page)

    async def run_context(request: Request, principal: Principal) -> Response:
        run_id = request.path_params["run_id"]
        context = await api.runtime.run_context(run_id, principal=principal)
        return json_response({"run_id": run_id, "context": context})

    async def list_actions(request: Request, principal: Principal) -> Response:
        query = request.query_params
        state_text = query.get("state", "pending")
        if state_text not in (*ACTION_STATES, "any"):
            raise Refused(
                HttpError.MALFORMED_REQUEST,
                f"state is one of {', '.join(ACTION_STATES)} or any, not {state_text!r}.",
            )
        state: ActionState | None = None if state_text == "any" else state_text  # type: ignore[assignment]
        limit, cursor = _paging(request)
        page = await api.records.actions_page(
            state=state,
            run_id=query.get("run_id"),
            name=query.get("tool"),
            principal=principal,
            limit=limit,
            cursor=cursor,
            waited_over_s=_seconds(query, "waiting_over"),
            waited_under_s=_seconds(query, "waiting_under"),
            thread_id=query.get("thread_id"),
            agent_id=query.get("agent_id"),
        )
        shown = [api.action_json(a) for a in page.items]
        return _page_response(request, "actions", shown, page)

    async def read_action(request: Request, principal: Principal) -> Response:
        record = await api.visible_action(principal, request.path_params["action_id"])
        return json_response(api.action_json(record))

    async def submit(request: Request, principal: Principal) -> Response:
        record = await api.visible_action(principal, request.path_params["action_id"])
        expected = request.path_params.get("name")
        if expected is not None and (
            record.name != expected or record.point != request.path_params.get("point")
        ):
            raise Refused(ErrorCode.UNKNOWN_ACTION, f"No pending action {record.action_id!r}.")
        payload = await api.body(request)
        # runtime.submit reads a str as JSON text: a body that is a JSON string is that string
        result = await runtime.submit(
            record.action_id,
            json.dumps(payload) if isinstance(payload, str) else payload,
            principal=principal,
        )
        status, body = await api.result_json(result, principal)
        return json_response(body, status)

    async def settle(request: Request, principal: Principal) -> Response:
        record = await api.visible_action(principal, request.path_params["action_id"])
        body = await api.body(request, optional=True)
        if body is not None and not isinstance(body, dict):
            raise Refused(HttpError.MALFORMED_REQUEST, "The body is a JSON object.")
        fields = body or {}
        cancelling = request.url.path.endswith("/cancel")
        key = "reason" if cancelling else "error"
        text = fields.get(key, "cancelled" if cancelling else None)
        if not isinstance(text, str) or not text.strip() or "\x00" in text:
            raise Refused(HttpError.MALFORMED_REQUEST, f"{key} is a non-empty string without NUL.")
        if cancelling:
            result = await runtime.cancel(record.action_id, text, principal=principal)
        else:
            result = await runtime.fail(record.action_id, text, principal=principal)
        if isinstance(result, ToolError) and result.code in (
            ErrorCode.CANCELLED,
            ErrorCode.TOOL_FAILED,
        ):
            return json_response(
                {
                    "status": "error",
                    "call_id": result.call.call_id,
                    "run_id": result.call.run_id,
                    "code": result.code.value,
                    "message": result.message,
                }
            )
        status, answer = await api.result_json(result, principal)
        return json_response(answer, status)

    async def list_grants(request: Request, principal: Principal) -> Response:
        limit, cursor = _paging(request)
        page = await api.records.grants_page(
            principal=principal, tool=request.query_params.get("tool"), limit=limit, cursor=cursor
        )
        return _page_response(request, "grants", [grant_json(g) for g in page.items], page)

    async def revoke_grant(request: Request, principal: Principal) -> Response:
        # DELETE: a cross-site page cannot send one without a CORS preflight (no CSRF here)
        grant_id = request.path_params["grant_id"]
        revoked = await runtime.revoke_grant(grant_id, principal=principal)
        if revoked is None:  # none, or another tenant's: the same answer
            raise Refused(HttpError.UNKNOWN_GRANT, f"No grant {grant_id!r}.")
        return json_response({"revoked": grant_json(revoked)})

    async def events(request: Request, principal: Principal) -> Response:
        run_id = request.path_params["run_id"]
        if not await api.records.sees_run(run_id, principal=principal):
            raise Refused(HttpError.UNKNOWN_RUN, f"No run {run_id!r}.")
        resume = request.headers.get("last-event-id") or request.query_params.get("after")
        after: int | None = None
        if resume is not None:
            if not (resume.isascii() and resume.isdigit() and len(resume) <= 18):
                raise Refused(HttpError.MALFORMED_REQUEST, "Last-Event-ID is a sequence number.")
            after = int(resume)
        else:
            after = await api.records.head(run_id)
        subscription = api.open_stream(principal, run_id, after)
        return _Stream(
            _stream(api, principal, subscription),
            api.write_timeout_s,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def read_file(request: Request, principal: Principal) -> Response:
        file_id = request.path_params["file_id"]
        return file_response(file_id, await api.records.file(file_id, principal=principal))

    async def openapi(request: Request, principal: Principal) -> Response:
        return Response(api.openapi(principal), media_type="application/json")

    routes = [
        Route("/v1/openapi.json", route(openapi), methods=["GET"]),
        Route("/v1/tools", route(tools), methods=["GET"]),
        Route("/v1/tools/{name}/calls", route(call), methods=["POST"]),
        Route(
            "/v1/tools/{name}/points/{point}/submit/{action_id}",
            route(submit),
            methods=["POST"],
        ),
        Route("/v1/tools/{name}/output/submit/{action_id}", route(submit), methods=["POST"]),
        Route("/v1/calls/{call_id:path}", route(read_call), methods=["GET"]),  # ids may hold "/"
        Route("/v1/runs/{run_id}/calls", route(run_calls), methods=["GET"]),
        Route("/v1/runs/{run_id}/events", route(events), methods=["GET"]),
        Route("/v1/runs/{run_id}/context", route(run_context), methods=["GET"]),
        Route("/v1/files/{file_id}", route(read_file), methods=["GET"]),
        Route("/v1/actions", route(list_actions), methods=["GET"]),
        Route("/v1/actions/{action_id}", route(read_action), methods=["GET"]),
        Route("/v1/actions/{action_id}/submit", route(submit), methods=["POST"]),
        Route("/v1/actions/{action_id}/cancel", route(settle), methods=["POST"]),
        Route("/v1/actions/{action_id}/fail", route(settle), methods=["POST"]),
        Route("/v1/grants", route(list_grants), methods=["GET"]),
        Route("/v1/grants/{grant_id}", route(revoke_grant), methods=["DELETE"]),
    ]
    if inbox:
        routes += _inbox_routes()

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        if error.status_code == 405:
            return error_response(HttpError.METHOD_NOT_ALLOWED, "Method not allowed.")
        if error.status_code == 404:
            return error_response(HttpError.NOT_FOUND, f"No route {request.url.path}.")
        return error_response(HttpError.INTERNAL, str(error.detail))

    async def server_error(request: Request, error: Exception) -> Response:
        log.error("%s %s failed: %s", request.method, request.url.path, type(error).__name__)
        return error_response(HttpError.INTERNAL, "The server failed; see its log.")

    lifespan = None
    if mcp:
        from blade_runtime.serving.mcp import McpMount

        def refused(error: Exception) -> Response | None:
            return error_response(error.code, error.message) if isinstance(error, Refused) else None

        mount = McpMount(runtime, api.principal, refused, inbox_path="/inbox" if inbox else None)
        routes.append(Route("/mcp", mount))
        lifespan = mount.lifespan
    app = Starlette(
        routes=routes,
        middleware=[Middleware(TrustedSites, sites=sites)],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )
    app.state.api = api
    return app


async def _stream(api: Api, principal: Principal, subscription: Any) -> AsyncIterator[str]:
    """Server-Sent Events of one run: ``id`` is the event's sequence number (resume with
    Last-Event-ID), ``event`` its kind. The subscription holds only the principal's events
    (each carries its call's tenant and principal; the store's query reads no other's) and at
    most its window of them. A reader a window behind for ``lag_limit_s`` gets ``event:
    lagging`` (with the sequence number to resume after) and the stream ends; one that reads
    nothing at all is cut off by ``_Stream``'s write timeout."""
    try:
        yield "retry: 1000\n\n"
        iterator = subscription.__aiter__()
        while True:
            behind = subscription.behind
            if behind is not None and time.monotonic() - behind > api.lag_limit_s:
                resume = json.dumps({"resume_after": subscription.last_seq})
                yield f"event: lagging\ndata: {resume}\n\n"
                return
            try:
                event: Event = await asyncio.wait_for(iterator.__anext__(), HEARTBEAT_S)
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
            except StopAsyncIteration:
                return
            data = json.dumps(
                {
                    "run_id": event.run_id,
                    "call_id": event.call_id,
                    "kind": event.kind,
                    "payload": event.payload,
                    "at": event.at,
                    "seq": event.seq,
                },
                separators=(",", ":"),
            )
            head = f"id: {event.seq}\n" if event.seq else ""
            yield f"{head}event: {event.kind}\ndata: {data}\n\n"
    finally:
        api.end_stream(principal, subscription)


class _Stream(StreamingResponse):
    """A stream whose every write must be taken within ``write_timeout_s``: a client that
    stops reading holds a bounded buffer for a bounded time, then its connection is closed
    (it resumes with Last-Event-ID)."""

    def __init__(self, content: AsyncIterator[str], write_timeout_s: float, **kwargs: Any):
        super().__init__(content, **kwargs)
        self.write_timeout_s = write_timeout_s

    async def stream_response(self, send: Any) -> None:
        async def timed(message: Any) -> None:
            await asyncio.wait_for(send(message), self.write_timeout_s)

        try:
            await super().stream_response(timed)
        except TimeoutError:
            log.warning(
                "an event stream's client read nothing for %g s: closed", self.write_timeout_s
            )


_INBOX_FILES: Final = {
    "/inbox": ("index.html", "text/html; charset=utf-8"),
    "/inbox/inbox.js": ("inbox.js", "text/javascript; charset=utf-8"),
    "/inbox/inbox.css": ("inbox.css", "text/css; charset=utf-8"),
}
_CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)


def _inbox_routes() -> list[Route]:
    """The approval inbox: static files shipped in the package; its data comes from /v1 with
    the page's credentials, so the page itself holds nothing to protect."""
    folder = resources.files("blade_runtime.serving.http") / "inbox"
    routes = []
    for path, (file, media) in _INBOX_FILES.items():
        content = (folder / file).read_bytes()

        async def serve(request: Request, content: bytes = content, media: str = media) -> Response:
            return Response(
                content,
                media_type=media,
                headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-cache"},
            )

        routes.append(Route(path, serve, methods=["GET"]))
    return routes


def file_response(file_id: str, found: FileBody | None) -> Response:
    """``GET /v1/files/{id}``'s answer: the file as it was saved, or 404 ``UNKNOWN_FILE`` (never
    saved, or another tenant's: the same answer)."""
    if found is None:
        raise Refused(HttpError.UNKNOWN_FILE, f"No file {file_id!r}.")
    saved = found.file
    return Response(
        found.content,
        headers={
            "Content-Type": saved.media_type,
            "Content-Disposition": f"attachment; filename*=UTF-8''{quote(saved.name)}",
            "X-Content-Type-Options": "nosniff",  # served as saved, never sniffed as HTML
            "ETag": f'"{saved.sha256}"',
            "X-File-Created-At": saved.created_at,
            "Cache-Control": "private, no-store",
        },
    )


def _with_result_fields(
    body: dict[str, JsonValue],
    metadata: dict[str, JsonValue] | None,
    effects: Sequence[Effect] = (),
) -> dict[str, JsonValue]:
    """A call's answer with the result's metadata (the tool's ``ctx.metadata``) and the effects
    it emitted (``ctx.effects``), when there are some: each key is absent otherwise, as the
    answers before them were."""
    if metadata is not None:
        body["metadata"] = metadata
    if effects:
        body["effects"] = effects_json(effects)
    return body
