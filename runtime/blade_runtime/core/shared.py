"""The runtime's shared state and the small pieces every layer uses: records, events, outcomes.

The runtime is built in layers, one module each, each using only the layers below it:

    core       state, records and events, outcomes           (this module)
    pipeline   one call: hooks, validation, the implementation, its result
    pending    suspensions, client tools, submit / cancel / fail, expiry
    recovery   claims, leases and their heartbeat, the recovery sweep and loop
    runtime    the public ``Runtime``: registry, hooks, exports, subscriptions, close
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from pydantic import BaseModel, JsonValue
from pydantic_core import from_json

from blade_runtime.core import actions
from blade_runtime.core.cancel_scope import CancelScope
from blade_runtime.core.context import CallInfo, CancellationSignal
from blade_runtime.core.events import EventHub
from blade_runtime.core.execution import CallData
from blade_runtime.core.guard import Guard
from blade_runtime.core.hooks import Hook, HookEvent
from blade_runtime.core.jsonvalue import NotJson, checked
from blade_runtime.core.leases import Leases
from blade_runtime.core.observers import Observers
from blade_runtime.core.permissions import Policy
from blade_runtime.core.records import Records
from blade_runtime.core.registry import Registration
from blade_runtime.core.results import ErrorCode, ToolError, ToolResult, ToolSuccess, error_content
from blade_runtime.core.spec import JsonObject
from blade_runtime.core.store import (
    DEFAULT_LEASE_S,
    ActionRecord,
    CallRecord,
    CallState,
    Event,
    Store,
    clock,
    now,
)

log = logging.getLogger("blade_runtime")

ErrorMapper: TypeAlias = Callable[[BaseException, CallInfo], str | None]
"""Turns an implementation's exception into a model-visible sentence (``None``: the generic one)."""
FallbackHandler: TypeAlias = Callable[["FallbackCall"], Awaitable[JsonValue]]
"""Handles calls to names nothing is registered under; returns the model-facing JSON."""

DEFAULT_TIMEOUT_MS = 600_000
GENERIC_ERROR = "The tool failed because of an internal error. Retrying is unlikely to help."
GENERIC_INVALID_OUTPUT = "The tool failed to produce a valid result."
INTERRUPTED_MESSAGE = (
    "The tool call was interrupted when its process stopped; it may or may not have taken "
    "effect. Check its effects (reconcile) before calling it again."
)
HOST = socket.gethostname()


@dataclass(frozen=True, slots=True)
class FallbackCall:
    """A call to an unregistered name, handed to the app's fallback handler."""

    name: str
    arguments: JsonObject
    call: CallInfo
    signal: CancellationSignal


@dataclass(slots=True)
class Attempt:
    """One entry of a call: whether the store holds it (so its end must be recorded there)."""

    recorded: bool = False
    data: CallData | None = None

    @property
    def stored(self) -> bool:
        return self.recorded or (self.data is not None and self.data.wrote)


