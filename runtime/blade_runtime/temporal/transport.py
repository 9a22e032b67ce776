"""``TemporalTransport``: a generated typed ``Client`` over calls that run on Temporal.

``Client(TemporalTransport(tools, principal=...))`` makes the same typed calls, results and
pending actions as ``Client(runtime)`` in process: each goes through ``TemporalTools`` (a call
starts its workflow; a typed action's ``submit`` is the workflow's update). The typed client
lists pending actions synchronously too (``pending``): this transport answers that in a thread of
its own, with its own connection to the same server, from Temporal's visibility store, so it
never waits on a worker, even one the calling event loop runs; its pages (``pending_pages``) are
read on the caller's loop without blocking it.
Run events and files are not served from Temporal (``events`` and ``read_file`` refuse).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator
from typing import Any

from pydantic import JsonValue
from temporalio.client import Client

from blade_runtime.client import Transport
from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.files import FileBody, UnknownFile
from blade_runtime.core.results import ErrorCode
from blade_runtime.runtime import Runtime
from blade_runtime.temporal.client import TemporalTools

Data = dict[str, Any]


class TemporalTransport(Transport):
    """``tools`` (with the workers' ``runtime``, for calls) as a typed client's transport;
    ``principal``: who the calls are for and who reads and answers the actions (None: the
    application itself, every tenant)."""

    def __init__(self, tools: TemporalTools, principal: Principal | None = None) -> None:
        self.tools = tools
        self.principal = principal
        self._context = None if principal is None else CallContext(principal=principal)

    @property
    def runtime(self) -> Runtime:
        if self.tools.runtime is None:
            raise TypeError("TemporalTransport: its TemporalTools needs runtime= for calls")
        return self.tools.runtime

    async def call(self, spec_id: str, arguments: Any, *, call_id: str | None, run_id: str) -> Data:
        registration = self.runtime.registration_of(spec_id)
        if registration is None:
            message = f"This runtime has no registration of {spec_id}."
            return _error(call_id or "", run_id, ErrorCode.TOOL_HANDLER_NOT_FOUND.value, message)
        done = await self.tools.call(
            registration.name, arguments, call_id=call_id, run_id=run_id, context=self._context
        )
        return _typed(done, run_id)

    async def submit(self, action_id: str, payload: Any, ids: dict[str, str]) -> Data:
        done = await self.tools.submit(
            action_id, payload, principal=self.principal, call_id=ids.get("call_id")
        )
        return _typed({**ids, **done}, ids.get("run_id", ""))

    async def cancel(self, action_id: str, reason: str, ids: dict[str, str]) -> Data:
        done = await self.tools.cancel(
            action_id, reason, principal=self.principal, call_id=ids.get("call_id")
        )
        return _typed({**ids, **done}, ids.get("run_id", ""))

    async def fail(self, action_id: str, error: str, ids: dict[str, str]) -> Data:
        done = await self.tools.fail(
            action_id, error, principal=self.principal, call_id=ids.get("call_id")
        )
        return _typed({**ids, **done}, ids.get("run_id", ""))

    def pending(self, run_id: str | None) -> list[Data]:
        found = self._blocking(lambda tools: tools.pending(principal=self.principal, run_id=run_id))
        return [_action(record) for record in found]

    async def pending_page(
        self, run_id: str | None, limit: int | None, cursor: str | None
    ) -> tuple[list[Data], str | None]:
        """A page of the pending actions, from Temporal's visibility store on this loop's own
        connection (no worker is asked: it never waits on a worker this loop runs)."""
        page = await self.tools.pending_page(
            principal=self.principal, run_id=run_id, limit=limit, cursor=cursor
        )
        return [_action(record) for record in page.items], page.next

    def data(self, call_id: str) -> dict[str, list[dict[str, JsonValue]]]:
        found = self._blocking(lambda tools: tools.data(call_id, principal=self.principal))
        channels: dict[str, list[dict[str, JsonValue]]] = {}
        for record in found or ():
            item = {"id": record["item_id"], "value": record["value"]}
            channels.setdefault(record["channel"], []).append(
                {**item, "updated_at": record["updated_at"]}
            )
        return channels

    async def read_file(self, file_id: str) -> FileBody:
        raise UnknownFile(file_id)  # files live in the workers' file backend, not in Temporal

    def events(self, run_id: str, after: int | None) -> AsyncIterator[Any]:
        raise NotImplementedError("run events are not served from Temporal")

    def _blocking(self, ask: Any) -> Any:
        """``ask(tools)`` on a connection of its own, in a thread of its own (a blocking read
        the typed client makes, maybe from inside a running event loop)."""
        target = self.tools.client.service_client.config.target_host
        namespace = self.tools.client.namespace

        async def asked() -> Any:
            client = await Client.connect(target, namespace=namespace)
            tools = TemporalTools(
                client, task_queue=self.tools.task_queue, indexed=self.tools.indexed
            )
            return await ask(tools)

        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            return thread.submit(asyncio.run, asked()).result()


def _action(record: dict[str, Any]) -> Data:
    """An action record as the typed client's pending-action fields."""
    point = record["point"]
    return {
        "kind": record["spec_id"] if point is None else f"{record['spec_id']}#{point}",
        "action_id": record["action_id"],
        "name": record["name"] if point is None else f"{record['name']}.{point}",
        "spec_id": record["spec_id"],
        "point": point,
        "call_id": record["call_id"],
        "run_id": record["run_id"],
        "suspended_at": record["suspended_at"],
        "input": record["payload"],
    }


def _typed(done: dict[str, Any], run_id: str) -> Data:
    """A stored result as the fields of its typed result DTO."""
    ids = {"call_id": done.get("call_id", ""), "run_id": run_id}
    status = done.get("status")
    if status == "success":
        output = done.get("output", done.get("content"))
        return {"status": "success", **ids, "output": output, "content": done.get("content")}
    if status == "pending":
        return {"status": "pending", **ids, "action": _action(done["action"])}
    return _error(ids["call_id"], run_id, str(done.get("code")), str(done.get("message")))


def _error(call_id: str, run_id: str, code: str, message: str) -> Data:
    return {
        "status": "error",
        "call_id": call_id,
        "run_id": run_id,
        "code": code,
        "message": message,
    }
