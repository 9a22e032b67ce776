"""Standing permission grants: "always allow" per principal, tool (its name and spec), point and
subject.

A person who answers a permission request with ``{"decision": "approve", "always": true}``
makes a grant: later requests of the same principal for the same tool and subject (the
``subject=`` of ``ctx.request_permission``, at the ``@permission-step`` point; or the call as a
whole, when the policy asked before it ran, at ``@permission``) are allowed without asking
again. A grant made for one spec never allows another registered under the same name later.
A grant is checked only where a durable request would otherwise be made: the policy still
decides first, and its denial stands. Grants are durable in every store, listed and revoked by
operators (``blade-runtime grants``, the HTTP API's ``/v1/grants``) and by the principal's
tenant; a call without a principal has none.
"""

from __future__ import annotations

import uuid

from pydantic import JsonValue

from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.context import CallInfo
from blade_runtime.core.permissions import POINTS
from blade_runtime.core.store import ActionRecord, GrantRecord, Store, now


def new_grant(
    principal: Principal,
    tool: str,
    spec_id: str,
    point: str,
    subject: str = "",
    action_id: str | None = None,
) -> GrantRecord:
    return GrantRecord(
        f"grant_{uuid.uuid4().hex}",
        principal.tenant,
        principal.id,
        tool,
        subject,
        now(),
        action_id,
        spec_id,
        point,
    )


def from_answer(
    action: ActionRecord, answer: JsonValue, call_context: JsonValue
) -> GrantRecord | None:
    """The grant a person's "always allow" answer to a permission request makes, if it does."""
    if action.point not in POINTS or not isinstance(answer, dict):
        return None
    if answer.get("decision") != "approve" or answer.get("always") is not True:
        return None
    context = CallContext.from_json(call_context)
    principal = None if context is None else context.principal
    if principal is None:  # an anonymous call: nobody to grant it to
        return None
    payload = action.payload if isinstance(action.payload, dict) else {}
    subject = payload.get("subject")
    return new_grant(
        principal,
        action.name,
        action.spec_id,
        action.point,
        subject if isinstance(subject, str) else "",
        action.action_id,
    )


def lookup(store: Store, call: CallInfo, point: str, subject: str = "") -> GrantRecord | None:
    """The standing grant that allows ``call`` to act on ``subject`` at ``point`` (before it
    runs, or a step), if there is one: of its principal, its registration name and its spec."""
    principal = None if call.context is None else call.context.principal
    if principal is None:
        return None
    return store.find_grant(
        principal.tenant, principal.id, call.name, subject, spec_id=call.spec_id, point=point
    )
