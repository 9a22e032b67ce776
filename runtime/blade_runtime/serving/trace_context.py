"""The W3C trace context a request carries (``traceparent``), kept with the call it makes so that
tracing (``blade_runtime.otel``) continues the caller's trace: the HTTP API reads the header, the
MCP server a request's ``_meta.traceparent``. Well-formed or nothing: a client's malformed value
starts no trace of its own and is never stored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.store import storable_id

_FORM = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def traceparent(given: object) -> str | None:
    """``given`` as a W3C traceparent, or None when it is not one."""
    if not isinstance(given, str):
        return None
    given = given.strip().lower()
    return given if _FORM.fullmatch(given) else None


PLACEMENT = ("thread_id", "agent_id")
"""What a request may say of where its call runs: the thread and the executing agent."""


def misplaced(given: Mapping[str, object]) -> str | None:
    """The first of ``PLACEMENT`` in ``given`` that is not an id every store holds (1 to 200
    printable characters: it is stored with the call's actions), else None."""
    for key in PLACEMENT:
        value = given.get(key)
        if value is not None and not (isinstance(value, str) and storable_id(value)):
            return key
    return None


def call_context(
    principal: Principal | None,
    carried: str | None,
    thread_id: str | None = None,
    agent_id: str | None = None,
) -> CallContext:
    """The context of a call a request makes, with the trace context it carried and the
    thread and executing agent it names (the caller's word: where the call is, not who)."""
    return CallContext(
        principal=principal,
        thread_id=thread_id,
        extra={} if carried is None else {"traceparent": carried},
        agent_id=agent_id,
    )
