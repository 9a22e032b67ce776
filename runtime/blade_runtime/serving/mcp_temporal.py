"""Tools on Temporal served over MCP (``blade-runtime[mcp,temporal]``): ``TemporalBackend``.

    backend = TemporalBackend(TemporalTools(client, task_queue="blade", runtime=runtime))
    server = mcp_server(backend, principal=Principal("ann", "acme"))     # as for a Runtime
    app = mcp_asgi_app(backend, authenticate=...)                         # streamable HTTP

``runtime`` is the workers' registrations (what is listed, with its schemas, annotations and
guidance); a call starts its ``CallWorkflow`` and answers with what its first step left, a
suspension becomes MCP's input-required flow as on a runtime (its answer is the workflow's
update, validated before anything is recorded, and resumes the call on any worker), and a
cancelled request cancels the call's workflow. ``resources/read`` of a call's files reads the
folder the workers share when ``runtime`` names it (``Runtime(files=FolderFiles(path))``, as
the workers' own); else a file is answered as one that does not exist. What Temporal does not
serve: progress and log notifications (a worker keeps no event stream to read them from).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.events import Subscription
from blade_runtime.core.files import FileBody
from blade_runtime.core.store import ActionRecord
from blade_runtime.runtime import Runtime
from blade_runtime.serving.mcp_backend import CallView, Outcome
from blade_runtime.temporal.client import TemporalTools

__all__ = ["TemporalBackend"]

log = logging.getLogger("blade_runtime.serving.mcp")
CANCEL_TRIES = 10  # a cancellation may reach a call's workflow a moment before it exists
CANCEL_RETRY_S = 0.2


class TemporalBackend:
    """``TemporalTools`` (with the workers' ``runtime=``) as the MCP server's backend."""

    reports = False  # no event stream: no progress, no log messages

    def __init__(self, tools: TemporalTools) -> None:
        if tools.runtime is None:
            raise TypeError("TemporalBackend needs TemporalTools(runtime=...): what it lists")
        self.tools = tools
        self._runtime = tools.runtime
        self.running: set[str] = set()  # the call ids of the calls this server waits on
        self._cancels: dict[str, asyncio.Task[None]] = {}  # by call id, while being sent

    @property
    def runtime(self) -> Runtime:
        return self._runtime

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str | None,
        run_id: str,
        context: CallContext,
    ) -> Outcome:
        # an id of this server's own, so that a cancelled request can cancel its call
        call_id = call_id or f"call_{uuid.uuid4().hex}"
        self.running.add(call_id)
        try:
            done = await self.tools.call(
                name, arguments, call_id=call_id, run_id=run_id, context=context, fresh=True
            )
        except (asyncio.CancelledError, WorkflowUpdateRPCTimeoutOrCancelledError) as stopped:
            task = asyncio.current_task()
            if isinstance(stopped, asyncio.CancelledError) or (task and task.cancelling()):
                # the request is gone (its client cancelled, or the server is stopping): so is
                # the call, as a runtime's call is with its request's task (the SDK says so
                # with an error of its own, which would read as the call's failure)
                self.cancel_call(call_id, "the MCP request was cancelled")
                raise asyncio.CancelledError from None
            raise
        finally:
            self.running.discard(call_id)
        return Outcome.stored(done)

    def cancel_call(self, call_id: str, reason: str) -> None:
        if call_id in self._cancels:  # already on its way (a closed request says so twice)
            return
        task = asyncio.get_running_loop().create_task(self._cancel(call_id, reason))
        self._cancels[call_id] = task
        task.add_done_callback(lambda _: self._cancels.pop(call_id, None))

    async def _cancel(self, call_id: str, reason: str) -> None:
        for attempt in range(CANCEL_TRIES):
            try:
                await self.tools.cancel_call(call_id, reason)
                return
            except RPCError as error:
                if error.status != RPCStatusCode.NOT_FOUND or attempt == CANCEL_TRIES - 1:
                    log.warning("cancelling call %s on Temporal failed: %s", call_id, error)
                    return
            await asyncio.sleep(CANCEL_RETRY_S)

    async def drain(self, timeout_s: float) -> None:
        """Let the cancellations sent so far reach Temporal (a stopping server's last ones)."""
        if self._cancels:
            await asyncio.wait(set(self._cancels.values()), timeout=timeout_s)

    async def action(self, action_id: str, principal: Principal | None) -> ActionRecord | None:
        found = await self.tools.find_action(action_id, principal=principal)
        return None if found is None else _record(found)

    async def call_view(self, call_id: str, principal: Principal | None) -> CallView | None:
        found = await self.tools.state(call_id, principal=principal)
        if found is None:
            return None
        result, waiting = found.get("result"), found.get("action")
        if found.get("state") == "settled" and isinstance(result, dict):
            return CallView(result=result)
        return CallView(waiting=None if waiting is None else _record(waiting))

    async def submit(self, action_id: str, payload: Any, principal: Principal | None) -> Outcome:
        return Outcome.stored(await self.tools.submit(action_id, payload, principal=principal))

    async def cancel(self, action_id: str, reason: str, principal: Principal | None) -> Outcome:
        return Outcome.stored(await self.tools.cancel(action_id, reason, principal=principal))

    async def file(self, file_id: str, principal: Principal | None) -> FileBody | None:
        return await self.tools.file(file_id, principal)  # the workers' shared backend

    async def subscribe(self, run_id: str) -> Subscription:
        raise NotImplementedError("run events are not served from Temporal")


_FIELDS = frozenset(ActionRecord.__dataclass_fields__)


def _record(found: dict[str, Any]) -> ActionRecord:
    return ActionRecord(**{key: value for key, value in found.items() if key in _FIELDS})
