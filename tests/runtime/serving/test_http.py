"""The HTTP API: every route in process (httpx over ASGI) and over uvicorn on 127.0.0.1;
tenants kept apart; refused requests write nothing; one execution per idempotency key."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_support import (
    ALICE,
    BOB,
    CAROL,
    REFUND,
    ROOT,
    TOKENS,
    authenticate,
    process_env,
    runtime_of,
    serving,
    snapshot,
)

from blade_runtime.core.caller import CallContext
from blade_runtime.core.results import ErrorCode
from blade_runtime.core.store import Store
from blade_runtime.runtime import Runtime
from blade_runtime.serving.http import STATUS, HttpError, create_app
from blade_runtime.stores.memory import MemoryStore
from blade_runtime.stores.sqlite import SQLiteStore
from blade_runtime.stores.urls import open_store

MODES = ["asgi", "uvicorn"]


@contextlib.asynccontextmanager
async def client_for(app: Any, mode: str) -> AsyncIterator[httpx.AsyncClient]:
    if mode == "asgi":
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            yield client
    else:
        with serving(app) as server:
            async with httpx.AsyncClient(base_url=server.url) as client:
                yield client


async def sse(app: Any, path: str, headers: dict[str, str], count: int) -> list[dict[str, Any]]:
    """Read ``count`` Server-Sent Events of ``path`` from the ASGI app, then disconnect."""
    body = bytearray()
    status: list[int] = []
    done = asyncio.Event()
    disconnect = asyncio.Event()
    raw_path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": raw_path,
        "raw_path": raw_path.encode(),
        "query_string": query.encode(),
        "headers": [
            (b"host", b"127.0.0.1"),
            *((k.lower().encode(), v.encode()) for k, v in headers.items()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }

    async def receive() -> dict[str, Any]:
        if not scope.get("_sent"):
            scope["_sent"] = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif message["type"] == "http.response.body":
            body.extend(message.get("body", b""))
            if body.count(b"\ndata: ") >= count or not message.get("more_body"):
                done.set()

    task = asyncio.ensure_future(app(scope, receive, send))
    try:
        await asyncio.wait_for(done.wait(), 10)
    finally:
        disconnect.set()
        await asyncio.wait_for(task, 10)
    if status[0] != 200:
        return [{"status": status[0], **json.loads(bytes(body))}]
    events = []
    for block in bytes(body).decode().split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and line[0] != ":"
        )
        if "data" in fields:
            events.append(
                {"id": fields.get("id"), "event": fields["event"], **json.loads(fields["data"])}
            )
    return events


@pytest.fixture
def sqlite_store(tmp_path: Path, example_package: Any) -> Iterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "api.db")
    yield store
    store.close()


# every route and every refusal on each durable store; PostgreSQL in process only (its server
# is the tests' private cluster, tests/postgres.py)
STORES = [("asgi", "sqlite"), ("uvicorn", "sqlite"), ("asgi", "postgres")]


def durable_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """The store of a test, closed at its end (a PostgreSQL store left open keeps its pool's
    and its listener's threads running in the test process)."""
    request.getfixturevalue("example_package")
    if kind == "postgres":
        store: Store = open_store(request.getfixturevalue("postgres_url"))
    else:
        store = SQLiteStore(tmp_path / "api.db")
    request.addfinalizer(store.close)
    return store


def test_every_error_code_has_one_status() -> None:
    for code in ErrorCode:
        assert code in STATUS, f"{code} has no HTTP status"
    assert STATUS[ErrorCode.INVALID_SUBMISSION] == 422
    assert STATUS[ErrorCode.UNKNOWN_ACTION] == 404
    assert STATUS[ErrorCode.ACTION_ALREADY_RESOLVED] == 409
    assert STATUS[HttpError.UNAUTHENTICATED] == 401
    assert STATUS[HttpError.BODY_TOO_LARGE] == 413


@pytest.mark.parametrize(("mode", "store_kind"), STORES)
def test_every_route(
    mode: str, store_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    runtime, tools = runtime_of(durable_store(store_kind, request, tmp_path))
    app = create_app(runtime, authenticate=authenticate)

    async def scenario() -> None:
        async with client_for(app, mode) as http:
            listed = (await http.get("/v1/tools", headers=ALICE)).json()["tools"]
            assert {t["name"] for t in listed} == {
                "lookup_customer",
                "refund_payment",
                "check_page",
            }

            # a call, and its retry under the same key: one execution, the same answer
            key = {**ALICE, "Idempotency-Key": "lookup-1"}
            first = await http.post(
                "/v1/tools/lookup_customer/calls?run_id=r1",
                json={"customer_id": "cus_1"},
                headers=key,
            )
            again = await http.post(
                "/v1/tools/lookup_customer/calls?run_id=r1",
                json={"customer_id": "cus_1"},
                headers=key,
            )
            assert first.status_code == again.status_code == 200
            assert first.json() == again.json()
            assert first.json()["output"] == {"found": False}
            assert first.json()["call_id"] == "lookup-1"
            assert tools.lookups == 1
            invalid = await http.post(
                "/v1/tools/lookup_customer/calls", json={"customer_id": 7}, headers=ALICE
            )
            assert invalid.status_code == 422 and invalid.json()["code"] == "INVALID_INPUT"
            unknown = await http.post("/v1/tools/nope/calls", json={}, headers=ALICE)
            assert unknown.status_code == 404
            assert unknown.json()["code"] == "TOOL_HANDLER_NOT_FOUND"

            # a suspension: listed, read, refused an invalid payload, resumed by a valid one
            waiting = await http.post(
                "/v1/tools/refund_payment/calls?run_id=r1", json=REFUND, headers=ALICE
            )
            assert waiting.status_code == 202, waiting.text
            action = waiting.json()["action"]
            assert action["kind"] == "payments.refund-payment.v1#approval"
            assert action["input"]["prompt"] == "Refund 1250?"
            assert action["submit_schema"]["required"] == ["approved", "approver"]
            action_id = action["action_id"]
            pending = (await http.get("/v1/actions?run_id=r1", headers=ALICE)).json()["actions"]
            assert [a["action_id"] for a in pending] == [action_id]
            by_tool = await http.get("/v1/actions?tool=check_page", headers=ALICE)
            assert by_tool.json()["actions"] == []
            one = await http.get(f"/v1/actions/{action_id}", headers=ALICE)
            assert one.json()["state"] == "pending"
            call = (await http.get(f"/v1/calls/{action['call_id']}", headers=ALICE)).json()
            assert call["state"] == "suspended" and call["input"] == REFUND
            calls = (await http.get("/v1/runs/r1/calls", headers=ALICE)).json()["calls"]
            assert {c["name"] for c in calls} >= {"refund_payment"}

            bad = await http.post(
                f"/v1/actions/{action_id}/submit", json={"approved": "yes"}, headers=ALICE
            )
            assert bad.status_code == 422 and bad.json()["code"] == "INVALID_SUBMISSION"
            assert set(bad.json()) == {"code", "message"}
            assert runtime.store.action(action_id).state == "pending"  # type: ignore[union-attr]
            done = await http.post(
                f"/v1/tools/refund_payment/points/approval/submit/{action_id}",
                json={"approved": True, "approver": "ann"},
                headers=ALICE,
            )
            assert done.status_code == 200, done.text
            assert done.json()["output"] == {"status": "refunded", "refund_id": "re_1"}
            twice = await http.post(
                f"/v1/actions/{action_id}/submit",
                json={"approved": True, "approver": "ann"},
                headers=ALICE,
            )
            assert twice.status_code == 409 and twice.json()["code"] == "ACTION_ALREADY_RESOLVED"
            resolved = await http.get("/v1/actions?state=submitted", headers=ALICE)
            assert [a["action_id"] for a in resolved.json()["actions"]] == [action_id]

            # cancel and fail
            second = await http.post("/v1/tools/refund_payment/calls", json=REFUND, headers=ALICE)
            second_id = second.json()["action"]["action_id"]
            cancelled = await http.post(
                f"/v1/actions/{second_id}/cancel", json={"reason": "duplicate"}, headers=ALICE
            )
            assert cancelled.status_code == 200 and cancelled.json()["code"] == "CANCELLED"
            again_cancel = await http.post(  # no body: declared JSON, it is {} (no reason)
                f"/v1/actions/{second_id}/cancel",
                headers={**ALICE, "Content-Type": "application/json"},
            )
            assert again_cancel.status_code == 409
            page = await http.post(
                "/v1/tools/check_page/calls", json={"url": "https://example.com"}, headers=ALICE
            )
            assert page.status_code == 202
            page_id = page.json()["action"]["action_id"]
            failed = await http.post(
                f"/v1/actions/{page_id}/fail", json={"error": "browser down"}, headers=ALICE
            )
            assert failed.json()["code"] == "TOOL_FAILED"
            assert failed.json()["message"] == "browser down"
            third = await http.post(
                "/v1/tools/check_page/calls", json={"url": "https://example.com"}, headers=ALICE
            )
            third_id = third.json()["action"]["action_id"]
            output = await http.post(
                f"/v1/tools/check_page/output/submit/{third_id}",
                json={"status_code": 200, "title": "Example"},
                headers=ALICE,
            )
            assert output.status_code == 200
            assert output.json()["output"] == {"status_code": 200, "title": "Example"}
            wrong_route = await http.post(
                f"/v1/tools/refund_payment/points/approval/submit/{page_id}",
                json={"approved": True, "approver": "x"},
                headers=ALICE,
            )
            assert wrong_route.status_code == 404

            document = (await http.get("/v1/openapi.json", headers=ALICE)).json()
            schemas = document["components"]["schemas"]
            call_route = document["paths"]["/v1/tools/refund_payment/calls"]["post"]
            body = call_route["requestBody"]["content"]["application/json"]["schema"]
            assert schemas[body["$ref"].rsplit("/", 1)[1]]["required"] == [
                "payment_id",
                "amount",
                "reason",
            ]
            submit_route = document["paths"][
                "/v1/tools/refund_payment/points/approval/submit/{action_id}"
            ]["post"]
            ref = submit_route["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert schemas[ref.rsplit("/", 1)[1]]["properties"]["approved"] == {"type": "boolean"}
            assert _refs_resolve(document)

    asyncio.run(scenario())

    async def events() -> None:
        got = await sse(app, "/v1/runs/r1/events?after=0", ALICE, 6)
        kinds = [e["event"] for e in got]
        assert kinds == ["started", "result", "started", "suspended", "resumed", "result"], kinds
        assert all(e["run_id"] == "r1" for e in got)
        first = int(got[0]["id"])
        resumed = await sse(app, "/v1/runs/r1/events", {**ALICE, "Last-Event-ID": str(first)}, 1)
        assert int(resumed[0]["id"]) > first
        assert resumed[0]["seq"] == got[1]["seq"]

    asyncio.run(events())


def _refs_resolve(document: dict[str, Any]) -> bool:
    """Every $ref of the document points at something in it."""

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                target: Any = document
                for part in ref[2:].split("/"):
                    target = target[part.replace("~1", "/").replace("~0", "~")]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    return True


@pytest.mark.parametrize("mode", MODES)
def test_events_stream_live_over_uvicorn_and_in_process(
    mode: str, sqlite_store: SQLiteStore
) -> None:
    """A subscriber sees events committed after it connected (in process: the ASGI app; over
    uvicorn: a real streaming response)."""
    runtime, _ = runtime_of(sqlite_store)
    app = create_app(runtime, authenticate=authenticate)

    async def scenario() -> list[str]:
        async with client_for(app, mode) as http:
            await http.post(
                "/v1/tools/refund_payment/calls?run_id=live", json=REFUND, headers=ALICE
            )
            if mode == "asgi":
                got = await sse(app, "/v1/runs/live/events?after=0", ALICE, 2)
                return [e["event"] for e in got]
            kinds: list[str] = []
            async with http.stream("GET", "/v1/runs/live/events?after=0", headers=ALICE) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                posted = False
                async for line in r.aiter_lines():
                    if line.startswith("event: "):
                        kinds.append(line[7:])
                    if len(kinds) == 2 and not posted:
                        posted = True
                        actions = (await http.get("/v1/actions", headers=ALICE)).json()["actions"]
                        await http.post(
                            f"/v1/actions/{actions[0]['action_id']}/submit",
                            json={"approved": False, "approver": "z"},
                            headers=ALICE,
                        )
                    if "result" in kinds:
                        break
            return kinds

    kinds = asyncio.run(scenario())
    assert kinds[:2] == ["started", "suspended"]
    if mode == "uvicorn":
        assert kinds[-2:] == ["resumed", "result"] or kinds[-1] == "result"


@pytest.mark.parametrize(("mode", "store_kind"), STORES)
def test_refused_requests_answer_as_specified_and_write_nothing(
    mode: str, store_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    runtime, tools = runtime_of(durable_store(store_kind, request, tmp_path))
    app = create_app(runtime, authenticate=authenticate, max_body_bytes=2000)

    async def scenario() -> None:
        async with client_for(app, mode) as http:
            waiting = await http.post(
                "/v1/tools/refund_payment/calls?run_id=alice-run",
                json=REFUND,
                headers={**ALICE, "Idempotency-Key": "alice-key"},
            )
            action = waiting.json()["action"]
            action_id, call_id = action["action_id"], action["call_id"]
            before = snapshot(runtime.store)
            entries = tools.refund_entries
            approve = {"approved": True, "approver": "mallory"}

            async def refused(method: str, path: str, code: str, status: int, **kw: Any) -> None:
                answer = await http.request(method, path, **kw)
                assert answer.status_code == status, (path, answer.text)
                assert answer.json()["code"] == code, (path, answer.text)
                assert set(answer.json()) == {"code", "message"}
                assert "\n" not in answer.json()["message"]
                assert "token-" not in answer.text
                assert snapshot(runtime.store) == before, path

            for headers in ({}, {"Authorization": "Bearer token-wrong"}, {"Authorization": "x"}):
                for method, path in (
                    ("POST", "/v1/tools/lookup_customer/calls"),
                    ("GET", f"/v1/actions/{action_id}"),
                    ("GET", "/v1/actions"),
                    ("POST", f"/v1/actions/{action_id}/submit"),
                    ("POST", f"/v1/actions/{action_id}/cancel"),
                    ("POST", f"/v1/actions/{action_id}/fail"),
                    ("GET", f"/v1/calls/{call_id}"),
                    ("GET", "/v1/runs/alice-run/calls"),
                    ("GET", "/v1/runs/alice-run/events"),
                    ("GET", "/v1/tools"),
                ):
                    await refused(
                        method, path, "UNAUTHENTICATED", 401, headers=headers, json=approve
                    )

            # another tenant: alice's records do not exist for bob
            await refused("GET", f"/v1/actions/{action_id}", "UNKNOWN_ACTION", 404, headers=BOB)
            await refused(
                "POST",
                f"/v1/actions/{action_id}/submit",
                "UNKNOWN_ACTION",
                404,
                headers=BOB,
                json=approve,
            )
            await refused(
                "POST",
                f"/v1/tools/refund_payment/points/approval/submit/{action_id}",
                "UNKNOWN_ACTION",
                404,
                headers=BOB,
                json=approve,
            )
            await refused(
                "POST",
                f"/v1/actions/{action_id}/cancel",
                "UNKNOWN_ACTION",
                404,
                headers=BOB,
                json={},
            )
            await refused(
                "POST",
                f"/v1/actions/{action_id}/fail",
                "UNKNOWN_ACTION",
                404,
                headers=BOB,
                json={"error": "no"},
            )
            await refused("GET", f"/v1/calls/{call_id}", "UNKNOWN_CALL", 404, headers=BOB)
            await refused("GET", "/v1/runs/alice-run/events", "UNKNOWN_RUN", 404, headers=BOB)
            await refused(
                "POST",
                "/v1/tools/refund_payment/calls",
                "IDEMPOTENCY_CONFLICT",
                409,
                headers={**BOB, "Idempotency-Key": "alice-key"},
                json=REFUND,
            )
            bobs = await http.get("/v1/actions", headers=BOB)
            assert bobs.json() == {"actions": [], "next": None}
            calls = await http.get("/v1/runs/alice-run/calls", headers=BOB)
            assert calls.json() == {"calls": [], "next": None}

            # bodies: too large, not JSON, not UTF-8; routes that do not exist
            big = {"approved": True, "approver": "x" * 5000}
            await refused(
                "POST",
                f"/v1/actions/{action_id}/submit",
                "BODY_TOO_LARGE",
                413,
                headers=ALICE,
                json=big,
            )
            await refused(
                "POST",
                "/v1/tools/lookup_customer/calls",
                "BODY_TOO_LARGE",
                413,
                headers={**ALICE, "Content-Type": "application/json"},
                content=b"{" + b" " * 3000 + b"}",
            )
            for raw in (b'{"approved": tru', b"\xff\xfe", b"[NaN]", b'{"a": 1} x'):
                await refused(
                    "POST",
                    f"/v1/actions/{action_id}/submit",
                    "MALFORMED_REQUEST",
                    400,
                    headers={**ALICE, "Content-Type": "application/json"},
                    content=raw,
                )
            await refused(
                "POST",
                f"/v1/actions/{action_id}/submit",
                "UNSUPPORTED_MEDIA_TYPE",
                415,
                headers={**ALICE, "Content-Type": "text/plain"},
                content=b"{}",
            )
            await refused(
                "POST",
                "/v1/tools/lookup_customer/calls",
                "UNSUPPORTED_MEDIA_TYPE",
                415,
                headers=ALICE,
                content=b"{}",
            )
            await refused("GET", "/v1/nothing", "NOT_FOUND", 404, headers=ALICE)
            await refused("GET", "/elsewhere", "NOT_FOUND", 404)
            await refused(
                "DELETE", f"/v1/actions/{action_id}", "METHOD_NOT_ALLOWED", 405, headers=ALICE
            )
            assert tools.refund_entries == entries

            # the operator sees every tenant
            seen = await http.get(f"/v1/actions/{action_id}", headers=ROOT)
            assert seen.status_code == 200
            every = (await http.get("/v1/actions", headers=ROOT)).json()["actions"]
            assert [a["action_id"] for a in every] == [action_id]
            assert (await http.get(f"/v1/calls/{call_id}", headers=ROOT)).status_code == 200
            stored = runtime.store.call(call_id)
            assert stored is not None and stored.tenant == "acme"
            record = runtime.store.action(action_id)
            assert record is not None and record.tenant == "acme"

    asyncio.run(scenario())


def test_another_tenants_events_are_left_out_of_a_shared_run(sqlite_store: SQLiteStore) -> None:
    runtime, _ = runtime_of(sqlite_store)
    app = create_app(runtime, authenticate=authenticate)

    async def scenario() -> list[dict[str, Any]]:
        async with client_for(app, "asgi") as http:
            await http.post(
                "/v1/tools/refund_payment/calls?run_id=shared", json=REFUND, headers=BOB
            )
            await http.post(
                "/v1/tools/check_page/calls?run_id=shared",
                json={"url": "https://a.example"},
                headers=ALICE,
            )
        return await sse(app, "/v1/runs/shared/events?after=0", ALICE, 1)

    got = asyncio.run(scenario())
    assert [e["event"] for e in got] == ["pending"]
    mine = runtime.store.calls(tenant="acme")
    assert {e["call_id"] for e in got} == {c.call_id for c in mine}


@pytest.mark.parametrize("store_kind", ["memory", "sqlite", "postgres"])
def test_a_listing_of_actions_holds_only_the_principal_s_own_within_its_tenant(
    store_kind: str, request: pytest.FixtureRequest, tmp_path: Path, example_package: Any
) -> None:
    """Carol shares alice's tenant: she reads none of alice's actions, one by one or listed
    (the listing once held them, prompt and principal included); an operator lists them, and
    the runtime's own listings for a principal agree."""
    store = (
        MemoryStore() if store_kind == "memory" else durable_store(store_kind, request, tmp_path)
    )
    runtime, _ = runtime_of(store)
    app = create_app(runtime, authenticate=authenticate, allow_anonymous=False)

    async def scenario() -> None:
        async with client_for(app, "asgi") as http:
            mine = await http.post("/v1/tools/refund_payment/calls", json=REFUND, headers=ALICE)
            assert mine.status_code == 202, mine.text
            action_id = mine.json()["action"]["action_id"]
            listed = (await http.get("/v1/actions", headers=CAROL)).json()["actions"]
            assert listed == []
            one = await http.get(f"/v1/actions/{action_id}", headers=CAROL)
            assert one.status_code == 404
            assert [
                a["action_id"]
                for a in (await http.get("/v1/actions", headers=ALICE)).json()["actions"]
            ] == [action_id]
            root = (await http.get("/v1/actions", headers=ROOT)).json()["actions"]
            assert [a["action_id"] for a in root] == [action_id]
        carol, alice = TOKENS["token-carol"], TOKENS["token-alice"]
        assert await runtime.records.actions(principal=carol) == []
        assert runtime.pending(principal=carol) == []
        assert [a.action_id for a in runtime.pending(principal=alice)] == [action_id]

    asyncio.run(scenario())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
def test_the_same_idempotency_key_twice_at_once_runs_once(
    mode: str, store_kind: str, tmp_path: Path, example_package: Any
) -> None:
    store = MemoryStore() if store_kind == "memory" else SQLiteStore(tmp_path / "s.db")
    runtime, tools = runtime_of(store)
    tools.delay_s = 0.2
    app = create_app(runtime, authenticate=authenticate)

    async def scenario() -> list[httpx.Response]:
        async with client_for(app, mode) as http:
            headers = {**ALICE, "Idempotency-Key": "same"}

            def post() -> Any:
                return http.post(
                    "/v1/tools/lookup_customer/calls",
                    json={"customer_id": "cus_9"},
                    headers=headers,
                )

            answers = list(await asyncio.gather(post(), post(), post()))
            answers.append(await post())
            other = await http.post(
                "/v1/tools/lookup_customer/calls", json={"customer_id": "cus_8"}, headers=headers
            )
            assert other.status_code == 409 and other.json()["code"] == "IDEMPOTENCY_CONFLICT"
            return answers

    answers = asyncio.run(scenario())
    assert tools.lookups == 1
    assert {a.status_code for a in answers} == {200}
    assert all(a.json() == answers[0].json() for a in answers)


def test_a_retry_in_another_server_process_of_a_call_returns_its_stored_result(
    tmp_path: Path, example_package: Any
) -> None:
    """Two apps (as two server processes) on one SQLite store: the second answers a retry of a
    call the first ran from the store, without running the tool."""
    path = tmp_path / "shared.db"
    first, first_tools = runtime_of(SQLiteStore(path))
    second, second_tools = runtime_of(SQLiteStore(path))
    apps = [create_app(r, authenticate=authenticate) for r in (first, second)]

    async def scenario() -> list[httpx.Response]:
        answers = []
        for app in apps:
            async with client_for(app, "asgi") as http:
                answers.append(
                    await http.post(
                        "/v1/tools/refund_payment/calls",
                        json=REFUND,
                        headers={**ALICE, "Idempotency-Key": "refund-7"},
                    )
                )
        return answers

    answers = asyncio.run(scenario())
    assert [a.status_code for a in answers] == [202, 202]
    assert answers[0].json() == answers[1].json()
    assert first_tools.refund_entries == 1 and second_tools.refund_entries == 0


def test_anonymous_access_only_on_loopback(example_package: Any) -> None:
    runtime, _ = runtime_of()
    app = create_app(
        runtime,
        authenticate=lambda request: None,
        allow_anonymous=True,
        allowed_hosts=["api.example.com"],
    )
    closed = create_app(runtime, authenticate=lambda request: None)

    async def scenario() -> tuple[int, int, int]:
        local = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
        async with httpx.AsyncClient(transport=local, base_url="http://127.0.0.1") as http:
            ok = (await http.get("/v1/actions")).status_code
            proxied = await http.get("/v1/actions", headers={"X-Forwarded-For": "203.0.113.9"})
            assert proxied.status_code == 403, proxied.text
        async with httpx.AsyncClient(transport=local, base_url="http://api.example.com") as http:
            remote = await http.get("/v1/actions")
            assert remote.json()["code"] == "ANONYMOUS_REFUSED"
        shut = httpx.ASGITransport(app=closed, client=("127.0.0.1", 1))
        async with httpx.AsyncClient(transport=shut, base_url="http://127.0.0.1") as http:
            refused = (await http.get("/v1/actions")).status_code
        return ok, remote.status_code, refused

    assert asyncio.run(scenario()) == (200, 403, 401)


def test_the_openapi_document_follows_another_tool_registered_in_place_of_one(
    example_package: Any,
) -> None:
    """The document is kept while the registrations stay as they are: as many tools, one of
    them another, is another document."""
    from blade_specs.deploy import deploy_service_v1 as deploy

    runtime, _ = runtime_of()
    app = create_app(runtime, authenticate=authenticate)

    async def paths() -> set[str]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return set((await http.get("/v1/openapi.json", headers=ALICE)).json()["paths"])

    before = asyncio.run(paths())
    assert "/v1/tools/lookup_customer/calls" in before

    async def deploys(ctx: Any) -> Any:
        raise AssertionError("not called")

    runtime.unregister("lookup_customer")
    runtime.register(deploy.SPEC, deploys)
    after = asyncio.run(paths())
    assert "/v1/tools/deploy_service/calls" in after
    assert "/v1/tools/lookup_customer/calls" not in after


def test_authenticate_may_be_async_and_its_failure_says_nothing_of_it(example_package: Any) -> None:
    runtime, _ = runtime_of()

    async def slow(request: Any) -> Any:
        await asyncio.sleep(0)
        return authenticate(request)

    def broken(request: Any) -> Any:
        raise RuntimeError("secret-token-xyz leaked")

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        answers = []
        for fn in (slow, broken):
            app = create_app(runtime, authenticate=fn)
            async with client_for(app, "asgi") as http:
                answers.append(await http.get("/v1/actions", headers=ALICE))
        return answers[0], answers[1]

    good, bad = asyncio.run(scenario())
    assert good.status_code == 200
    assert bad.status_code == 500 and "secret" not in bad.text
    with pytest.raises(TypeError):
        create_app(Runtime(), authenticate=None)  # type: ignore[arg-type]


# -- blade-runtime serve ---------------------------------------------------------------------

SERVED = """
import os

from blade_runtime.runtime import Runtime
from http_support import Tools, authenticate


def factory(store):
    runtime = Runtime(store=store)
    tools = Tools()
    tools.delay_s = float(os.environ.get("LOOKUP_DELAY_S", "0"))
    tools.register(runtime)
    return runtime
"""


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serve_runs_the_api_and_recovery_and_stops_cleanly_on_sigterm(
    tmp_path: Path, built_examples: Path
) -> None:
    import signal
    import subprocess
    import sys
    import threading
    import time

    bin_dir = Path(sys.executable).parent
    (tmp_path / "served.py").write_text(SERVED)
    db = tmp_path / "served.db"
    SQLiteStore(db).close()
    port = _free_port()
    env = process_env(built_examples, LOOKUP_DELAY_S="1.5")
    command = [str(bin_dir / "blade-runtime"), "serve", "served:factory"]
    process = subprocess.Popen(
        [
            *command,
            "--store",
            f"sqlite:///{db}",
            "--port",
            str(port),
            "--auth",
            "served:authenticate",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=10) as http:
            deadline = time.monotonic() + 20
            while True:
                try:
                    if http.get("/v1/tools", headers=ALICE).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert process.poll() is None and time.monotonic() < deadline, "no server"
                time.sleep(0.1)
            waiting = http.post(
                "/v1/tools/refund_payment/calls?run_id=s", json=REFUND, headers=ALICE
            )
            assert waiting.status_code == 202
            action = waiting.json()["action"]
            # an operator resolves it from elsewhere; the server's recovery loop resumes it
            submitted = subprocess.run(
                [
                    str(bin_dir / "blade-runtime"),
                    "pending",
                    "submit",
                    action["action_id"],
                    '{"approved": true, "approver": "ops"}',
                    "--store",
                    f"sqlite:///{db}",
                ],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            assert submitted.returncode == 0, submitted.stderr
            deadline = time.monotonic() + 10
            while True:
                call = http.get(f"/v1/calls/{action['call_id']}", headers=ALICE).json()
                if call["state"] == "settled":
                    break
                assert time.monotonic() < deadline, call
                time.sleep(0.1)
            assert call["result"]["content"] == {"status": "refunded", "refund_id": "re_1"}
            left = http.post("/v1/tools/refund_payment/calls?run_id=s", json=REFUND, headers=ALICE)
            assert left.status_code == 202

            streamed: list[str] = []

            def listen() -> None:
                with (
                    contextlib.suppress(httpx.HTTPError),
                    httpx.stream(
                        "GET", f"{base}/v1/runs/s/events?after=0", headers=ALICE, timeout=30
                    ) as stream,
                ):
                    for line in stream.iter_lines():
                        streamed.append(line)

            listener = threading.Thread(target=listen, daemon=True)
            listener.start()
            deadline = time.monotonic() + 10
            while not any(line.startswith("event: ") for line in streamed):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            # a call in flight when SIGTERM arrives is finished, answered and recorded
            slow: list[httpx.Response] = []

            def call_slowly() -> None:
                slow.append(
                    httpx.post(
                        f"{base}/v1/tools/lookup_customer/calls",
                        json={"customer_id": "cus_1"},
                        headers={**ALICE, "Idempotency-Key": "slow-1"},
                        timeout=30,
                    )
                )

            caller = threading.Thread(target=call_slowly, daemon=True)
            caller.start()
            time.sleep(0.5)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        caller.join(10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert time.monotonic() - started < 15
    assert "Traceback" not in stderr and "token-" not in stderr
    assert "blade-runtime stopped" in stderr
    listener.join(10)
    assert [r.status_code for r in slow] == [200], stderr
    assert slow[0].json()["output"] == {"found": False}
    store = SQLiteStore(db)
    try:
        assert store.call("slow-1").state == "settled"  # type: ignore[union-attr]
        assert [a.action_id for a in store.actions()] == [left.json()["action"]["action_id"]]
        assert store.call(action["call_id"]).state == "settled"  # type: ignore[union-attr]
    finally:
        store.close()


def test_serve_refuses_what_it_cannot_serve_safely(tmp_path: Path) -> None:
    from blade_runtime.serving.cli import main

    db = tmp_path / "s.db"
    SQLiteStore(db).close()
    store = f"sqlite:///{db}"
    assert main(["serve", "x:y", "--store", store]) == 2  # no --auth
    assert main(["serve", "x:y", "--store", store, "--allow-anonymous", "--host", "0.0.0.0"]) == 2
    assert main(["serve", "nosuchmodule:y", "--store", store, "--allow-anonymous"]) == 2
    assert (
        main(["serve", "x:y", "--store", str(tmp_path / "no" / "s.db"), "--allow-anonymous"]) == 3
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
def test_a_calls_data_by_channel_and_an_unrecorded_call_read_back(
    mode: str, store_kind: str, tmp_path: Path, example_package: Any
) -> None:
    from blade_specs.deploy import deploy_service_v1 as deploy

    store = MemoryStore() if store_kind == "memory" else SQLiteStore(tmp_path / "d.db")
    runtime, tools = runtime_of(store)

    async def impl(ctx: Any) -> Any:
        progress = deploy.DeployServiceProgressData
        await ctx.data.write("progress", progress(step="build", status="done"), id="build")
        await ctx.data.write("progress", progress(step="push", status="running"), id="push")
        await ctx.data.write("log", deploy.DeployServiceLogData(line="pushed"))
        return deploy.DeployServiceOutput(deployed=True, steps=2)

    runtime.register(deploy.SPEC, impl)
    app = create_app(runtime, authenticate=authenticate)
    arguments = {"service": "api", "version": "v1.2.3", "environment": "staging"}

    async def scenario() -> None:
        async with client_for(app, mode) as http:
            done = await http.post(
                "/v1/tools/deploy_service/calls?run_id=d",
                json=arguments,
                headers={**ALICE, "Idempotency-Key": "deploy-1"},
            )
            assert done.status_code == 200 and done.json()["output"]["steps"] == 2
            call = (await http.get("/v1/calls/deploy-1", headers=ALICE)).json()
            assert call["state"] == "settled" and call["input"] == arguments
            assert [i["id"] for i in call["data"]["progress"]] == ["build", "push"]
            assert [i["value"]["line"] for i in call["data"]["log"]] == ["pushed"]
            only = await http.get("/v1/calls/deploy-1?channel=progress", headers=ALICE)
            assert set(only.json()["data"]) == {"progress"}
            assert (await http.get("/v1/calls/deploy-1", headers=BOB)).status_code == 404
            # a pure call without data: the memory store keeps no record; the API still answers
            await http.post(
                "/v1/tools/lookup_customer/calls",
                json={"customer_id": "cus_5"},
                headers={**ALICE, "Idempotency-Key": "look-5"},
            )
            read = await http.get("/v1/calls/look-5", headers=ALICE)
            assert read.status_code == 200, read.text
            body = read.json()
            assert body["state"] == "settled" and body["name"] == "lookup_customer"
            assert body["spec_id"] == "crm.lookup-customer.v1"
            assert body["result"] == {"status": "success", "content": {"found": False}}
            assert (await http.get("/v1/calls/look-5", headers=BOB)).status_code == 404

    asyncio.run(scenario())
    assert tools.lookups == 1


WORKER = """
import asyncio, sys
from blade_runtime.core.caller import CallContext
from blade_runtime.stores.sqlite import SQLiteStore
from http_support import REFUND, TOKENS, runtime_of

async def main():
    runtime, _ = runtime_of(SQLiteStore(sys.argv[1]))
    context = CallContext(principal=TOKENS["token-alice"])
    result = await runtime.call("refund_payment", REFUND, run_id="shared-run", context=context)
    await runtime.cancel(result.action.action_id, "from another process")
    await runtime.close()

asyncio.run(main())
"""


def test_a_runs_events_from_another_worker_process_reach_the_stream(
    tmp_path: Path, built_examples: Path, example_package: Any
) -> None:
    import subprocess
    import sys

    db = tmp_path / "shared.db"
    runtime, _ = runtime_of(SQLiteStore(db))
    app = create_app(runtime, authenticate=authenticate)
    (tmp_path / "worker.py").write_text(WORKER)
    env = process_env(built_examples)

    async def scenario() -> list[dict[str, Any]]:
        async with client_for(app, "asgi") as http:  # alice has a call in the run
            await http.post(
                "/v1/tools/check_page/calls?run_id=shared-run", json={"url": "x"}, headers=ALICE
            )
        first = await sse(app, "/v1/runs/shared-run/events?after=0", ALICE, 1)
        reading = asyncio.ensure_future(
            sse(app, f"/v1/runs/shared-run/events?after={first[-1]['id']}", ALICE, 3)
        )
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            str(tmp_path / "worker.py"),
            str(db),
            env=env,
            stderr=subprocess.PIPE,
        )
        _, stderr = await worker.communicate()
        assert worker.returncode == 0, stderr.decode()
        return await reading

    got = asyncio.run(scenario())
    assert [e["event"] for e in got] == ["started", "suspended", "result"]
    assert got[-1]["payload"]["code"] == "CANCELLED"
    assert all(e["call_id"] != "" for e in got)


def test_live_events_reach_whom_their_own_call_was_made_for(example_package: Any) -> None:
    """Every event carries its call's tenant and principal, stamped by the runtime from the
    call's own context: on the memory store a pure call leaves no record, yet its live events
    reach the principal it was made for (and operators), and never another principal's stream,
    whatever the run they share."""
    runtime, _ = runtime_of(MemoryStore())
    app = create_app(runtime, authenticate=authenticate)

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with client_for(app, "asgi") as http:
            lookup = "/v1/tools/lookup_customer/calls?run_id=m"
            refund = "/v1/tools/refund_payment/calls?run_id=m"
            await http.post(refund, json=REFUND, headers=ALICE)  # so that each may stream m
            await http.post(refund, json=REFUND, headers=BOB)
            alice = asyncio.ensure_future(sse(app, "/v1/runs/m/events", ALICE, 4))
            root = asyncio.ensure_future(sse(app, "/v1/runs/m/events", ROOT, 6))
            await asyncio.sleep(0.2)  # subscribed
            await http.post(lookup, json={"customer_id": "cus_3"}, headers=BOB)
            await http.post(
                lookup, json={"customer_id": "cus_4"}, headers={**ALICE, "Idempotency-Key": "a4"}
            )
            await http.post(refund, json=REFUND, headers={**BOB, "Idempotency-Key": "b5"})
            await http.post(refund, json=REFUND, headers={**ALICE, "Idempotency-Key": "a6"})
            return await alice, await root

    alice, root = asyncio.run(scenario())
    assert [(e["event"], e["call_id"]) for e in alice] == [
        ("started", "a4"),
        ("result", "a4"),
        ("started", "a6"),
        ("suspended", "a6"),
    ]  # nothing of Bob's calls before, between or after hers
    shown = [(e["event"], e["call_id"]) for e in root[:4]]
    assert shown[2:] == [("started", "a4"), ("result", "a4")] and shown[0][0] == "started"


def test_a_retry_never_runs_a_call_again_after_the_store_forgot_it(example_package: Any) -> None:
    runtime, tools = runtime_of(MemoryStore(keep_settled=0))
    app = create_app(runtime, authenticate=authenticate)

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with client_for(app, "asgi") as http:
            headers = {**ALICE, "Idempotency-Key": "refund-forgotten"}
            first = await http.post("/v1/tools/refund_payment/calls", json=REFUND, headers=headers)
            action_id = first.json()["action"]["action_id"]
            await http.post(
                f"/v1/actions/{action_id}/submit",
                json={"approved": True, "approver": "ann"},
                headers=ALICE,
            )
            assert runtime.store.call(first.json()["call_id"]) is None  # forgotten
            again = await http.post("/v1/tools/refund_payment/calls", json=REFUND, headers=headers)
            return first, again

    first, again = asyncio.run(scenario())
    assert tools.refund_entries == 2  # the call and its resume: no second call
    assert again.json()["call_id"] == first.json()["call_id"] == "refund-forgotten"


def test_a_key_another_tenant_sent_first_gives_it_nothing_of_the_call_made_with_it(
    tmp_path: Path, example_package: Any
) -> None:
    """Two API processes over one store: a key Alice sent to one of them for a call that was
    refused names, once Bob's call with that key runs on the other, only Bob's call. Alice's
    server answers 404 for it and her stream of the run carries none of its events (it once
    answered with Bob's ToolData, trusting its own record of the refused key)."""
    from blade_specs.deploy import deploy_service_v1 as deploy

    def server() -> tuple[Any, SQLiteStore]:
        store = SQLiteStore(tmp_path / "shared.db")
        runtime, _ = runtime_of(store)

        async def impl(ctx: Any) -> Any:
            secret = "db=hunter2" if ctx.input.service == "billing" else "-"  # Bob's call's
            await ctx.data.write("log", deploy.DeployServiceLogData(line=secret))
            return deploy.DeployServiceOutput(deployed=True, steps=1)

        runtime.register(deploy.SPEC, impl)
        return create_app(runtime, authenticate=authenticate), store

    (first, first_store), (second, second_store) = server(), server()
    key = "deploy-42"
    calls = "/v1/tools/deploy_service/calls?run_id=globex-run"
    ok = {"service": "billing", "version": "v9.0.0", "environment": "production"}

    async def scenario() -> list[dict[str, Any]]:
        async with client_for(first, "asgi") as alice_side, client_for(second, "asgi") as bob_side:
            refused = await alice_side.post(
                calls, json={}, headers={**ALICE, "Idempotency-Key": key}
            )
            assert refused.status_code == 422, refused.text
            made = await bob_side.post(calls, json=ok, headers={**BOB, "Idempotency-Key": key})
            assert made.status_code == 200, made.text
            bobs = await bob_side.get(f"/v1/calls/{key}", headers=BOB)
            assert "hunter2" in bobs.text  # the call has the data this test looks for
            read = await alice_side.get(f"/v1/calls/{key}", headers=ALICE)
            assert (read.status_code, read.json()["code"]) == (404, "UNKNOWN_CALL")
            assert "hunter2" not in read.text
            # Alice's own call in that run: her stream carries its events, and only those
            mine = await alice_side.post(calls, json={**ok, "service": "shop"}, headers=ALICE)
            assert mine.status_code == 200, mine.text
        return await sse(first, "/v1/runs/globex-run/events?after=0", ALICE, 3)

    try:
        got = asyncio.run(scenario())
    finally:
        first_store.close()
        second_store.close()
    assert got and {e["call_id"] for e in got} == {mine_id(first_store)}
    assert "hunter2" not in json.dumps(got)


def mine_id(store: Store) -> str:
    (call,) = store.calls(run_id="globex-run", tenant="acme")
    return call.call_id


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_hostile_bodies_paths_and_stream_positions_are_400_and_write_nothing(
    store_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Bodies nested past the parser's depth or holding a lone surrogate (valid JSON text
    that no UTF-8 store or response can carry), a NUL in a path, a query or a reason
    (PostgreSQL's text has none), and stream positions that are not sequence numbers: each a
    400 MALFORMED_REQUEST, none a 500, and the store as it was."""
    runtime, tools = runtime_of(durable_store(store_kind, request, tmp_path))
    app = create_app(runtime, authenticate=authenticate)
    json_body = {**ALICE, "Content-Type": "application/json"}
    deep = b"[" * 5000 + b"]" * 5000
    surrogate = json.dumps({**REFUND, "reason": "\ud800"}).encode()  # escaped: valid JSON

    async def scenario() -> None:
        async with client_for(app, "asgi") as http:
            waiting = await http.post("/v1/tools/refund_payment/calls", json=REFUND, headers=ALICE)
            action_id = waiting.json()["action"]["action_id"]
            before, entries = snapshot(runtime.store), tools.refund_entries
            hostile: list[tuple[str, str, dict[str, str], bytes | None]] = [
                ("POST", "/v1/tools/refund_payment/calls", json_body, deep),
                ("POST", f"/v1/actions/{action_id}/submit", json_body, deep),
                ("POST", f"/v1/actions/{action_id}/cancel", json_body, deep),
                ("POST", "/v1/tools/refund_payment/calls", json_body, surrogate),
                ("POST", f"/v1/actions/{action_id}/submit", json_body, b'{"approver": "\\udfff"}'),
                ("POST", f"/v1/actions/{action_id}/cancel", json_body, b'{"reason": "a\\u0000b"}'),
                ("GET", "/v1/calls/x%00y", ALICE, None),
                ("GET", "/v1/actions/x%00y", ALICE, None),
                ("GET", "/v1/actions?run_id=%00", ALICE, None),
                ("GET", "/v1/runs/%00/calls", ALICE, None),
                ("POST", "/v1/tools/lookup_customer/calls?run_id=%00", json_body, b"{}"),
                ("GET", "/v1/runs/default/events?after=%C2%B2", ALICE, None),  # isdigit, not int
                ("GET", f"/v1/runs/default/events?after={'9' * 5000}", ALICE, None),
                ("GET", f"/v1/runs/default/events?after={2**70}", ALICE, None),
            ]
            for method, path, headers, content in hostile:
                answer = await http.request(method, path, headers=headers, content=content)
                assert answer.status_code == 400, (path, content and content[:40], answer.text)
                assert answer.json()["code"] == "MALFORMED_REQUEST"
                assert answer.text.count("\n") == 0
            assert snapshot(runtime.store) == before and tools.refund_entries == entries

    asyncio.run(scenario())


def test_text_an_implementation_wrote_with_a_lone_surrogate_is_served_as_json_escapes(
    sqlite_store: SQLiteStore,
) -> None:
    """A suspension whose payload carries a lone surrogate (from the Python API, not a
    request) is listed and read back as the JSON escape it is: the inbox never turns to 500."""
    runtime, _ = runtime_of(sqlite_store)
    app = create_app(runtime, authenticate=authenticate)

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        text = "caf\u00e9 \ud800"
        context = CallContext(principal=TOKENS["token-alice"])
        waiting = await runtime.call(
            "check_page", {"url": "https://a.example", "expect_text": text}, context=context
        )
        assert waiting.status == "pending", waiting
        async with client_for(app, "asgi") as http:
            listed = await http.get("/v1/actions", headers=ALICE)
            one = await http.get(f"/v1/calls/{waiting.call.call_id}", headers=ALICE)
        return listed, one

    listed, one = asyncio.run(scenario())
    assert listed.status_code == 200 and one.status_code == 200, (listed.text, one.text)
    (action,) = listed.json()["actions"]
    assert action["input"]["expect_text"] == "caf\u00e9 \ud800", action
    assert one.json()["input"]["expect_text"] == "caf\u00e9 \ud800"


def test_a_submission_that_is_a_json_string_is_that_string(sqlite_store: SQLiteStore) -> None:
    """A body that is a JSON string is the value submitted (refused by an object schema, with
    the schema's reason), not JSON text parsed a second time into an approval."""
    runtime, tools = runtime_of(sqlite_store)
    app = create_app(runtime, authenticate=authenticate)

    async def scenario() -> httpx.Response:
        async with client_for(app, "asgi") as http:
            waiting = await http.post("/v1/tools/refund_payment/calls", json=REFUND, headers=ALICE)
            action_id = waiting.json()["action"]["action_id"]
            approval = json.dumps({"approved": True, "approver": "x"})
            return await http.post(f"/v1/actions/{action_id}/submit", json=approval, headers=ALICE)

    answer = asyncio.run(scenario())
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "INVALID_SUBMISSION"
    assert "must be of type object" in answer.json()["message"]
    assert tools.refund_entries == 1


# -- two server processes, one store: the store's record decides whose a call is ---------------

SERVED_DEPLOY = """
from blade_runtime.runtime import Runtime
from blade_specs.deploy import deploy_service_v1 as deploy
from http_support import Tools, authenticate


def factory(store):
    runtime = Runtime(store=store)
    Tools().register(runtime)

    async def impl(ctx):
        await ctx.data.write("log", deploy.DeployServiceLogData(line="key=alice-secret"))
        await ctx.request_permission(f"Deploy {ctx.input.service}?")

    runtime.register(deploy.SPEC, impl)
    return runtime
"""


class Served:
    """``blade-runtime serve`` in a process of its own, on 127.0.0.1."""

    def __init__(self, folder: Path, db: Path, env: dict[str, str]) -> None:
        import subprocess
        import sys

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "blade-runtime"),
                "serve",
                "served_deploy:factory",
                "--store",
                f"sqlite:///{db}",
                "--port",
                str(self.port),
                "--auth",
                "served_deploy:authenticate",
            ],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait(self) -> None:
        import time

        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{self.url}/v1/tools", headers=ALICE).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert self.process.poll() is None, self.process.communicate()[1]
            assert time.monotonic() < deadline, "no server"
            time.sleep(0.1)

    def stop(self) -> str:
        import signal

        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.communicate(timeout=20)[1]
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()


class Listener:
    """One principal's ``GET /v1/runs/{run}/events``, held open in a thread; its events."""

    def __init__(self, url: str, run_id: str, headers: dict[str, str]) -> None:
        import threading

        self.events: list[dict[str, Any]] = []
        self.opened = threading.Event()
        self.status = 0
        self.client = httpx.Client(timeout=30)
        self.thread = threading.Thread(
            target=self._read, args=(f"{url}/v1/runs/{run_id}/events", headers), daemon=True
        )
        self.thread.start()
        assert self.opened.wait(10) and self.status == 200, self.status

    def _read(self, url: str, headers: dict[str, str]) -> None:
        with (
            contextlib.suppress(httpx.HTTPError),
            self.client.stream("GET", url, headers=headers) as stream,
        ):
            self.status = stream.status_code
            self.opened.set()
            event: dict[str, str] = {}
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    event["event"] = line[7:]
                elif line.startswith("data: "):
                    self.events.append({**event, **json.loads(line[6:])})
                    event = {}
        self.opened.set()

    def close(self) -> None:
        self.client.close()
        self.thread.join(10)


def test_a_stream_shows_a_call_to_whom_the_stores_record_shows_it_across_servers(
    tmp_path: Path, built_examples: Path
) -> None:
    """Issue 29.1: two server processes on one SQLite store. Bob, streaming run R on server 1,
    sends a call with key K and invalid arguments there (422: nothing stored); Alice then makes
    a valid call with key K on server 2. The store says K is Alice's: Bob's stream on server 1
    carries none of its events (it once carried her started, data and suspended events, and her
    ToolData), only the refusal of his own attempt; Alice's own stream on server 1 carries them
    all."""
    import time

    (tmp_path / "served_deploy.py").write_text(SERVED_DEPLOY)
    db = tmp_path / "shared.db"
    SQLiteStore(db).close()
    env = process_env(built_examples)
    one, two = Served(tmp_path, db, env), Served(tmp_path, db, env)
    listeners: list[Listener] = []
    run, key = "R", "K-shared-key"
    calls = f"/v1/tools/deploy_service/calls?run_id={run}"
    valid = {"service": "api", "version": "v1.0.0", "environment": "production"}
    try:
        one.wait()
        two.wait()
        with httpx.Client(base_url=one.url, timeout=10) as first:
            for who in (BOB, ALICE):  # each has a call in the run, so each may stream it
                waiting = first.post(
                    f"/v1/tools/check_page/calls?run_id={run}", json={"url": "x"}, headers=who
                )
                assert waiting.status_code == 202, waiting.text
            listeners = [Listener(one.url, run, BOB), Listener(one.url, run, ALICE)]
            bob, alice = listeners
            time.sleep(0.3)
            refused = first.post(
                calls, json={"service": ""}, headers={**BOB, "Idempotency-Key": key}
            )
            assert refused.status_code == 422, refused.text
        with httpx.Client(base_url=two.url, timeout=10) as second:
            made = second.post(calls, json=valid, headers={**ALICE, "Idempotency-Key": key})
            assert made.status_code == 202, made.text
        deadline = time.monotonic() + 10
        while {"started", "data", "suspended"} - {
            e["event"] for e in alice.events if e["call_id"] == key
        }:
            assert time.monotonic() < deadline, (alice.events, bob.events)
            time.sleep(0.05)
        time.sleep(0.5)  # whatever server 1 would wrongly send Bob has been sent by now
        with httpx.Client(base_url=one.url, timeout=10) as first:
            retried = first.post(calls, json=valid, headers={**ALICE, "Idempotency-Key": key})
            assert retried.status_code == 202, retried.text  # the store's call, hers
            assert retried.json()["call_id"] == key
            bobs = first.post(calls, json=valid, headers={**BOB, "Idempotency-Key": key})
            assert bobs.status_code == 409, bobs.text  # the key names Alice's call now
            assert "production" not in bobs.text and "api" not in bobs.json()["message"]
            bobs = first.post(calls, json={"service": ""}, headers={**BOB, "Idempotency-Key": key})
            assert bobs.status_code == 409, bobs.text  # refused before the arguments are read
    finally:
        for listener in listeners:
            listener.close()
        stderrs = [server.stop() for server in (one, two)]
    # Bob's stream shows under K only what became of his own refused call, nothing of hers
    bobs = [e for e in bob.events if e["call_id"] == key]
    assert [(e["event"], e["payload"]["code"]) for e in bobs] == [
        ("result", "INVALID_INPUT")
    ], bob.events
    assert "alice-secret" not in json.dumps(bob.events)
    mine = [e["event"] for e in alice.events if e["call_id"] == key]
    assert mine == ["started", "data", "suspended"], alice.events
    assert all("Traceback" not in stderr for stderr in stderrs), stderrs
    assert all(f"on {s.url}" in e for s, e in zip((one, two), stderrs, strict=True)), stderrs


def test_every_error_of_a_served_api_is_json_also_for_oversized_headers(
    tmp_path: Path, built_examples: Path
) -> None:
    """Issue 29.11: uvicorn answered a request head over h11's 16 KiB with its own ``400
    text/plain``. ``blade-runtime serve`` serves heads up to 64 KiB, answers a larger one 431
    with the API's JSON error, and a request that is not HTTP 400 MALFORMED_REQUEST."""
    import socket

    from blade_runtime.serving.serve import MAX_HEAD_BYTES

    (tmp_path / "served_deploy.py").write_text(SERVED_DEPLOY)
    db = tmp_path / "h.db"
    SQLiteStore(db).close()
    server = Served(tmp_path, db, process_env(built_examples))
    try:
        server.wait()
        with httpx.Client(base_url=server.url, timeout=10) as http:
            roomy = http.get("/v1/tools", headers={**ALICE, "X-Big": "a" * 30_000})
            assert roomy.status_code == 200, roomy.text  # over h11's default, under ours
            for size in (MAX_HEAD_BYTES + 1, 200_000):
                huge = http.get("/v1/tools", headers={**ALICE, "X-Big": "a" * size})
                assert huge.status_code == 431, huge.text
                assert huge.headers["content-type"] == "application/json"
                assert huge.json()["code"] == "HEADERS_TOO_LARGE"
                assert "\n" not in huge.text
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            raw.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            answer = b""
            while chunk := raw.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), answer
        assert b"content-type: application/json" in head.lower()
        assert json.loads(body)["code"] == "MALFORMED_REQUEST"
    finally:
        stderr = server.stop()
    assert "Traceback" not in stderr


def test_serve_says_where_it_listens_once_listening_and_a_busy_port_is_one_line(
    tmp_path: Path, built_examples: Path
) -> None:
    """Issue 31.5: serve printed "serving ... on http://..." before binding, then failed on a
    busy port. Now the line comes once it listens; a busy port is one line, exit code 4."""
    import socket
    import subprocess
    import sys

    from blade_runtime.serving.serve import EXIT_BIND

    (tmp_path / "served_deploy.py").write_text(SERVED_DEPLOY)
    db = tmp_path / "b.db"
    SQLiteStore(db).close()
    env = process_env(built_examples)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = subprocess.run(
            [
                str(Path(sys.executable).parent / "blade-runtime"),
                "serve",
                "served_deploy:factory",
                "--store",
                f"sqlite:///{db}",
                "--port",
                str(port),
                "--allow-anonymous",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert busy.returncode == EXIT_BIND == 4, busy.stderr
    assert busy.stderr.strip().splitlines() == [
        f"error: cannot listen on http://127.0.0.1:{port}: Address already in use"
    ]
    server = Served(tmp_path, db, env)
    try:
        server.wait()
    finally:
        stderr = server.stop()
    line = f"serving served_deploy:factory over sqlite:///{db} on http://127.0.0.1:{server.port}"
    assert [text for text in stderr.splitlines() if line in text] == [
        f"blade-runtime {line}"
    ], stderr


def test_a_call_whose_id_holds_a_slash_is_read_at_its_url(
    example_package: Any, tmp_path: Path
) -> None:
    """The adapters key calls as ``lg/<thread>/<tool call id>``: such a call is read at
    ``GET /v1/calls/lg/<thread>/<tool call id>``, by its principal only."""
    runtime, _ = runtime_of(SQLiteStore(tmp_path / "slash.db"))
    app = create_app(runtime, authenticate=authenticate)

    async def scenario() -> tuple[Any, Any, Any]:
        async with client_for(app, "asgi") as http:
            made = await http.post(
                "/v1/tools/lookup_customer/calls",
                json={"customer_id": "cus_1"},
                headers={**ALICE, "Idempotency-Key": "lg/thread-1/t1"},
            )
            mine = await http.get("/v1/calls/lg/thread-1/t1", headers=ALICE)
            theirs = await http.get("/v1/calls/lg/thread-1/t1", headers=BOB)
        return made, mine, theirs

    made, mine, theirs = asyncio.run(scenario())
    assert made.status_code == 200 and made.json()["call_id"] == "lg/thread-1/t1"
    assert mine.status_code == 200 and mine.json()["call_id"] == "lg/thread-1/t1"
    assert theirs.status_code == 404
    runtime.store.close()
