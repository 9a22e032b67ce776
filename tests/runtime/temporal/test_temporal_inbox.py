"""The approval inbox against Temporal, in Chromium: create_temporal_app served by uvicorn on
127.0.0.1, a worker of the call workflows on the server's loop, a real dev server. A person signs
in, sees the call's action (read from Temporal's visibility store), answers it in the form, and
the call settles with that answer; another tenant's person never sees it."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from browser_support import listed, open_inbox, scripted
from http_support import ALICE, BOB, TOKENS, serving
from process_worker import Tools
from starlette.requests import Request
from starlette.types import Receive, Scope, Send
from temporal_support import DevServer
from temporalio.client import Client

from blade_runtime import Runtime
from blade_runtime.core.caller import Principal
from blade_runtime.serving.http.temporal import create_temporal_app
from blade_runtime.temporal import ActivityStore, TemporalTools, worker


class Later:
    """An ASGI app made once the server's loop runs (the Temporal client lives on it)."""

    app: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.app is not None
        await self.app(scope, receive, send)


def authenticate(request: Request) -> Principal | None:
    header = request.headers.get("authorization", "")
    return TOKENS.get(header.removeprefix("Bearer ").strip())


def test_a_person_answers_a_call_waiting_on_temporal_from_the_inbox(
    temporal_server: DevServer, temporal_package: Path, tmp_path: Path, browser: Any
) -> None:
    from playwright.sync_api import expect

    task_queue = f"q-{uuid.uuid4().hex[:8]}"
    later = Later()
    running: list[Any] = []

    async def start() -> None:
        runtime = Runtime(store=ActivityStore())
        Tools(tmp_path / "entries").register(runtime)
        client = await Client.connect(temporal_server.address)
        tools = TemporalTools(client, task_queue=task_queue, runtime=runtime)
        later.app = create_temporal_app(tools, authenticate)
        serving_worker = worker(client, runtime, task_queue=task_queue)
        running.append(asyncio.ensure_future(serving_worker.run()))
        running.append(serving_worker)

    with serving(later) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        server.run(start())
        made = http.post(
            "/v1/tools/sync/calls",
            json={"n": 5, "suspend": True},
            headers={**ALICE, "idempotency-key": "c-inbox"},
        )
        assert made.status_code == 202, made.text
        action_id = made.json()["action"]["action_id"]
        theirs = http.post(
            "/v1/tools/sync/calls",
            json={"n": 6, "suspend": True},
            headers={**BOB, "idempotency-key": "c-bob"},
        ).json()["action"]["action_id"]

        context = scripted(browser)
        page = context.new_page()
        open_inbox(page, server.url, "token-alice")
        # Visibility catches up a moment after the suspension; the inbox polls until it does.
        expect(page.locator("#actions li")).to_have_count(1, timeout=60_000)
        assert listed(page) == [action_id] and theirs not in listed(page)
        assert "sync 5?" in page.inner_text(f'#actions li[data-action-id="{action_id}"]')

        page.click(f'#actions li[data-action-id="{action_id}"] button')
        page.wait_for_selector("#detail:not([hidden])")
        page.check('input[data-path="/approved"]')
        page.fill('input[data-path="/note"]', "from the inbox")
        page.click("#submit-button")
        page.wait_for_selector("#result:not([hidden])", timeout=60_000)

        deadline = time.monotonic() + 60
        while True:
            call = http.get("/v1/calls/c-inbox", headers=ALICE).json()
            if call["state"] == "settled" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert call["result"]["status"] == "success", call
        assert call["result"]["content"] == {"n": 5, "entry": "resume", "note": "from the inbox"}
        assert [e["state"] for e in call["suspensions"]] == ["submitted"]
        bobs = http.get("/v1/calls/c-inbox", headers=BOB)
        assert bobs.status_code == 404

        async def stop() -> None:
            task, serving_worker = running
            await serving_worker.shutdown()
            await task

        server.run(stop())
