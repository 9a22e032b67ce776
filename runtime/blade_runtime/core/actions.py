"""What resolving a pending action writes, shared by the runtime and the operators' CLI.

Each function returns the ``Resolution`` (the compare-and-set of the action and what it does to
the call) and the event that goes with it, so that both paths write exactly the same records.
A submission is validated before any of this, against the schema stored with the action.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import JsonValue

from blade_runtime.core.jsonvalue import encodable_tree
from blade_runtime.core.permissions import ADMISSION, DEFAULT_DENIAL
from blade_runtime.core.registry import compiled
from blade_runtime.core.results import ErrorCode
from blade_runtime.core.store import DEFAULT_LEASE_S, ActionRecord, Event, Resolution, now
from blade_runtime.core.validation import unreadable


def invalid_submission(action: ActionRecord, value: JsonValue) -> str | None:
    """Why ``value`` cannot resolve ``action`` (every failing path), or None."""
    if not encodable_tree(value):  # whether the schema reads the string or not
        return f"Invalid submission for {action.action_id}: {unreadable(UnicodeError())}."
    validator = compiled(action.submit_schema)
    try:
        if validator.is_valid(value):
            return None
    except (ValueError, RecursionError) as error:  # UnicodeEncodeError is a ValueError
        return f"Invalid submission for {action.action_id}: {unreadable(error)}."
    return f"Invalid submission for {action.action_id}: {validator.explain(value)}."


def success_json(content: JsonValue) -> JsonValue:
    return {"status": "success", "content": content}


def error_json(code: ErrorCode, message: str) -> JsonValue:
    return {"status": "error", "code": code.value, "message": message}


def completion(action: ActionRecord, value: JsonValue) -> tuple[Resolution, Event]:
    """A client tool's output arrived: the call settles with it."""
    result = success_json(value)
    at = now()
    resolution = Resolution("submitted", at, resume=value, call_state="settled", call_result=result)
    return resolution, _event(action, "result", result, at)


def resumption(
    action: ActionRecord, value: JsonValue, owner: str | None, lease_s: float = DEFAULT_LEASE_S
) -> tuple[Resolution, Event]:
    """A suspension's resume payload arrived. With an ``owner`` (a runtime about to re-enter the
    implementation) the call is claimed for it, running under a lease of ``lease_s``; without
    one it waits, resumable, for some runtime's recovery to claim it."""
    at = now()
    entry: JsonValue = {"action_id": action.action_id, "point": action.point, "resume": value}
    resolution = Resolution(
        "submitted",
        at,
        resume=value,
        call_state="running" if owner else "resumable",
        call_entry=entry,
        call_owner=owner,
        lease_s=lease_s,
    )
    payload: JsonValue = {"action_id": action.action_id, "point": action.point}
    return resolution, _event(action, "resumed", payload, at)


def answer(
    action: ActionRecord, value: JsonValue, owner: str | None, lease_s: float = DEFAULT_LEASE_S
) -> tuple[Resolution, Event]:
    """A (validated) submission of a suspension or a permission request: what it resolves to.

    A permission request made before the call ran: approved, the call resumes its first entry
    (with the edited input, when the answer has one: stored with the decision); denied, the
    call settles as PERMISSION_DENIED, and denied outside a runtime (``owner`` None: the
    operators' CLI) it becomes resumable with the denial, so that the worker taking it up
    settles it where the application's observers see it. Anything else: ``resumption``."""
    if action.point != ADMISSION or not isinstance(value, dict):
        return resumption(action, value, owner, lease_s)
    if value.get("decision") == "deny" and owner is not None:
        message = str(value.get("message") or DEFAULT_DENIAL)
        result = error_json(ErrorCode.PERMISSION_DENIED, message)
        return _settling(action, "submitted", message, result)
    resolution, event = resumption(action, value, owner, lease_s)
    edited = value.get("input")
    if isinstance(edited, dict) and value.get("decision") != "deny":
        resolution = replace(resolution, call_input=edited)
        if owner is None:  # outside a runtime nothing narrows the edited input: the spec's own
            shown = action.payload if isinstance(action.payload, dict) else {}
            declared = shown.get("spec_side_effect")
            resolution = replace(
                resolution,
                call_kind=str(shown["spec_kind"]) if shown.get("spec_kind") else None,
                call_side_effect=(
                    declared  # a request of an older release says none: the widest there is
                    if declared in ("pure", "idempotent", "non_idempotent")
                    else "non_idempotent"
                ),
            )
    return resolution, event


def cancellation(action: ActionRecord, reason: str) -> tuple[Resolution, Event, str]:
    """The call settles as CANCELLED; returns the model's sentence too."""
    message = f"The tool call was cancelled: {reason}."
    return (
        *_settling(action, "cancelled", reason, error_json(ErrorCode.CANCELLED, message)),
        message,
    )


def failure(action: ActionRecord, message: str) -> tuple[Resolution, Event, str]:
    """The call settles as TOOL_FAILED with ``message`` for the model."""
    return (
        *_settling(action, "failed", message, error_json(ErrorCode.TOOL_FAILED, message)),
        message,
    )


def _settling(
    action: ActionRecord, state: str, reason: str, result: JsonValue
) -> tuple[Resolution, Event]:
    at = now()
    resolution = Resolution(
        "submitted" if state == "submitted" else "cancelled" if state == "cancelled" else "failed",
        at,
        reason=reason,
        call_state="settled",
        call_result=result,
    )
    return resolution, _event(action, "result", result, at)


def expiry(action: ActionRecord) -> tuple[Resolution, Event]:
    """The action's deadline passed before anyone resolved it: its call settles as TIMEOUT."""
    message = "Nobody answered the pending action before its deadline, so the tool call timed out."
    result = error_json(ErrorCode.TIMEOUT, message)
    at = now()
    resolution = Resolution(
        "expired",
        at,
        reason="its deadline passed",
        call_state="settled",
        call_result=result,
        only_if_expired=True,
    )
    return resolution, _event(action, "result", result, at)


def _event(action: ActionRecord, kind: str, payload: JsonValue, at: str) -> Event:
    """An event of the action's call, with whose it is."""
    return Event(
        action.run_id,
        action.call_id,
        kind,
        payload,
        at,
        tenant=action.tenant,
        principal=action.principal,
    )


def already_resolved(action: ActionRecord) -> str:
    if action.state == "expired":
        return (
            f"The action {action.action_id} expired at {action.resolved_at}: its deadline "
            "passed before it was resolved, and its call settled as TIMEOUT."
        )
    return f"The action {action.action_id} was already {action.state} at {action.resolved_at}."
