"""``CallWorkflow``: one tool call on Temporal, holding the pending actions it waits on.

The workflow runs the call's steps as activities (``blade_runtime.temporal.activities``) with the
retry policy its side effect allows: ``pure`` and ``idempotent`` are retried, ``non_idempotent``
gets one attempt, and a worker that died in it (no heartbeat) settles the call as INTERRUPTED.
A step that leaves a pending action (a suspension, a client tool, a permission ask) is held here
until a ``submit`` update resolves it, a ``settle`` update cancels or fails it, or its deadline's
timer fires. The updates' validators check the principal's tenant and the resume schema, so a
refused submission leaves nothing in the history and never re-enters the tool.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, SearchAttributePair
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from blade_runtime.core import actions
    from blade_runtime.core.caller import CallContext, Principal
    from blade_runtime.core.records import visible
    from blade_runtime.core.results import ErrorCode
    from blade_runtime.core.store import ActionRecord
    from blade_runtime.temporal.activities import (
        CALL,
        EXPIRE,
        RESUME,
        SETTLE,
        CallInput,
        ResumeInput,
        SettleInput,
        Step,
    )

WORKFLOW = "BladeCall"
SUBMIT, SETTLE_UPDATE, STEP = "submit", "settle", "step"
PENDING, STATE, DATA = "pending", "state", "data"
TENANT = SearchAttributeKey.for_keyword("BladeTenant")
# Every action the call waited on, kept after it is resolved (a late submit then finds the call).
ACTION = SearchAttributeKey.for_keyword_list("BladeActionIds")
# The action the call waits on now (unset while it runs and once it settled): what a listing asks.
WAITING = SearchAttributeKey.for_keyword("BladeWaiting")
# Whom the call was made for (unset for an anonymous call), its run and its tool: a listing's
# filters, set when the call starts.
OWNER = SearchAttributeKey.for_keyword("BladeOwner")
RUN = SearchAttributeKey.for_keyword("BladeRun")
TOOL = SearchAttributeKey.for_keyword("BladeTool")
SEARCH_ATTRIBUTES = {
    TENANT.name: "Keyword",
    ACTION.name: "KeywordList",
    WAITING.name: "Keyword",
    OWNER.name: "Keyword",
    RUN.name: "Keyword",
    TOOL.name: "Keyword",
}
"""Register them once per namespace (``temporal operator search-attribute create``)."""
MEMO = "blade_action"
"""The memo key of the waiting action's summary (``action_summary``), which a listing reads from
Temporal's visibility store without asking a worker."""
SUMMARY_PAYLOAD_BYTES = 8192
"""The largest payload (as JSON) a listing shows; a larger one is ``null`` there (``action``
reads it whole from the workflow)."""
VISIBILITY_PATCH = "blade-visibility"  # workflows started before the memo replay without it


@dataclass
class CallStart:
    call: CallInput
    side_effect: str
    timeout_ms: int
    heartbeat_s: float = 10.0
    attempts: int = 0  # the most runs of a pure or idempotent step: 0 is Temporal's (unlimited)
    tenant: str = ""
    indexed: bool = True  # upsert BladeActionIds (registered search attributes)


@dataclass
class SubmitRequest:
    action_id: str
    payload: Any
    principal: Any = None  # Principal.to_json(); None is the application


@dataclass
class SettleRequest:
    action_id: str
    cancelled: bool
    reason: str
    principal: Any = None


def refused(code: ErrorCode, message: str) -> ApplicationError:
    """An update refused (by its validator: nothing is recorded) with the runtime's code."""
    return ApplicationError(message, type=code.value, non_retryable=True)


