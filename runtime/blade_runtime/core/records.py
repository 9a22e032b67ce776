"""Calls, actions, ToolData and standing grants as a principal may see them: the tenant rule.

Every surface that reads records for a client (the HTTP API, MCP, the adapters, typed clients)
reads them here, with the client's principal, and never through ``runtime.store``: the store's
record decides whose a call is, never a memory of the serving process. ``principal=None`` is the
application itself, in its own process, which sees every tenant.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from blade_runtime.core.caller import Principal, may_act_on
from blade_runtime.core.context import parent_ids
from blade_runtime.core.files import FileAccess, FileBody
from blade_runtime.core.store import (
    ActionRecord,
    ActionState,
    BadCursor,
    CallRecord,
    CallState,
    DataRecord,
    Event,
    GrantRecord,
    Store,
)

T = TypeVar("T")
StoreIO = Callable[..., Awaitable[Any]]
"""Runs one store method (``io(store.call, call_id)``): off the event loop where the store
does I/O, inline where it does not (the runtime's ``StoreAccess``)."""

PAGE_SIZE = 100
"""A listing's page when the caller names no ``limit``."""
MAX_PAGE_SIZE = 1000
"""The largest page a listing gives, whatever ``limit`` asks."""


async def inline(method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return method(*args, **kwargs)


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing, and the cursor of the page after it (None: this is the last).
    A cursor is opaque: it names the last record of this page, which the next page's query
    must find among the records its principal may see, so another principal's cursor opens
    nothing (``BadCursor``)."""

    items: list[T]
    next: str | None = None


def cursor_of(identifier: str) -> str:
    """The cursor of a page that ends with the record ``identifier``."""
    return (
        base64.urlsafe_b64encode(identifier.encode("utf-8", "surrogatepass")).decode().rstrip("=")
    )


def after_of(cursor: str | None) -> str | None:
    """The record a cursor names (None: the first page); ``BadCursor`` for text no page made."""
    if cursor is None:
        return None
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        named = base64.b64decode(padded.encode("ascii"), altchars=b"-_", validate=True)
        if named:
            return named.decode("utf-8")
    except (ValueError, UnicodeError):
        pass
    raise BadCursor("not a cursor this listing made; list from the first page")


def ago(seconds: float) -> str:
    """The time ``seconds`` ago, as records' times are written (ISO 8601, UTC)."""
    return (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat()


def page_size(limit: int | None) -> int:
    """How many records a page holds: ``limit`` (at least 1), at most ``MAX_PAGE_SIZE``."""
    return PAGE_SIZE if limit is None else max(1, min(int(limit), MAX_PAGE_SIZE))


def paged(found: list[T], size: int, key: Callable[[T], str]) -> Page[T]:
    """``found`` (read with one record more than ``size``) as a page and its next cursor."""
    if len(found) <= size:
        return Page(found)
    items = found[:size]
    return Page(items, cursor_of(key(items[-1])))


def visible(principal: Principal | None, tenant: str, context: Any = None) -> bool:
    """Whether ``principal`` may see (and answer, resume or cancel) a record of ``tenant``
    made with the stored caller ``context``."""
    return principal is None or may_act_on(principal, tenant, context)


def tenant_of(principal: Principal | None) -> str | None:
    """The tenant a listing is narrowed to (None: every tenant)."""
    return None if principal is None or principal.operator else principal.tenant


def owner_of(principal: Principal | None) -> str | None:
    """The principal id a listing is narrowed to (None: every principal): its grants, and
    within its tenant the calls, actions and events made for it (or for nobody)."""
    return None if principal is None or principal.operator else principal.id


def mine(principal: Principal | None, tenant: str, made_for: str) -> bool:
    """Whether a record of ``tenant`` made for the principal id ``made_for`` ("" for nobody) is
    ``principal``'s: ``may_act_on`` on the record's own columns."""
    if principal is None or principal.operator:
        return True
    return tenant == principal.tenant and made_for in ("", principal.id)


class Records:
    """Reads of calls, actions, ToolData and events for one principal at a time."""

    def __init__(
        self, store: Store, io: StoreIO = inline, *, files: FileAccess | None = None
    ) -> None:
        self.store = store
        self.io = io
        self.files = files

    async def file(self, file_id: str, *, principal: Principal | None = None) -> FileBody | None:
        """The file ``file_id`` and its content, or None when it is not stored or not of the
        principal's tenant (the same None: another tenant learns nothing of it). Files are
        the tenant's, whoever of it saved them; an operator reads every tenant's."""
        if self.files is None:
            return None
        return await self.files.read(file_id, tenant_of(principal))

    async def call(self, call_id: str, *, principal: Principal | None = None) -> CallRecord | None:
        """The call ``call_id``, or None when it is not stored or not the principal's."""
        record: CallRecord | None = await self.io(self.store.call, call_id)
        if record is None or not visible(principal, record.tenant, record.context):
            return None
        return record

    async def sees_call(self, call_id: str, *, principal: Principal | None = None) -> bool | None:
        """Whether the principal may see the call ``call_id``, as the store's record says; None
        when the store has no record of it (not yet, or no more). A record's tenant and caller
        never change, so a True or False may be kept; a None may not (a record may appear,
        whoever sent the call id first)."""
        record: CallRecord | None = await self.io(self.store.call, call_id)
        if record is None:
            return None
        return visible(principal, record.tenant, record.context)

    async def sees_events(
        self, call_id: str, run_id: str, *, principal: Principal | None = None
    ) -> bool | None:
        """Whether the principal may see the events of the call ``call_id`` in the run
        ``run_id``, as the store's records say: the call's own record and, for an id of a
        child's form (a child's start is never stored), its root parent's, the outermost call of
        that run whose id it has the form of a descendant of. Each of them that is stored must
        be the principal's (so a call made under a child's id by someone else never shows the
        child's events). None when the store has neither. As with ``sees_call``, a True or
        False may be kept; a None may not."""
        records: list[CallRecord] = []
        own: CallRecord | None = await self.io(self.store.call, call_id)
        if own is not None:
            records.append(own)
        for parent in parent_ids(call_id):
            found: CallRecord | None = await self.io(self.store.call, parent)
            if found is not None and found.run_id == run_id:
                records.append(found)
                break
        if not records:
            return None
        return all(visible(principal, r.tenant, r.context) for r in records)

    async def calls(
        self,
        states: Iterable[CallState] | None = None,
        *,
        run_id: str | None = None,
        principal: Principal | None = None,
    ) -> list[CallRecord]:
        found: list[CallRecord] = await self.io(
            self.store.calls,
            states,
            run_id=run_id,
            tenant=tenant_of(principal),
            principal=owner_of(principal),
        )
        return found

    async def action(
        self, action_id: str, *, principal: Principal | None = None
    ) -> ActionRecord | None:
        """The action ``action_id``, or None when it is not stored or not the principal's (a
        principal never learns that another tenant's action exists; within its tenant, an
        action of a call made for another principal is not its either)."""
        record: ActionRecord | None = await self.io(self.store.action, action_id)
        if record is None or not mine(principal, record.tenant, record.principal):
            return None
        return record

    async def actions(
        self,
        *,
        state: ActionState | None = "pending",
        run_id: str | None = None,
        name: str | None = None,
        call_id: str | None = None,
        principal: Principal | None = None,
    ) -> list[ActionRecord]:
        """The actions the principal may see: of its tenant and, within it, of calls made for
        it (or for nobody), narrowed in the store's query."""
        found: list[ActionRecord] = await self.io(
            self.store.actions,
            state=state,
            run_id=run_id,
            name=name,
            call_id=call_id,
            tenant=tenant_of(principal),
            principal=owner_of(principal),
        )
        return found

    async def suspensions(
        self, call_id: str, *, principal: Principal | None = None
    ) -> list[dict[str, Any]]:
        """The call's suspension episodes as a client reads them (seed 002's suspension view),
        oldest first: every suspend point it waited at, answered or not, with its state (the
        pending one is the last); empty when the call is not the principal's."""
        found = await self.actions(state=None, call_id=call_id, principal=principal)
        return [suspension_json(a) for a in found if a.point is not None and a.point[0] != "@"]

    async def actions_page(
        self,
        *,
        state: ActionState | None = "pending",
        run_id: str | None = None,
        name: str | None = None,
        principal: Principal | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        waited_over_s: float | None = None,
        waited_under_s: float | None = None,
        thread_id: str | None = None,
        agent_id: str | None = None,
    ) -> Page[ActionRecord]:
        """A page of the actions ``actions`` lists, oldest first: one query (two with a
        cursor), whatever the volume; read off the event loop. ``waited_over_s`` and
        ``waited_under_s``: only those waiting longer, or less long, than that; ``thread_id``
        and ``agent_id``: only those whose origin is that thread, or that agent."""
        size = page_size(limit)
        found: list[ActionRecord] = await self._io_thread(
            self.store.actions,
            state=state,
            run_id=run_id,
            name=name,
            tenant=tenant_of(principal),
            principal=owner_of(principal),
            limit=size + 1,
            after=after_of(cursor),
            suspended_before=None if waited_over_s is None else ago(waited_over_s),
            suspended_since=None if waited_under_s is None else ago(waited_under_s),
            thread_id=thread_id,
            agent_id=agent_id,
        )
        return paged(found, size, lambda action: action.action_id)

    async def calls_page(
        self,
        states: Iterable[CallState] | None = None,
        *,
        run_id: str | None = None,
        principal: Principal | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[CallRecord]:
        """A page of the calls ``calls`` lists, oldest first (one or two queries)."""
        size = page_size(limit)
        found: list[CallRecord] = await self._io_thread(
            self.store.calls,
            states,
            run_id=run_id,
            tenant=tenant_of(principal),
            principal=owner_of(principal),
            limit=size + 1,
            after=after_of(cursor),
        )
        return paged(found, size, lambda call: call.call_id)

    async def grants_page(
        self,
        *,
        principal: Principal | None = None,
        tool: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[GrantRecord]:
        """A page of the principal's grants (an operator's: all), oldest first."""
        size = page_size(limit)
        found: list[GrantRecord] = await self._io_thread(
            self.store.grants,
            tenant=tenant_of(principal),
            principal=owner_of(principal),
            tool=tool,
            limit=size + 1,
            after=after_of(cursor),
        )
        return paged(found, size, lambda grant: grant.grant_id)

    async def _io_thread(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A read of many rows: in a thread where the store does I/O."""
        thread = getattr(self.io, "thread", None)
        if thread is None:
            found: T = await self.io(method, *args, **kwargs)
            return found
        read: T = await thread(method, *args, **kwargs)
        return read

    async def data(
        self, call_id: str, channel: str | None = None, *, principal: Principal | None = None
    ) -> list[DataRecord]:
        """The call's ToolData items (none when the call is not the principal's)."""
        if principal is not None and await self.call(call_id, principal=principal) is None:
            return []
        found: list[DataRecord] = await self.io(self.store.data, call_id, channel)
        return found

    async def sees_run(self, run_id: str, *, principal: Principal | None = None) -> bool:
        """Whether the run has a call the principal may see (an operator sees every run)."""
        if principal is None or principal.operator:
            return True
        found: list[CallRecord] = await self.io(
            self.store.calls,
            run_id=run_id,
            tenant=principal.tenant,
            principal=principal.id,
            limit=1,
        )
        return bool(found)

    async def head(self, run_id: str) -> int:
        """The sequence number of the run's last committed event (0: none), to subscribe from
        now on without reading the store on the event loop."""
        if not self.store.durable:
            return 0
        last: int = await self.io(self.store.head, run_id)
        return last

    async def events(
        self,
        run_id: str,
        after: int = 0,
        *,
        principal: Principal | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """The run's committed events after ``after`` that belong to the principal's calls
        (narrowed in the store's query), at most ``limit`` of them; off the event loop."""
        found: list[Event] = await self._io_thread(
            self.store.events,
            run_id,
            after,
            limit=limit,
            tenant=tenant_of(principal),
            principal=owner_of(principal),
        )
        return found

    # -- for callers that cannot await (the typed client's ``pending()`` and ``<tool>_data()``,
    # synchronous like HttpTransport's): the same rule, the store read on the caller's thread

    def actions_blocking(
        self,
        *,
        state: ActionState | None = "pending",
        run_id: str | None = None,
        name: str | None = None,
        principal: Principal | None = None,
    ) -> list[ActionRecord]:
        """``actions``, read without awaiting (it blocks on the store)."""
        return self.store.actions(
            state=state,
            run_id=run_id,
            name=name,
            tenant=tenant_of(principal),
            principal=owner_of(principal),
        )

    def data_blocking(
        self, call_id: str, channel: str | None = None, *, principal: Principal | None = None
    ) -> list[DataRecord]:
        """``data``, read without awaiting (it blocks on the store)."""
        if principal is not None:
            record = self.store.call(call_id)
            if record is None or not visible(principal, record.tenant, record.context):
                return []
        return self.store.data(call_id, channel)

    async def grants(
        self, *, principal: Principal | None = None, tool: str | None = None
    ) -> list[GrantRecord]:
        """The principal's own standing permission grants (an operator's: all), as its calls
        and actions are its own (``may_act_on``)."""
        found: list[GrantRecord] = await self.io(
            self.store.grants, tenant=tenant_of(principal), principal=owner_of(principal), tool=tool
        )
        return found

    async def revoke_grant(
        self, grant_id: str, *, principal: Principal | None = None
    ) -> GrantRecord | None:
        """Remove one of the principal's grants (an operator's: any); None when there is no
        such grant for it (another principal's grant does not exist for it)."""
        revoked: GrantRecord | None = await self.io(
            self.store.revoke_grant,
            grant_id,
            tenant=tenant_of(principal),
            principal=owner_of(principal),
        )
        return revoked


def suspension_json(action: ActionRecord) -> dict[str, Any]:
    """One suspension episode: ``name`` is its suspend point, ``input`` what it showed; once
    resolved, ``resolved_at``, and the answer (``resume``) of a submitted one."""
    episode: dict[str, Any] = {
        "action_id": action.action_id,
        "name": action.point,
        "input": action.payload,
        "suspended_at": action.suspended_at,
        "state": action.state,
    }
    if action.state != "pending":
        episode["resolved_at"] = action.resolved_at
    if action.state == "submitted":
        episode["resume"] = action.resume
    return episode
