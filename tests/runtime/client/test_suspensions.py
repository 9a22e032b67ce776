"""A call's suspension episodes for clients (seed 002: ``part.suspensions`` with ``state`` as the
discriminant, and ``part.pendingSuspension``): the typed client in process and over HTTP, and
``GET /v1/calls/{id}``, on every store; another tenant's client sees none."""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import httpx
import pytest
from conftest import build_and_import, spec
from http_support import ALICE, BOB, TOKENS, authenticate

from blade_runtime import ResumeEntry, Runtime
from blade_runtime.client import RuntimeTransport, ToolClient
from blade_runtime.core.caller import CallContext
from blade_runtime.core.store import Store
from blade_runtime.serving.http import HttpTransport, create_app

OBJECT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
OK = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@pytest.fixture(scope="module")
def twice(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("suspensions")
    build_and_import(
        root,
        "suspensions_pkg",
        spec(
            "ops.twice.v1",
            inputSchema=OBJECT,
            outputSchema=OBJECT,
            sideEffect="non_idempotent",
            suspend={
                "review": {"suspendSchema": OBJECT, "resumeSchema": OK},
                "confirm": {"suspendSchema": OBJECT, "resumeSchema": OK},
            },
        ),
    )
    return importlib.import_module("suspensions_pkg.ops.twice_v1")


def registered(twice: Any, store: Store) -> Runtime:
    async def run(ctx: Any) -> Any:
        if not isinstance(ctx.entry, ResumeEntry):
            ctx.suspend("review", twice.TwiceReviewSuspend(n=ctx.input.n))
        if ctx.entry.point == "review":
            ctx.suspend("confirm", twice.TwiceConfirmSuspend(n=ctx.input.n + 1))
        return twice.SPEC.output_type(n=ctx.input.n)

    runtime = Runtime(store=store)
    runtime.register(twice.SPEC, run)
    return runtime


def test_a_clients_view_of_a_calls_suspension_episodes(twice: Any, store: Store) -> None:
    alice = CallContext(principal=TOKENS["token-alice"])

    async def scenario() -> tuple[list[Any], list[Any], list[Any], list[Any], Any]:
        runtime = registered(twice, store)
        mine = ToolClient(RuntimeTransport(runtime, TOKENS["token-alice"]))
        theirs = ToolClient(RuntimeTransport(runtime, TOKENS["token-bob"]))
        first = await runtime.call("twice", {"n": 1}, call_id="c-twice", context=alice)
        await runtime.submit(first.action.action_id, {"ok": True})
        waiting = await mine.suspensions("c-twice")
        app = create_app(runtime, authenticate=authenticate)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            body = (await http.get("/v1/calls/c-twice", headers=ALICE)).json()
            hidden = (await http.get("/v1/calls/c-twice", headers=BOB)).status_code
            over_http = await ToolClient(
                HttpTransport("http://127.0.0.1", token="token-alice", transport=transport)
            ).suspensions("c-twice")
        second = next(e for e in waiting if e.state == "pending")
        await runtime.submit(second.action_id, {"ok": False})
        done = await mine.suspensions("c-twice")
        none = await theirs.suspensions("c-twice")
        await runtime.close()
        return waiting, done, none, over_http, (body, hidden)

    waiting, done, none, over_http, (body, hidden) = asyncio.run(scenario())
    review, confirm = waiting
    assert (review.name, review.state, review.input, review.resume) == (
        "review",
        "submitted",
        {"n": 1},
        {"ok": True},
    )
    assert review.resolved_at is not None and review.suspended_at <= review.resolved_at
    assert (confirm.name, confirm.state, confirm.input) == ("confirm", "pending", {"n": 2})
    assert confirm.resolved_at is None and confirm.resume is None
    assert [e.state for e in done] == ["submitted", "submitted"]
    assert done[1].resume == {"ok": False}
    assert none == []  # another tenant's client: no such call
    assert over_http == waiting  # the same view over HTTP
    assert body["suspensions"] == [e.model_dump(exclude_none=True) for e in waiting]
    assert body["pending_suspension"]["action_id"] == confirm.action_id
    assert hidden == 404