@workflow.defn(name=WORKFLOW)
class CallWorkflow:
    def __init__(self) -> None:
        self.start: CallStart | None = None
        self.action: dict[str, Any] | None = None  # the pending action's record
        self.snapshot: dict[str, Any] | None = None
        self.answer: SubmitRequest | SettleRequest | None = None
        self.outcomes: dict[str, Any] = {}  # by action id: the step that followed its answer
        self.resolved: dict[str, str] = {}  # by action id: how it was resolved
        self.first: Any = None  # what the first step left (a result, or the pending one)
        self.result: Any = None
        self.seen: list[str] = []  # the ids of the actions it waited on
        self.data: list[dict[str, Any]] = []  # the call's ToolData records, as last stored
        self.actions: list[dict[str, Any]] = []  # its actions, as last stored

    @workflow.run
    async def run(self, start: CallStart) -> Any:
        self.start = start
        step = await self._activity(CALL, start.call)
        self.first = step.result
        while step.action is not None:
            action, snapshot = step.action, step.snapshot
            assert snapshot is not None
            self.action, self.snapshot, self.answer = action, snapshot, None
            if start.indexed:
                self.seen.append(action["action_id"])
                workflow.upsert_search_attributes([ACTION.value_set(list(self.seen))])
            self._shown(action)
            expires = action.get("expires_at")
            wait = None if expires is None else max(0.0, expires - workflow.time())
            try:
                await workflow.wait_condition(lambda: self.answer is not None, timeout=wait)
            except TimeoutError:
                self.resolved[action["action_id"]] = "expired"
                self.action = None
                step = await self._activity(EXPIRE, SettleInput(snapshot, action["action_id"]))
            except asyncio.CancelledError:
                # The call was cancelled while it waited: its action settles as CANCELLED
                # through the runtime (hooks and observers see it), then the call ends.
                self.resolved[action["action_id"]] = "cancelled"
                self.action = None
                reason = "the call was cancelled through Temporal"
                cancel = SettleInput(snapshot, action["action_id"], True, reason)
                step = await self._activity(SETTLE, cancel)
            else:
                answer = self.answer
                assert answer is not None
                self.action = None
                if isinstance(answer, SubmitRequest):
                    request: Any = ResumeInput(
                        snapshot, answer.action_id, answer.payload, answer.principal
                    )
                    step = await self._activity(RESUME, request)
                else:
                    request = SettleInput(
                        snapshot, answer.action_id, answer.cancelled, answer.reason
                    )
                    step = await self._activity(SETTLE, request)
            self.snapshot = None
            self._shown(None)
            self.outcomes[action["action_id"]] = step.result
        self.result = step.result
        return step.result

    def _shown(self, action: dict[str, Any] | None) -> None:
        """Keep the waiting action's summary (or its absence) where Temporal's visibility store
        lists it: the memo always, and ``BladeWaiting`` where the namespace has it."""
        start = self.start
        assert start is not None
        if not workflow.patched(VISIBILITY_PATCH):
            return
        if start.indexed:
            waiting = (
                WAITING.value_unset() if action is None else WAITING.value_set(action["action_id"])
            )
            workflow.upsert_search_attributes([waiting])
        workflow.upsert_memo({MEMO: None if action is None else action_summary(action)})

    async def _activity(self, name: str, request: Any) -> Step:
        step = await self._run_activity(name, request)
        if step.snapshot is not None:
            self.data = list(step.snapshot.get("data", ()))
            self.actions = list(step.snapshot.get("actions", ()))
        else:
            if "data" in step.extra:
                self.data = list(step.extra["data"])
            if "actions" in step.extra:
                self.actions = list(step.extra["actions"])
        return step

    async def _run_activity(self, name: str, request: Any) -> Step:
        start = self.start
        assert start is not None
        once = start.side_effect == "non_idempotent"
        retry = RetryPolicy(maximum_attempts=1 if once else start.attempts)
        try:
            step: Step = await workflow.execute_activity(
                name,
                request,
                result_type=Step,
                # The runtime's own deadline settles the call as TIMEOUT first; this one only
                # catches a worker that never answers.
                start_to_close_timeout=timedelta(milliseconds=start.timeout_ms + 30_000),
                heartbeat_timeout=timedelta(seconds=start.heartbeat_s),
                retry_policy=retry,
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            )
        except asyncio.CancelledError:
            # The workflow was cancelled: the activity was cancelled with it (``ctx.signal``)
            # and has settled; the call's result says so.
            message = "The call was cancelled through Temporal."
            return Step(actions.error_json(ErrorCode.CANCELLED, message))
        except ActivityError as error:
            if once:
                message = (
                    "The worker running this non-idempotent call stopped before it settled "
                    f"({error.cause or error}); it is not run again: reconcile its effects."
                )
                return Step(actions.error_json(ErrorCode.INTERRUPTED, message))
            message = f"The call could not be run: {error.cause or error}"
            return Step(actions.error_json(ErrorCode.TOOL_ERROR, message))
        return step

    # -- what clients see ------------------------------------------------------------------

    def _may(self, principal: Any) -> bool:
        start = self.start
        if start is None:
            return False
        # As on the other stores: None is the application itself, which sees every tenant.
        return visible(Principal.from_json(principal), start.tenant, start.call.context)

    @workflow.query(name=PENDING)
    def pending(self, principal: Any = None) -> dict[str, Any] | None:
        """The action the call waits on, for a principal who may see it (else None)."""
        if self.action is None or not self._may(principal):
            return None
        return dict(self.action)

    @workflow.query(name=STATE)
    def state(self, principal: Any = None) -> dict[str, Any] | None:
        if not self._may(principal):
            return None
        start = self.start
        assert start is not None
        # the call's record, as the last snapshot has it (a call that waited), else its start
        snapshot = self.snapshot or {}
        call = (snapshot.get("calls") or [None])[0]
        state = "settled" if self.result is not None else "running"
        if call is not None and self.result is None:
            state = call["state"]
        caller = CallContext.from_json(start.call.context)
        return {
            "call_id": start.call.call_id,
            "run_id": start.call.run_id,
            "name": start.call.name,
            "spec_id": None if call is None else call["spec_id"],
            "state": state,
            "started_at": (
                workflow.info().start_time.isoformat() if call is None else call["started_at"]
            ),
            "input": start.call.arguments,
            "tenant": start.tenant,
            "thread_id": None if caller is None else caller.thread_id,
            "agent_id": None if caller is None else caller.agent_id,
            "action": self.action,
            "resolved": dict(self.resolved),
            "result": self.result,
            "data": list(self.data),
            "actions": list(self.actions),  # as last stored
        }

    @workflow.query(name=DATA)
    def call_data(self, principal: Any = None) -> list[dict[str, Any]] | None:
        """The call's ToolData records (durable ones), for a principal who may see the call."""
        if not self._may(principal):
            return None
        return list(self.data)

    @workflow.update(name=STEP)
    async def step(self) -> Any:
        """What the call's first step left: its result, or the pending action it waits on."""
        await workflow.wait_condition(lambda: self.first is not None)
        return self.first

    @workflow.update(name=SUBMIT)
    async def submit(self, request: SubmitRequest) -> Any:
        self.answer = request
        self.resolved[request.action_id] = "submitted"
        await workflow.wait_condition(lambda: request.action_id in self.outcomes)
        return self._with_run(self.outcomes[request.action_id])

    def _with_run(self, outcome: Any) -> Any:
        """An update's answer with its call's run id (the result as stored has none)."""
        start = self.start
        assert start is not None
        return {"run_id": start.call.run_id, **outcome} if isinstance(outcome, dict) else outcome

    @submit.validator
    def _check_submit(self, request: SubmitRequest) -> None:
        action = self._answerable(request.action_id, request.principal)
        problem = actions.invalid_submission(action, request.payload)
        if problem is not None:
            raise refused(ErrorCode.INVALID_SUBMISSION, problem)

    @workflow.update(name=SETTLE_UPDATE)
    async def settle(self, request: SettleRequest) -> Any:
        self.answer = request
        self.resolved[request.action_id] = "cancelled" if request.cancelled else "failed"
        await workflow.wait_condition(lambda: request.action_id in self.outcomes)
        return self._with_run(self.outcomes[request.action_id])

    @settle.validator
    def _check_settle(self, request: SettleRequest) -> None:
        self._answerable(request.action_id, request.principal)

    def _answerable(self, action_id: str, principal: Any) -> ActionRecord:
        """The pending action ``action_id`` as a record, or the refusal a client gets."""
        if not self._may(principal):
            raise refused(ErrorCode.UNKNOWN_ACTION, f"No pending action {action_id!r}.")
        how = self.resolved.get(action_id)
        if how is not None:
            raise refused(
                ErrorCode.ACTION_ALREADY_RESOLVED, f"Action {action_id} was already {how}."
            )
        action = self.action
        if action is None or action["action_id"] != action_id or self.answer is not None:
            raise refused(ErrorCode.UNKNOWN_ACTION, f"No pending action {action_id!r}.")
        expires = action.get("expires_at")
        if expires is not None and expires <= workflow.time():
            raise refused(ErrorCode.ACTION_ALREADY_RESOLVED, f"Action {action_id} expired.")
        return ActionRecord(**action)


def search_attributes(start: CallStart) -> list[SearchAttributePair[str]]:
    """The attributes a call starts with: its tenant, run, tool and (if any) its principal."""
    pairs = [
        SearchAttributePair(TENANT, start.tenant),
        SearchAttributePair(RUN, start.call.run_id),
        SearchAttributePair(TOOL, start.call.name),
    ]
    caller = CallContext.from_json(start.call.context)
    if caller is not None and caller.principal is not None:
        pairs.append(SearchAttributePair(OWNER, caller.principal.id))
    return pairs


def action_summary(action: dict[str, Any]) -> dict[str, Any]:
    """The pending action's record as a listing shows it: whole, but a payload larger than
    ``SUMMARY_PAYLOAD_BYTES`` as JSON is ``None`` (its size in ``payload_bytes``)."""
    size = len(json.dumps(action.get("payload"), ensure_ascii=False).encode())
    shown = dict(action)
    if size > SUMMARY_PAYLOAD_BYTES:
        shown["payload"] = None
    shown["payload_bytes"] = size
    return shown
