"""The approval inbox in a real browser: the system's headless Chromium (Debian's package, never
a downloaded one) driven by Playwright, against uvicorn on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import EXAMPLE_SPECS, _import_package, add_spec
from http_support import ALICE, BOB, REFUND, TOKENS, authenticate, runtime_of, serving

from blade_runtime import ResumeEntry
from blade_runtime.serving.http import create_app
from blade_runtime.stores.sqlite import SQLiteStore

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REVIEW = {
    "id": "orders.review-order.v1",
    "name": "review_order",
    "description": "Ship an order once a person has reviewed it.",
    "inputSchema": {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "total_minor": {"type": "integer"}},
        "required": ["order_id", "total_minor"],
    },
    "outputSchema": {
        "type": "object",
        "properties": {"decision": {"type": "string"}, "tags": {"type": "integer"}},
        "required": ["decision", "tags"],
    },
    "suspend": {
        "review": {
            "suspendSchema": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "total_minor": {"type": "integer"}},
                "required": ["order_id", "total_minor"],
            },
            "resumeSchema": {
                "type": "object",
                "properties": {
                    "decision": {"type": "string", "enum": ["approve", "reject", "escalate"]},
                    "notify": {"type": "boolean", "description": "Tell the customer."},
                    "score": {"type": "integer", "minimum": 0, "maximum": 10, "multipleOf": 2},
                    "reviewer": {"$ref": "#/$defs/Reviewer"},
                    "tags": {"type": "array", "items": {"type": "string", "minLength": 1}},
                    "note": {"type": "string"},
                },
                "required": ["decision", "score", "reviewer"],
                "additionalProperties": False,
                "$defs": {
                    "Reviewer": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "team": {"type": "string", "enum": ["support", "finance"]},
                        },
                        "required": ["name"],
                    }
                },
            },
        }
    },
}


HOLD = {
    "id": "orders.hold-seat.v1",
    "name": "hold_seat",
    "description": "Hold a seat while the customer confirms.",
    "inputSchema": {"type": "object", "properties": {"seat": {"type": "string"}}},
    "outputSchema": {"type": "object"},
    "suspend": {
        "confirm": {
            "suspendSchema": {"type": "object", "properties": {"seat": {"type": "string"}}},
            "resumeSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
            "expiresAfterMs": 1500,
        }
    },
}


@pytest.fixture(scope="module")
def inbox_package(tmp_path_factory: pytest.TempPathFactory, example_package: Any) -> Any:
    """The example specs plus a tool whose resume schema has every kind of field."""
    from blade_codegen.build import build

    root = tmp_path_factory.mktemp("inbox")
    shutil.copytree(EXAMPLE_SPECS, root / "specs")
    add_spec(root / "specs", REVIEW)
    add_spec(root / "specs", HOLD)
    build(root / "specs", root / "out", "blade_inbox")
    return _import_package(root / "out", "blade_inbox")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One Chromium for the module: a launch (with playwright's driver) takes about 2 s."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "install Debian's chromium (.ci/run does)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """The module's Chromium, with no page of an earlier test: every page a test opens is its
    own context (cookies, storage), and all of them are closed after the test."""
    assert chromium.contexts == []
    try:
        yield chromium
    finally:
        for context in chromium.contexts:
            context.close()


def test_the_inbox_lists_opens_refuses_and_resolves_in_a_real_browser(
    tmp_path: Path, inbox_package: Any, browser: Any
) -> None:
    from blade_inbox.orders import review_order_v1 as review
    from playwright.sync_api import expect

    runtime, _ = runtime_of(SQLiteStore(tmp_path / "inbox.db"))

    async def review_impl(ctx: Any) -> Any:
        if isinstance(ctx.entry, ResumeEntry):
            payload = ctx.entry.payload
            return review.ReviewOrderOutput(decision=payload.decision, tags=len(payload.tags or []))
        ctx.suspend(
            "review",
            review.ReviewOrderReviewSuspend(
                order_id=ctx.input.order_id, total_minor=ctx.input.total_minor
            ),
        )

    runtime.register(review.SPEC, review_impl)
    app = create_app(runtime, authenticate=authenticate)
    with serving(app) as server, httpx.Client(base_url=server.url) as http:
        first = http.post(
            "/v1/tools/review_order/calls?run_id=orders",
            json={"order_id": "ord_1", "total_minor": 4200},
            headers=ALICE,
        ).json()["action"]
        second = http.post(
            "/v1/tools/review_order/calls?run_id=orders",
            json={"order_id": "ord_2", "total_minor": 99},
            headers=ALICE,
        ).json()["action"]
        refund = http.post("/v1/tools/refund_payment/calls", json=REFUND, headers=ALICE).json()
        theirs = http.post(
            "/v1/tools/review_order/calls",
            json={"order_id": "ord_bob", "total_minor": 1},
            headers=BOB,
        ).json()["action"]
        mine = {first["action_id"], second["action_id"], refund["action"]["action_id"]}

        # Playwright's waits evaluate script text, which the inbox's CSP forbids: these pages
        # bypass it; bob's page below runs under it, and must show no violation.
        scripted = browser.new_context(bypass_csp=True, viewport={"width": 1280, "height": 1000})
        page = scripted.new_page()
        other = scripted.new_page()
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        for each in (page, other):
            each.goto(f"{server.url}/inbox#token=token-alice")
            each.wait_for_function("document.querySelectorAll('#actions li').length === 3")
        assert "token" not in page.url  # taken out of the address bar
        listed = page.eval_on_selector_all("#actions li", "els => els.map(e => e.dataset.actionId)")
        assert set(listed) == mine and theirs["action_id"] not in listed

        # open one: its payload, and a form from its resume schema. The page in front gets
        # animation frames unthrottled, and a click waits for two of them (2 s a click behind).
        page.bring_to_front()
        page.click(f'#actions li[data-action-id="{first["action_id"]}"] button')
        page.wait_for_selector("#detail:not([hidden])")
        assert '"order_id": "ord_1"' in page.inner_text("#detail-payload")
        options = page.eval_on_selector_all(
            'select[data-path="/decision"] option', "els => els.map(e => e.textContent)"
        )
        assert options[1:] == ["approve", "reject", "escalate"]
        assert page.get_attribute('input[data-path="/notify"]', "type") == "checkbox"
        assert page.inner_text('fieldset[data-path="/reviewer"] legend').startswith("reviewer")
        team = page.eval_on_selector_all(
            'select[data-path="/reviewer/team"] option', "els => els.map(e => e.textContent)"
        )
        assert team == ["(none)", "support", "finance"]
        required = page.eval_on_selector_all(
            ".required-mark", "els => els.map(e => e.parentElement.textContent)"
        )
        assert {"decision*", "score*", "reviewer*", "name*"} <= set(required), required
        assert "note*" not in required and "notify*" not in required

        # invalid in the browser: nothing sent, the errors shown, still pending
        before = len(requests)
        page.click("#submit-button")
        page.wait_for_selector("#form-errors:not([hidden])")
        errors = page.inner_text("#form-errors")
        assert "/decision: is required" in errors and "/reviewer/name: is required" in errors
        assert not [u for u in requests[before:] if "/submit" in u]
        page.select_option('select[data-path="/decision"]', label="approve")
        page.fill('input[data-path="/reviewer/name"]', "Ann")
        page.fill('input[data-path="/score"]', "3")
        page.click('fieldset[data-path="/tags"] > button')
        page.fill('input[data-path="/tags/0"]', "urgent")
        page.click('fieldset[data-path="/tags"] > button')
        page.fill('input[data-path="/tags/1"]', "gift")
        page.check('input[data-path="/notify"]')
        # 3 is not a multiple of 2: a rule only the server checks, and its answer is shown
        page.click("#submit-button")
        page.wait_for_function(
            "document.querySelector('#form-errors').textContent.includes('INVALID_SUBMISSION')"
        )
        assert runtime.store.action(first["action_id"]).state == "pending"  # type: ignore[union-attr]
        page.screenshot(path=str(tmp_path / "inbox-invalid.png"), full_page=True)

        # valid: the tool resumes; its result is shown; the action leaves both pages' lists
        page.fill('input[data-path="/score"]', "4")
        page.click("#submit-button")
        page.wait_for_selector("#result:not([hidden])")
        assert "Done" in page.inner_text("#result-status")
        assert '"decision": "approve"' in page.inner_text("#result-body")
        assert '"tags": 2' in page.inner_text("#result-body")
        record = runtime.store.action(first["action_id"])
        assert record is not None and record.state == "submitted"
        assert record.resume == {
            "decision": "approve",
            "notify": True,
            "score": 4,
            "reviewer": {"name": "Ann"},
            "tags": ["urgent", "gift"],
        }
        call = runtime.store.call(first["call_id"])
        assert call is not None and call.state == "settled"
        for each in (page, other):
            each.wait_for_function("document.querySelectorAll('#actions li').length === 2")
        page.screenshot(path=str(tmp_path / "inbox-resolved.png"), full_page=True)

        # the second page has one open that is resolved elsewhere (the API): it says so
        other.bring_to_front()
        other.click(f'#actions li[data-action-id="{second["action_id"]}"] button')
        other.wait_for_selector("#detail:not([hidden])")
        cancelled = http.post(f"/v1/actions/{second['action_id']}/cancel", headers=ALICE)
        assert cancelled.status_code == 200
        other.wait_for_selector("#detail-gone:not([hidden])")
        other.wait_for_function("document.querySelectorAll('#actions li').length === 1")
        assert other.is_hidden("#submit-form")
        left = other.eval_on_selector_all("#actions li", "els => els.map(e => e.dataset.actionId)")
        assert left == [refund["action"]["action_id"]]
        # bob's inbox (under the page's own CSP) shows only bob's action
        bobs = browser.new_page()
        console: list[str] = []
        bobs.on("console", lambda message: console.append(message.text))
        bobs.goto(f"{server.url}/inbox#token=token-bob")
        expect(bobs.locator("#actions li")).to_have_count(1)
        assert bobs.get_attribute("#actions li", "data-action-id") == theirs["action_id"]
        bobs.click("#actions li button")
        expect(bobs.locator('select[data-path="/decision"]')).to_be_visible()
        assert not [m for m in console if "Content Security Policy" in m], console
        # no token: the page says the API refused it, and lists nothing
        anonymous = browser.new_page()
        anonymous.goto(f"{server.url}/inbox")
        expect(anonymous.locator("#status")).to_contain_text("UNAUTHENTICATED")
        expect(anonymous.locator("#actions li")).to_have_count(0)
        # everything the page loaded came from this server
        assert all(u.startswith(server.url) for u in requests), requests
    shots = [tmp_path / "inbox-invalid.png", tmp_path / "inbox-resolved.png"]
    assert all(shot.stat().st_size > 10_000 for shot in shots)
    keep = os.environ.get("BLADE_TEST_ARTIFACTS")  # pytest's tmp folders rotate: keep a copy
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for shot in shots:
            shutil.copy(shot, Path(keep) / shot.name)
    print("screenshots:", *shots)


def test_an_expired_action_leaves_the_inbox_live_and_a_deep_link_opens_one(
    tmp_path: Path, inbox_package: Any, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blade_inbox.orders import hold_seat_v1 as hold
    from playwright.sync_api import expect

    runtime, _ = runtime_of(SQLiteStore(tmp_path / "expiry.db"))

    async def hold_impl(ctx: Any) -> Any:
        ctx.suspend("confirm", hold.HoldSeatConfirmSuspend(seat=ctx.input.seat))

    runtime.register(hold.SPEC, hold_impl)
    app = create_app(runtime, authenticate=authenticate)
    with serving(app) as server, httpx.Client(base_url=server.url) as http:
        held = http.post("/v1/tools/hold_seat/calls", json={"seat": "12A"}, headers=ALICE)
        action_id = held.json()["action"]["action_id"]
        page = browser.new_page()
        page.goto(f"{server.url}/inbox#token=token-alice")
        expect(page.locator("#actions li")).to_have_count(1)
        expect(page.locator("#actions li .meta")).to_contain_text("expires in")
        page.click("#actions li button")
        expect(page.locator('input[data-path="/ok"]')).to_have_attribute("type", "checkbox")
        time.sleep(1.6)
        server.run(runtime.recover())  # a worker's sweep settles it as TIMEOUT
        expect(page.locator("#actions li")).to_have_count(0)
        expect(page.locator("#detail-gone")).to_be_visible()
        expect(page.locator("#empty")).to_be_visible()
        record = runtime.store.action(action_id)
        assert record is not None and record.state == "expired"

        # a deep link (as an MCP elicitation gives) opens its action; a token with "+" survives
        monkeypatch.setitem(TOKENS, "a+b/c=", TOKENS["token-alice"])
        second = http.post("/v1/tools/hold_seat/calls", json={"seat": "14C"}, headers=ALICE)
        linked = second.json()["action"]["action_id"]
        deep = browser.new_page()
        deep.goto(f"{server.url}/inbox#token=a%2Bb%2Fc%3D&action={linked}")
        expect(deep.locator("#detail-title")).to_have_text("hold_seat.confirm")
        expect(deep.locator("#detail-payload")).to_contain_text("14C")
        assert deep.url.endswith(f"/inbox#action={linked}")  # the token left the address bar
        gone = browser.new_page()
        gone.goto(f"{server.url}/inbox#token=token-bob&action={linked}")
        expect(gone.locator("#status")).to_contain_text("is not pending for you")
        expect(gone.locator("#detail")).to_be_hidden()
