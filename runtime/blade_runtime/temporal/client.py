"""``TemporalTools``: calls and pending actions on Temporal, as the runtime's own API has them.

``call`` starts a ``CallWorkflow`` and returns what its first step left (the result, or the
pending action it waits on); ``pending``, ``action``, ``submit``, ``cancel`` and ``fail`` are the
workflow's queries and updates. Results are the runtime's stored JSON (``status``, ``content``,
``output``; ``code`` and ``message`` for an error), so an error is a value, never an exception.
A principal sees only its tenant's calls and actions (an operator sees all).
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Mapping
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import (
    ListWorkflowExecutionsRequest,
    ResetStickyTaskQueueRequest,
)
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import (
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from blade_runtime.core import actions
from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.files import FileBody
from blade_runtime.core.records import MAX_PAGE_SIZE, Page, mine, page_size, tenant_of
from blade_runtime.core.results import ErrorCode
from blade_runtime.core.store import BadCursor, storable_id
from blade_runtime.runtime import Runtime
from blade_runtime.temporal.activities import CallInput
from blade_runtime.temporal.workflow import (
    ACTION,
    DATA,
    MEMO,
    OWNER,
    PENDING,
    RUN,
    SETTLE_UPDATE,
    STATE,
    STEP,
    SUBMIT,
    TENANT,
    TOOL,
    WAITING,
    WORKFLOW,
    CallStart,
    CallWorkflow,
    SettleRequest,
    SubmitRequest,
    search_attributes,
)

WORKFLOW_PREFIX = "blade-call-"
LOOKUP_S = 2.0  # how long an action id is looked for while the server's index catches up


def workflow_id(call_id: str) -> str:
    return f"{WORKFLOW_PREFIX}{call_id}"


class TemporalTools:
    """Tool calls and pending actions on the Temporal namespace ``client`` is connected to.

    ``runtime``: the registrations the workers run (only ``call`` needs it: it reads each
    tool's side effect and timeout there). ``task_queue``: the workers' queue. ``heartbeat_s``:
    how long a worker may go silent before its activity is taken for dead. ``attempts``: the
    most runs of a pure or idempotent step (0: Temporal's default, unlimited). ``indexed``:
    whether the namespace has the search attributes of ``SEARCH_ATTRIBUTES`` (finding an action
    by its id alone needs them).
    """

    def __init__(
        self,
        client: Client,
        *,
        task_queue: str = "blade",
        runtime: Runtime | None = None,
        heartbeat_s: float = 10.0,
        attempts: int = 0,
        indexed: bool = True,
    ) -> None:
        self.client = client
        self.task_queue = task_queue
        self.runtime = runtime
        self.heartbeat_s = heartbeat_s
        self.attempts = attempts
        self.indexed = indexed
        self._calls: dict[str, str] = {}  # action id: call id, for the actions seen here

    async def file(self, file_id: str, principal: Principal | None) -> FileBody | None:
        """A file a tool saved, of the principal's tenant (None: not saved, another tenant's,
        or not readable here). Files live in the workers' file backend: read where the
        registrations (``runtime=``) name the one the workers share
        (``Runtime(files=FolderFiles(path))``); an activity's own store keeps none."""
        runtime = self.runtime
        if runtime is None or not shares_files(runtime):
            return None
        return await runtime.files.read(file_id, tenant_of(principal))

    async def call(
        self,
        name: str,
        arguments: Mapping[str, Any],
        *,
        call_id: str | None = None,
        run_id: str = "default",
        context: CallContext | None = None,
        fresh: bool = False,
    ) -> dict[str, Any]:
        """Start the call and return its first step's result (``status`` ``pending`` with the
        ``action`` it waits on, when it waits). A given ``call_id`` is an idempotency key: a
        call under it that is not this one is refused (DUPLICATE_CALL), which costs a query;
        ``fresh``: the caller made the id for this call alone (a server's own ids), no check."""
        given = call_id is not None and not fresh
        handle, start = self._start(name, arguments, call_id, run_id, context)
        if isinstance(start, dict):
            return start
        operation = WithStartWorkflowOperation(
            CallWorkflow.run,
            start,
            id=handle,
            task_queue=self.task_queue,
            # A call id is an idempotency key: a retry joins the running call, and a settled
            # one is never started again (its result is the answer).
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            search_attributes=self._attributes(start),
        )
        call_id = start.call.call_id
        try:
            first: dict[str, Any] = await self.client.execute_update_with_start_workflow(
                STEP, start_workflow_operation=operation
            )
        except WorkflowAlreadyStartedError:
            first = await self.result(call_id)
        if given:
            who = None if context is None or context.principal is None else context.principal
            earlier = await self.state(call_id, principal=who)
            if earlier is None or earlier["name"] != name or earlier["input"] != dict(arguments):
                message = f"The call id {call_id!r} is taken by another call."
                return _error(ErrorCode.DUPLICATE_CALL, message)
            return self._seen(call_id, earlier["run_id"], first)
        return self._seen(call_id, start.call.run_id, first)

    async def start(
        self,
        name: str,
        arguments: Mapping[str, Any],
        *,
        call_id: str | None = None,
        run_id: str = "default",
        context: CallContext | None = None,
    ) -> str:
        """Start the call without waiting for it; returns its call id."""
        handle, start = self._start(name, arguments, call_id, run_id, context)
        if isinstance(start, dict):
            raise ValueError(start["message"])
        await self.client.start_workflow(
            CallWorkflow.run,
            start,
            id=handle,
            task_queue=self.task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            search_attributes=self._attributes(start),
        )
        return start.call.call_id

    async def result(self, call_id: str) -> dict[str, Any]:
        """The call's final result (it waits for the call to settle)."""
        found: dict[str, Any] = await self.client.get_workflow_handle(workflow_id(call_id)).result()
        return found

    async def cancel_call(self, call_id: str, reason: str = "") -> None:
        """Cancel the call: its running activity is cancelled (``ctx.signal`` fires and the call
        settles as CANCELLED), or the call stops waiting on its action. ``reason``: kept in the
        workflow's history with the cancellation request."""
        await self.client.get_workflow_handle(workflow_id(call_id)).cancel(reason=reason)

    def _start(
        self,
        name: str,
        arguments: Mapping[str, Any],
        call_id: str | None,
        run_id: str,
        context: CallContext | None,
    ) -> tuple[str, CallStart | dict[str, Any]]:
        if self.runtime is None:
            raise TypeError("TemporalTools.call needs runtime= (the workers' registrations)")
        call_id = f"call_{uuid.uuid4().hex}" if call_id is None else call_id
        registration = self.runtime.tools.by_name.get(name)
        if registration is None:
            message = f"There is no tool named {name!r}."
            return "", actions.error_json(ErrorCode.TOOL_HANDLER_NOT_FOUND, message)  # type: ignore[return-value]
        if not (storable_id(call_id) and storable_id(run_id)):
            message = "A call id and a run id are 1 to 200 printable characters."
            return "", actions.error_json(ErrorCode.INVALID_INPUT, message)  # type: ignore[return-value]
        spec = registration.spec
        start = CallStart(
            CallInput(
                name,
                dict(arguments),
                call_id,
                run_id,
                None if context is None else context.to_json(),
            ),
            side_effect=spec.side_effect,
            timeout_ms=registration.timeout_ms,
            heartbeat_s=self.heartbeat_s,
            attempts=self.attempts,
            tenant="" if context is None else context.tenant,
            indexed=self.indexed,
        )
        return workflow_id(call_id), start

    def _attributes(self, start: CallStart) -> TypedSearchAttributes:
        if not self.indexed:
            return TypedSearchAttributes.empty
        return TypedSearchAttributes(search_attributes(start))

    def _seen(self, call_id: str, run_id: str, result: dict[str, Any]) -> dict[str, Any]:
        if result.get("status") == "pending":
            self._calls[str(result["action_id"])] = call_id
        return {"call_id": call_id, "run_id": run_id, **result}

    # -- pending actions -------------------------------------------------------------------

    async def pending(
        self,
        *,
        principal: Principal | None = None,
        run_id: str | None = None,
        tool: str | None = None,
    ) -> list[dict[str, Any]]:
        """Every pending action ``principal`` may see, oldest first: every page of
        ``pending_page`` (no worker is asked)."""
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = await self.pending_page(
                principal=principal, run_id=run_id, tool=tool, limit=MAX_PAGE_SIZE, cursor=cursor
            )
            found += page.items
            cursor = page.next
            if cursor is None:
                return sorted(found, key=lambda a: (a.get("suspended_at") or "", a["action_id"]))

    async def pending_page(
        self,
        *,
        principal: Principal | None = None,
        run_id: str | None = None,
        tool: str | None = None,
        tenant: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[dict[str, Any]]:
        """A page of the pending actions ``principal`` may see (``limit``: at most
        ``MAX_PAGE_SIZE``; ``cursor``: the ``next`` of the page before), newest call first.

        One visibility query with Temporal's page token: each waiting call keeps its action's
        summary in its memo (``action_summary``), so no worker is asked and a dead or slow
        one hides nothing. Temporal's visibility is eventually consistent: an action shows a
        moment after its call suspends, and leaves a moment after it is answered. Without the
        search attributes (``indexed=False``) the query pages over the running calls and a page
        may hold fewer actions than ``limit``. ``tenant``: only that tenant's (within what
        ``principal`` may see). ``BadCursor`` for a cursor no page made."""
        size = page_size(limit)
        query = f'WorkflowType = "{WORKFLOW}" AND ExecutionStatus = "Running"'
        if self.indexed:
            query += f" AND {WAITING.name} IS NOT NULL"
            if principal is not None and not principal.operator:
                query += f" AND {TENANT.name} = {_quoted(principal.tenant)}"
                query += f" AND ({OWNER.name} IS NULL OR {OWNER.name} = {_quoted(principal.id)})"
            if tenant is not None:
                query += f" AND {TENANT.name} = {_quoted(tenant)}"
            if run_id is not None:
                query += f" AND {RUN.name} = {_quoted(run_id)}"
            if tool is not None:
                query += f" AND {TOOL.name} = {_quoted(tool)}"
        request = ListWorkflowExecutionsRequest(
            namespace=self.client.namespace,
            page_size=size,
            next_page_token=_token_of(cursor) or b"",
            query=query,
        )
        try:
            # A cursor's page is asked once: Temporal answers a token it never made with an
            # error the client would otherwise retry for many seconds.
            listed = await self.client.workflow_service.list_workflow_executions(
                request, retry=cursor is None
            )
        except RPCError as error:
            if cursor is not None and error.status in _BAD_TOKEN:
                raise BadCursor(
                    "not a cursor this listing made; list from the first page"
                ) from None
            raise
        memos = [e.memo.fields[MEMO] for e in listed.executions if MEMO in e.memo.fields]
        items = []
        for summary in await self.client.data_converter.decode(memos):
            # The query narrowed the search; the summary, written by the call's own workflow,
            # decides (and is all there is without the search attributes).
            if not isinstance(summary, dict) or not mine(
                principal, summary.get("tenant", ""), summary.get("principal", "")
            ):
                continue
            asked = (run_id, summary.get("run_id")), (tool, summary.get("name"))
            if any(want not in (None, have) for want, have in asked):
                continue
            if tenant not in (None, summary.get("tenant")):
                continue
            items.append(summary)
        token = listed.next_page_token
        return Page(items, _cursor_of(token) if token else None)

    async def action(
        self, action_id: str, *, principal: Principal | None = None, call_id: str | None = None
    ) -> dict[str, Any] | None:
        """The pending action ``action_id`` (None when there is none for ``principal``)."""
        handle = await self._handle(action_id, call_id)
        if handle is None:
            return None
        who = None if principal is None else principal.to_json()
        found = await self._ask(handle, PENDING, who)
        return found if found is not None and found.get("action_id") == action_id else None

    async def find_action(
        self, action_id: str, *, principal: Principal | None = None, call_id: str | None = None
    ) -> dict[str, Any] | None:
        """The action ``action_id`` in whatever state its call's workflow has it (``state``:
        ``pending``, or how it was resolved since), or None when ``principal`` may not see its
        call (or there is no such action). One query of the call's workflow."""
        handle = await self._handle(action_id, call_id)
        if handle is None:
            return None
        who = None if principal is None else principal.to_json()
        found = await self._ask(handle, STATE, who)
        if found is None:
            return None
        waiting = found.get("action")
        if waiting is not None and waiting.get("action_id") == action_id:
            record = dict(waiting)
        else:
            known = [a for a in found.get("actions") or () if a.get("action_id") == action_id]
            if not known:
                return None
            record = dict(known[0])
            how = (found.get("resolved") or {}).get(action_id)
            if how is not None:
                record["state"] = how
        self._calls[action_id] = str(found["call_id"])
        return record

    async def state(
        self, call_id: str, *, principal: Principal | None = None
    ) -> dict[str, Any] | None:
        """The call as its workflow holds it (its pending action, how its actions were
        resolved, its result once settled), or None for another tenant's call."""
        who = None if principal is None else principal.to_json()
        handle = self.client.get_workflow_handle(workflow_id(call_id))
        found: dict[str, Any] | None = await self._ask(handle, STATE, who)
        return found

    async def data(
        self, call_id: str, *, principal: Principal | None = None
    ) -> list[dict[str, Any]] | None:
        """The call's durable ToolData records (``channel``, ``item_id``, ``value``,
        ``updated_at``), in the order of first writes; None for another tenant's call."""
        who = None if principal is None else principal.to_json()
        handle = self.client.get_workflow_handle(workflow_id(call_id))
        found: list[dict[str, Any]] | None = await self._ask(handle, DATA, who)
        return found

    async def submit(
        self,
        action_id: str,
        payload: Any,
        *,
        principal: Principal | None = None,
        call_id: str | None = None,
    ) -> dict[str, Any]:
        """Resolve the pending action with ``payload`` and return what the call did next. The
        workflow's validator checks the payload first: an invalid one is INVALID_SUBMISSION, and
        nothing is recorded. Of many submits, one wins; the others get ACTION_ALREADY_RESOLVED."""
        request = SubmitRequest(
            action_id, payload, None if principal is None else principal.to_json()
        )
        return await self._update(action_id, call_id, SUBMIT, request, principal)

    async def cancel(
        self,
        action_id: str,
        reason: str = "the action was cancelled",
        *,
        principal: Principal | None = None,
        call_id: str | None = None,
    ) -> dict[str, Any]:
        who = None if principal is None else principal.to_json()
        request = SettleRequest(action_id, True, reason, who)
        return await self._update(action_id, call_id, SETTLE_UPDATE, request, principal)

    async def fail(
        self,
        action_id: str,
        reason: str = "the action failed",
        *,
        principal: Principal | None = None,
        call_id: str | None = None,
    ) -> dict[str, Any]:
        who = None if principal is None else principal.to_json()
        request = SettleRequest(action_id, False, reason, who)
        return await self._update(action_id, call_id, SETTLE_UPDATE, request, principal)

    async def _update(
        self,
        action_id: str,
        call_id: str | None,
        name: str,
        request: Any,
        principal: Principal | None,
    ) -> dict[str, Any]:
        unknown = _error(ErrorCode.UNKNOWN_ACTION, f"No pending action {action_id!r}.")
        handle = await self._handle(action_id, call_id)
        if handle is None:
            return unknown
        ids = {"call_id": handle.id.removeprefix(WORKFLOW_PREFIX)}
        try:
            done: dict[str, Any] = await handle.execute_update(name, request)
        except WorkflowUpdateFailedError as failed:
            cause = failed.cause
            if isinstance(cause, ApplicationError) and cause.type in _CODES:
                code = ErrorCode(cause.type)
                if code == ErrorCode.UNKNOWN_ACTION:  # maybe another tenant's: names nothing
                    return unknown
                return {**ids, **_error(code, cause.message)}
            raise
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
            # The call has settled: its search attributes say whose it was (no worker asked).
            if not await self._owned(handle, principal):
                return unknown
            message = f"Action {action_id} was already resolved: its call has settled."
            return {**ids, **_error(ErrorCode.ACTION_ALREADY_RESOLVED, message)}
        return {**ids, **done}

    async def _owned(self, handle: WorkflowHandle[Any, Any], principal: Principal | None) -> bool:
        """Whether ``principal`` may see the (settled) call of ``handle``, by its attributes."""
        if principal is None or principal.operator:
            return True
        if not self.indexed:
            return False
        try:
            found = (await handle.describe()).typed_search_attributes
        except RPCError:
            return False
        return mine(principal, found.get(TENANT) or "", found.get(OWNER) or "")

    async def _handle(self, action_id: str, call_id: str | None) -> WorkflowHandle[Any, Any] | None:
        """The workflow of the call that waits (or waited) on ``action_id``."""
        call_id = call_id or self._calls.get(action_id)
        if call_id is not None:
            return self.client.get_workflow_handle(workflow_id(call_id))
        if not self.indexed or not storable_id(action_id) or not action_id.isascii():
            return None
        query = f"{ACTION.name} = {_quoted(action_id)}"
        deadline = asyncio.get_running_loop().time() + LOOKUP_S
        while True:
            async for found in self.client.list_workflows(query, limit=1):
                return self.client.get_workflow_handle(found.id)
            if asyncio.get_running_loop().time() >= deadline:
                return None
            await asyncio.sleep(0.1)

    async def _ask(self, handle: WorkflowHandle[Any, Any], query: str, who: Any) -> Any:
        for attempt in range(2):
            try:
                return await handle.query(query, who)
            except RPCError as error:
                if error.status == RPCStatusCode.NOT_FOUND:
                    return None
                if error.status != RPCStatusCode.FAILED_PRECONDITION or attempt:
                    raise
                # The worker that cached the workflow is gone: any other worker may answer.
                await self.client.workflow_service.reset_sticky_task_queue(
                    ResetStickyTaskQueueRequest(
                        namespace=self.client.namespace,
                        execution=WorkflowExecution(workflow_id=handle.id),
                    )
                )
        raise AssertionError("unreachable")


_CODES = frozenset(code.value for code in ErrorCode)
_BAD_TOKEN = frozenset({RPCStatusCode.INVALID_ARGUMENT, RPCStatusCode.UNKNOWN})


def _quoted(text: str) -> str:
    """A string literal of the server's list filter (the ids we pass are printable ASCII)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cursor_of(token: bytes) -> str:
    return base64.urlsafe_b64encode(token).decode().rstrip("=")


def _token_of(cursor: str | None) -> bytes | None:
    """Temporal's page token from a listing's cursor (Temporal checks the token itself)."""
    if cursor is None:
        return None
    try:
        token = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
    except (ValueError, UnicodeError):
        token = b""
    if not token:
        raise BadCursor("not a cursor this listing made; list from the first page")
    return token


def _error(code: ErrorCode, message: str) -> dict[str, Any]:
    found: dict[str, Any] = actions.error_json(code, message)  # type: ignore[assignment]
    return found


def shares_files(runtime: Runtime) -> bool:
    """Whether ``runtime``'s files outlive an activity: a backend of their own (a folder the
    workers share), not the activity's store."""
    return runtime.files.backend is not runtime.store