class RuntimeCore:
    """State shared by every layer, and the helpers that build records and events."""

    store: Store
    timeout_ms: int | None
    hook_timeout_s: float
    permission: Policy | None
    error_mapper: ErrorMapper | None
    fallback: FallbackHandler | None
    cleanup_grace_s: float
    lease_s: float

    _allowed: frozenset[str] | None
    _disallowed: frozenset[str]
    _restricted: bool

    def _init_core(self, store: Store, lease_s: float, host: str | None) -> None:
        self.store = store
        self._durable = store.durable
        self.lease_s = lease_s
        self._registrations: dict[str, Registration[Any]] = {}
        self._by_spec: dict[str, Registration[Any]] = {}  # the first registration of each id
        self._hooks: dict[HookEvent, list[Hook]] = {event: [] for event in HookEvent}
        self._pre_any = self._post_any = self._permission_hooked = False
        self._running: dict[str, CancelScope] = {}  # by call id; a call enters when it suspends
        self._events = EventHub(store)
        self.records = Records(store)
        self.owner = f"{host or HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._leases = Leases(store, self.owner, lease_s)
        self._guard = Guard()
        self._observers = Observers()
        self._answer_schemas: dict[str, JsonObject] = {}
        self._closing = False
        self._dynamic = False  # some registration has an ``enabled`` callback
        self._fatal: dict[str, ToolError] = {}  # parent call id: the child failure that ends it
        prefix = f"call_{uuid.uuid4().hex[:12]}"
        self._ids = map(f"{prefix}_{{}}".format, itertools.count(1))  # C-level: no Python frame

    def is_allowed(self, name: str) -> bool:
        if name in self._disallowed:
            return False
        return self._allowed is None or name in self._allowed

    # -- records and events ----------------------------------------------------------------

    def _record(
        self,
        registration: Registration[Any],
        call: CallInfo,
        arguments: JsonObject,
        state: CallState,
    ) -> CallRecord:
        spec = registration.spec
        context = call.context
        return CallRecord(
            call.call_id,
            call.run_id,
            call.name,
            spec.id,
            spec.side_effect,
            spec.execution,
            arguments,
            state,
            now(),
            self.owner,
            lease_until=clock() + self.lease_s if state == "running" else 0.0,
            tenant="" if context is None else context.tenant,
            context=None if context is None else context.to_json(),
        )

    def _action(
        self,
        call: CallInfo,
        point: str | None,
        payload: JsonValue,
        schema: JsonObject,
        expires_after_s: float | None = None,
    ) -> ActionRecord:
        return ActionRecord(
            _action_id(),
            call.call_id,
            call.run_id,
            call.name,
            call.spec_id,
            point,
            payload,
            schema,
            now(),
            tenant="" if call.context is None else call.context.tenant,
            expires_at=None if expires_after_s is None else clock() + expires_after_s,
        )

    def _event(self, call: CallInfo, kind: str, payload: JsonValue) -> Event:
        return Event(call.run_id, call.call_id, kind, payload, now())

    def _emit(self, write: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Commit ``write`` (its last positional argument is the event), then tell this
        process's subscribers."""
        written = write(*args, **kwargs)
        self._events.publish(args[-1])
        return written

    # -- outcomes --------------------------------------------------------------------------

    def _tool_error(self, call: CallInfo, error: BaseException) -> ToolError:
        log.error(
            "%s (call %s, run %s) raised %s",
            call.name,
            call.call_id,
            call.run_id,
            type(error).__name__,
            exc_info=error,
        )
        message = None
        if self.error_mapper is not None:
            try:
                message = self.error_mapper(error, call)
            except Exception:
                log.exception("the error mapper raised for %s (call %s)", call.name, call.call_id)
        return error_result(call, ErrorCode.TOOL_ERROR, message or GENERIC_ERROR)

    def _cancelled(self, call: CallInfo, scope: CancelScope) -> ToolError:
        if scope.reason == "timeout":
            registration = self._registrations.get(call.name)
            limit = registration.timeout_ms if registration else self.timeout_ms
            seconds = (limit or DEFAULT_TIMEOUT_MS) / 1000
            return error_result(
                call, ErrorCode.TIMEOUT, f"The tool did not finish within {seconds:g} s."
            )
        return error_result(
            call, ErrorCode.CANCELLED, f"The tool call was cancelled: {scope.signal.reason}."
        )


def _action_id() -> str:
    """Unique and time-ordered, so that a new action lands at the end of the store's index
    instead of on a random page of it (a third of the cost of inserting it, measured)."""
    return f"act_{time.time_ns():016x}{secrets.token_hex(6)}"


def error_result(call: CallInfo, code: ErrorCode, message: str) -> ToolError:
    return ToolError(call, code, message, error_content(code, message))


def nobody() -> CallInfo:
    return CallInfo("", "", "", "")


def result_json(result: ToolResult[Any]) -> JsonValue:
    """How a result is stored and announced."""
    if isinstance(result, ToolError):
        return actions.error_json(result.code, result.message)
    if isinstance(result, ToolSuccess) and result.output_json is not None:
        return {"status": "success", "content": result.content, "output": result.output_json}
    return actions.success_json(result.content)


def parse_arguments(arguments: JsonObject | str | bytes) -> JsonObject | str:
    """The arguments as a JSON object, or a sentence saying why they are not one."""
    if isinstance(arguments, str | bytes):
        try:  # pydantic-core's parser (Rust): half the cost of json.loads, and no NaN; keys
            # (the same few in every call) are cached, values not (most are unique)
            arguments = from_json(arguments, allow_inf_nan=False, cache_strings="keys")
        except (ValueError, TypeError) as error:
            return f"The arguments are not valid JSON: {error}."
    if not isinstance(arguments, dict):
        return "The arguments must be a JSON object."
    return arguments


def submitted_json(payload: JsonValue | BaseModel | str | bytes) -> JsonValue:
    """A submission as lossless JSON (``NotJson`` saying why it is not JSON).

    Text is parsed as JSON (its value may be a string); a model is serialized (unset fields
    left out)."""
    try:
        if isinstance(payload, BaseModel):
            return checked(payload.model_dump(mode="python", by_alias=True, exclude_unset=True))
        if isinstance(payload, bytes | str):
            return checked(json.loads(payload))
        return checked(payload)
    except (ValueError, RecursionError) as error:  # NotJson is a ValueError
        raise NotJson(f"The submission is not JSON: {error}") from None


__all__ = ["DEFAULT_LEASE_S", "Attempt", "RuntimeCore"]
