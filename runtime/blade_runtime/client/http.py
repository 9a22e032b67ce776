"""``HttpTransport``: the generated typed ``Client`` against a runtime served over HTTP.

    client = Client(HttpTransport("https://tools.example.com", token=TOKEN))
    result = await client.refund_payment(RefundPaymentInput(...))

Every call carries an ``Idempotency-Key`` (the call id given, or a new one), so a call whose
connection broke is retried safely: the server answers a retry with the first call's result and
never runs the tool twice. Listing pending actions and reading call data are synchronous, as
the in-process client's are (they block for one round trip). ``read_file`` reads a file a tool
saved (its content checked against the server's SHA-256), and ``events`` follows a run's event
stream (Server-Sent Events), progress and messages included.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote

import httpx
from pydantic import JsonValue
from pydantic_core import to_jsonable_python

from blade_runtime.client import Data, RunEvent, Transport
from blade_runtime.core.files import FileBody, SavedFile, UnknownFile
from blade_runtime.core.records import MAX_PAGE_SIZE
from blade_runtime.core.results import ErrorCode

_CODES = frozenset(code.value for code in ErrorCode)


class RemoteRefused(Exception):
    """The server refused the request itself (authentication, a malformed request, an
    idempotency key used for another call): no tool result to return. One line, no secret."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class HttpTransport(Transport):
    """Requests to ``base_url`` (the app of ``blade_runtime.serving.http.create_app``), with a
    bearer ``token`` when given (never logged, never in a message). ``retries``: how many times a
    call is sent again after a connection error (safe: the idempotency key). ``thread_id`` and
    ``agent_id``: the thread its calls belong to and the agent that makes them (each call's
    context, and the origin of the actions they wait on)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout_s: float = 60.0,
        retries: int = 2,
        headers: dict[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sync_transport: httpx.BaseTransport | None = None,
        thread_id: str | None = None,
        agent_id: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        placed = {"thread_id": thread_id, "agent_id": agent_id}
        self._placed = {key: value for key, value in placed.items() if value is not None}
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        self._headers = sent
        self._timeout = timeout_s
        self.retries = retries
        self._transport = transport
        self._sync_transport = sync_transport
        self._client: httpx.AsyncClient | None = None
        self._sync: httpx.Client | None = None
        self._names: dict[str, str] | None = None

    # -- connections ------------------------------------------------------------------------

    def _async(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.base_url,
                headers=self._headers,
                timeout=self._timeout,
                transport=self._transport,
            )
        return self._client

    def _blocking(self) -> httpx.Client:
        if self._sync is None:
            self._sync = httpx.Client(
                base_url=self.base_url,
                headers=self._headers,
                timeout=self._timeout,
                transport=self._sync_transport,
            )
        return self._sync

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def __aenter__(self) -> HttpTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the transport ----------------------------------------------------------------------

    async def _name_of(self, spec_id: str) -> str | None:
        if self._names is None or spec_id not in self._names:
            answer = await self._async().get("/v1/tools")
            body = _body(answer)
            if answer.status_code != 200:
                raise _refused(answer.status_code, body)
            names: dict[str, str] = {}
            for tool in body["tools"]:
                names.setdefault(tool["spec_id"], tool["name"])
            self._names = names
        return self._names.get(spec_id)

    async def call(self, spec_id: str, arguments: Any, *, call_id: str | None, run_id: str) -> Data:
        key = call_id or f"call_{uuid.uuid4().hex}"
        ids = {"call_id": key, "run_id": run_id}
        name = await self._name_of(spec_id)
        if name is None:
            message = f"This runtime has no registration of {spec_id}."
            return {"status": "error", **ids, "code": "TOOL_HANDLER_NOT_FOUND", "message": message}
        body = to_jsonable_python(arguments)
        for attempt in range(self.retries + 1):
            try:
                answer = await self._async().post(
                    f"/v1/tools/{name}/calls",
                    params={"run_id": run_id, **self._placed},
                    json=body,
                    headers={"Idempotency-Key": key},
                )
                break
            except httpx.TransportError:
                if attempt == self.retries:
                    raise
        return _result(answer, ids)

    async def submit(self, action_id: str, payload: Any, ids: dict[str, str]) -> Data:
        answer = await self._async().post(
            f"/v1/actions/{action_id}/submit", json=to_jsonable_python(payload)
        )
        return _result(answer, ids)

    async def cancel(self, action_id: str, reason: str, ids: dict[str, str]) -> Data:
        answer = await self._async().post(
            f"/v1/actions/{action_id}/cancel", json={"reason": reason}
        )
        return _result(answer, ids)

    async def fail(self, action_id: str, error: str, ids: dict[str, str]) -> Data:
        answer = await self._async().post(f"/v1/actions/{action_id}/fail", json={"error": error})
        return _result(answer, ids)

    def pending(self, run_id: str | None) -> list[Data]:
        found: list[Data] = []
        params = {"limit": str(MAX_PAGE_SIZE)} | ({} if run_id is None else {"run_id": run_id})
        while True:  # every page
            answer = self._blocking().get("/v1/actions", params=params)
            body = _body(answer)
            if answer.status_code != 200:
                raise _refused(answer.status_code, body)
            found += body["actions"]
            if not body.get("next"):
                return found
            params["cursor"] = body["next"]

    async def pending_page(
        self, run_id: str | None, limit: int | None, cursor: str | None
    ) -> tuple[list[Data], str | None]:
        params = {"run_id": run_id, "limit": None if limit is None else str(limit)}
        params["cursor"] = cursor
        asked = {key: value for key, value in params.items() if value is not None}
        answer = await self._async().get("/v1/actions", params=asked)
        body = _body(answer)
        if answer.status_code != 200:
            raise _refused(answer.status_code, body)
        return list(body["actions"]), body.get("next")

    def data(self, call_id: str) -> dict[str, list[dict[str, JsonValue]]]:
        answer = self._blocking().get(f"/v1/calls/{call_id}")
        body = _body(answer)
        if answer.status_code == 404:
            return {}
        if answer.status_code != 200:
            raise _refused(answer.status_code, body)
        return dict(body.get("data", {}))

    async def suspensions(self, call_id: str) -> list[Data]:
        answer = await self._async().get(f"/v1/calls/{call_id}")
        body = _body(answer)
        if answer.status_code == 404:
            return []
        if answer.status_code != 200:
            raise _refused(answer.status_code, body)
        return list(body.get("suspensions", []))

    async def run_context(self, run_id: str) -> dict[str, JsonValue]:
        answer = await self._async().get(f"/v1/runs/{run_id}/context")
        body = _body(answer)
        if answer.status_code != 200:
            raise _refused(answer.status_code, body)
        context = body.get("context")
        return dict(context) if isinstance(context, dict) else {}

    async def read_file(self, file_id: str) -> FileBody:
        answer = await self._async().get(f"/v1/files/{file_id}")
        if answer.status_code == 404 and _body(answer).get("code") == "UNKNOWN_FILE":
            raise UnknownFile(file_id)
        if answer.status_code != 200:
            raise _refused(answer.status_code, _body(answer))
        content = answer.content
        digest = hashlib.sha256(content).hexdigest()
        if answer.headers.get("etag", "").strip('"') != digest:
            raise RemoteRefused(200, "BAD_RESPONSE", f"file {file_id}: the content is not whole")
        disposition = answer.headers.get("content-disposition", "")
        _, _, quoted = disposition.partition("filename*=UTF-8''")
        saved = SavedFile(
            file_id,
            unquote(quoted),
            answer.headers.get("content-type", "application/octet-stream"),
            len(content),
            digest,
            answer.headers.get("x-file-created-at", ""),
        )
        return FileBody(saved, content)

    async def events(self, run_id: str, after: int | None) -> AsyncIterator[RunEvent]:
        """The run's Server-Sent Events, parsed, until the iterator is closed or the server
        ends the stream."""
        headers = {} if after is None else {"Last-Event-ID": str(after)}
        timeout = httpx.Timeout(self._timeout, read=None)  # a quiet run sends keep-alives only
        async with self._async().stream(
            "GET", f"/v1/runs/{run_id}/events", headers=headers, timeout=timeout
        ) as answer:
            if answer.status_code != 200:
                await answer.aread()
                raise _refused(answer.status_code, _body(answer))
            data: list[str] = []
            async for line in answer.aiter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                elif not line and data:
                    yield RunEvent.model_validate(json.loads("\n".join(data)))
                    data = []


def _body(answer: httpx.Response) -> Any:
    try:
        return answer.json()
    except ValueError:
        return {"code": "BAD_RESPONSE", "message": f"the server answered {answer.status_code}"}


def _refused(status: int, body: Any) -> RemoteRefused:
    code = str(body.get("code", "UNKNOWN")) if isinstance(body, dict) else "UNKNOWN"
    message = str(body.get("message", "")) if isinstance(body, dict) else ""
    return RemoteRefused(status, code, message)


def _result(answer: httpx.Response, ids: dict[str, str]) -> Data:
    """The answer to a call or a submit as result DTO fields: a tool's error codes are results
    (CallError); codes only the HTTP layer has are ``RemoteRefused``."""
    body = _body(answer)
    if not isinstance(body, dict):
        raise RemoteRefused(answer.status_code, "BAD_RESPONSE", "the answer is not an object")
    if answer.is_success and "status" in body:
        return body
    code = body.get("code")
    if code in _CODES:
        return {
            "status": "error",
            "call_id": body.get("call_id", ids["call_id"]),
            "run_id": body.get("run_id", ids["run_id"]),
            "code": code,
            "message": str(body.get("message", "")),
            "metadata": body.get("metadata"),
            "effects": body.get("effects") or [],
        }
    raise _refused(answer.status_code, body)
