"""What a call can end as, and the sentences the model reads: the results every service of the
runtime builds, and how results and submissions are written as JSON."""

from __future__ import annotations

import json
import logging
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from pydantic import BaseModel, JsonValue
from pydantic_core import from_json

from blade_runtime.core import actions
from blade_runtime.core.cancel_scope import CancelScope
from blade_runtime.core.context import CallInfo, CancellationSignal
from blade_runtime.core.effects import Effect, effects_from_json, effects_json
from blade_runtime.core.jsonvalue import NotJson, checked
from blade_runtime.core.results import ErrorCode, ToolError, ToolResult, ToolSuccess, error_content
from blade_runtime.core.spec import JsonObject

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


def tool_error(call: CallInfo, error: BaseException, mapper: ErrorMapper | None) -> ToolError:
    """TOOL_ERROR for an implementation (or a callback of the application's) that raised: the
    exception goes to the log, the model reads the mapper's sentence or the generic one."""
    log.error(
        "%s (call %s, run %s) raised %s",
        call.name,
        call.call_id,
        call.run_id,
        type(error).__name__,
        exc_info=error,
    )
    message = None
    if mapper is not None:
        try:
            message = mapper(error, call)
        except Exception:
            log.exception("the error mapper raised for %s (call %s)", call.name, call.call_id)
    return error_result(call, ErrorCode.TOOL_ERROR, message or GENERIC_ERROR)


def cancelled(call: CallInfo, scope: CancelScope, timeout_ms: int | None) -> ToolError:
    """TIMEOUT, CANCELLED or LEASE_LOST, as the scope that ended the call says; a cancellation
    says whether the implementation had started (a non-idempotent one may have taken effect)
    and why."""
    if scope.reason == "timeout":
        seconds = (timeout_ms or DEFAULT_TIMEOUT_MS) / 1000
        return error_result(
            call, ErrorCode.TIMEOUT, f"The tool did not finish within {seconds:g} s."
        )
    when = "after its implementation started" if scope.entered else "before it started"
    why = scope.signal.reason or "no reason was given"
    if scope.reason == "lease_lost":  # the heartbeat's: another worker may run it now
        return error_result(
            call,
            ErrorCode.LEASE_LOST,
            f"The tool call was stopped here {when}: {why}; its outcome is the one the store "
            "records.",
        )
    return error_result(call, ErrorCode.CANCELLED, f"The tool call was cancelled {when}: {why}.")


def action_id() -> str:
    """Unique and time-ordered, so that a new action lands at the end of the store's index
    instead of on a random page of it (which makes every insert dearer as the index grows)."""
    return f"act_{time.time_ns():016x}{secrets.token_hex(6)}"


def client_action_id(call_id: str, made_prefix: str) -> str | None:
    """A client tool's action id: the model's tool call id (seed 002: "for an external-output
    client tool, actionId is its toolCallId") when the caller gave the call its id, else None
    (a new ``act_`` id). A call id is unique in the store, so such an action id is too: a
    reused one is the call's ``DUPLICATE_CALL``, the answer any reused call id gets, and tells
    no more. Kept apart: an id the runtime made (``made_prefix``), one in the ``act_``
    namespace of made action ids (so a given id never meets a made one), and one with a
    ``/`` (an action id is one URL path segment: ``/v1/actions/{id}``; the adapters' call ids
    are ``run/tool-call``)."""
    if call_id.startswith((made_prefix, "act_")) or "/" in call_id:
        return None
    return call_id


def error_result(call: CallInfo, code: ErrorCode, message: str) -> ToolError:
    return ToolError(call, code, message, error_content(code, message))


def nobody() -> CallInfo:
    return CallInfo("", "", "", "")


def result_json(result: ToolResult[Any]) -> JsonValue:
    """How a result is stored and announced (with its ``metadata`` when the tool set some)."""
    stored: JsonValue
    if isinstance(result, ToolError):
        stored = actions.error_json(result.code, result.message)
    elif isinstance(result, ToolSuccess) and result.output_json is not None:
        stored = {"status": "success", "content": result.content, "output": result.output_json}
    else:
        stored = actions.success_json(result.content)
    metadata = getattr(result, "metadata", None)
    if metadata is not None:
        assert isinstance(stored, dict)
        stored["metadata"] = metadata
    effects = getattr(result, "effects", ())
    if effects:
        assert isinstance(stored, dict)
        stored["effects"] = effects_json(effects)
    return stored


def stored_metadata(stored: JsonValue) -> dict[str, JsonValue] | None:
    """The metadata of a stored result (None: the tool set none)."""
    metadata = stored.get("metadata") if isinstance(stored, dict) else None
    return metadata if isinstance(metadata, dict) else None


def stored_effects(stored: JsonValue) -> tuple[Effect, ...]:
    """The effects a stored result lists (``result_json``'s), in order."""
    return effects_from_json(stored.get("effects") if isinstance(stored, dict) else None)


def parse_arguments(arguments: JsonObject | str | bytes) -> JsonObject | str:
    """The arguments as a JSON object, or a sentence saying why they are not one."""
    if isinstance(arguments, (str, bytes)):  # a tuple: half the cost of a union's check
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
