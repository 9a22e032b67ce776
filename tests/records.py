"""Store records for the store tests: calls, actions, events and resolutions with defaults, and
the first steps of a call (begun, suspended, resumable) done through a store."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest

from blade_runtime.core.spec import JsonObject
from blade_runtime.core.store import (
    ActionRecord,
    CallRecord,
    CallState,
    Event,
    Resolution,
    Store,
    StoreUnavailable,
    clock,
    now,
)

SCHEMA: JsonObject = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
_ids = itertools.count()


def uid(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}"


def a_call(
    call_id: str | None = None,
    *,
    owner: str = "w1",
    state: CallState = "running",
    lease_s: float = 30.0,
    run_id: str = "run-1",
    tenant: str = "",
    input: dict[str, Any] | None = None,
    spec_id: str = "acme.refund.v1",
) -> CallRecord:
    return CallRecord(
        call_id=call_id or uid("call"),
        run_id=run_id,
        name="refund",
        spec_id=spec_id,
        side_effect="non_idempotent",
        execution="inline",
        input=input if input is not None else {"amount": 10},
        state=state,
        started_at=now(),
        owner=owner,
        lease_until=clock() + lease_s,
        tenant=tenant,
        context={"principal": "alice"},
    )


def an_action(call: CallRecord, *, expires_at: float | None = None) -> ActionRecord:
    return ActionRecord(
        action_id=uid("action"),
        call_id=call.call_id,
        run_id=call.run_id,
        name=call.name,
        spec_id=call.spec_id,
        point="approve",
        payload={"amount": 10, "why": "over the limit"},
        submit_schema=SCHEMA,
        suspended_at=now(),
        tenant=call.tenant,
        expires_at=expires_at,
    )


def ev(call: CallRecord, kind: str, payload: Any = None) -> Event:
    return Event(
        call.run_id,
        call.call_id,
        kind,
        payload or {},
        now(),
        tenant=call.tenant,
        principal=call.principal,
    )


def begun(store: Store, **fields: Any) -> CallRecord:
    """A call begun (running) under a lease of ``lease_s`` (default 30 s) from the commit, as
    the store recorded it."""
    call = a_call(**fields)
    call.lease_until = store.begin(
        call, ev(call, "started"), lease_s=fields.get("lease_s", 30.0)
    ).lease_until
    return call


def suspended(store: Store, **fields: Any) -> tuple[CallRecord, ActionRecord]:
    """A call that began and then suspended on an action (known: it was recorded)."""
    expires_at = fields.pop("expires_at", None)
    call = begun(store, **fields)
    return call, suspend_on(store, call, expires_at=expires_at)


def suspend_on(store: Store, call: CallRecord, *, expires_at: float | None = None) -> ActionRecord:
    """``call`` (recorded, running) suspended on a new action."""
    action = an_action(call, expires_at=expires_at)
    claim = call.claim
    call.state = "suspended"
    store.suspend(call, action, ev(call, "suspended"), claim=claim)
    return action


def resumable(store: Store, **fields: Any) -> CallRecord:
    call, action = suspended(store, **fields)
    store.resolve(action.action_id, submitted(), ev(call, "resumed"))
    return call


def submitted(**fields: Any) -> Resolution:
    return Resolution("submitted", now(), resume=fields.pop("resume", {"ok": True}), **fields)


def kinds(store: Store, run_id: str = "run-1") -> list[str]:
    return [event.kind for event in store.events(run_id)]


def one_line(error: pytest.ExceptionInfo[StoreUnavailable], *absent: str) -> str:
    message = str(error.value)
    assert "\n" not in message and message
    for secret in absent:
        assert secret not in message
    return message


def eventually(done: Callable[[], bool], limit_s: float = 10) -> bool:
    """Whether ``done()`` holds within ``limit_s`` (looked at every 10 ms)."""
    deadline = time.monotonic() + limit_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
