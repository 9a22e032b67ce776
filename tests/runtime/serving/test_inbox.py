"""The approval inbox in a real browser: the system's headless Chromium (Debian's package, never
a downloaded one) driven by Playwright, against uvicorn on 127.0.0.1.

Every state a person sees is also saved as a screenshot in the test's tmp_path (the paths are
printed; ``BLADE_TEST_ARTIFACTS=folder`` keeps a copy): the list, a form with problems beside its
fields, the problems cleared, the confirmation, a filtered list, an expiring action."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import shutil
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_support import listed, open_inbox, scripted
from conftest import EXAMPLE_SPECS, _import_package, add_spec
from http_support import ALICE, BOB, REFUND, TOKENS, Tools, authenticate, runtime_of, serving

from blade_runtime import ResumeEntry, Runtime
from blade_runtime.core.permissions import ALLOW, Ask, PermissionRequest
from blade_runtime.core.store import ActionRecord, CallRecord, Claim, Event
from blade_runtime.serving.http import create_app
from blade_runtime.stores.sqlite import SQLiteStore

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
                    # optional, with a required field: left empty, it is left out (issue 29.10)
                    "escalation": {
                        "type": "object",
                        "properties": {"to": {"type": "string"}, "why": {"type": "string"}},
                        "required": ["to"],
                    },
                },
                "required": ["decision", "score", "reviewer"],
                "additionalProperties": False,
                # a rule only the server checks: telling the customer needs a note
                "if": {"properties": {"notify": {"const": True}}, "required": ["notify"]},
                "then": {"required": ["note"]},
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
HOLD_MS = 2500
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
            "expiresAfterMs": HOLD_MS,
        }
    },
}

# The problems shown beside a field: the visible field-error elements its control names in
# aria-describedby and that sit in the field's own box ("" when none is shown).
BESIDE = """path => {
  const control = document.querySelector(`[data-path="${CSS.escape(path)}"]`);
  if (!control) return null;
  const box = control.closest(".field, fieldset");
  const ids = (control.getAttribute("aria-describedby") || "").split(" ").filter(Boolean);
  return ids.map((id) => document.getElementById(id))
    .filter((n) => n && n.classList.contains("field-error") && !n.hidden && box.contains(n))
    .map((n) => n.textContent).join(" | ");
}"""
# A definition list's top-level pairs, as {label: value}.
PAIRS = """dl => Object.fromEntries([...dl.querySelectorAll(":scope > dt")].map(
  (dt) => [dt.textContent, dt.nextElementSibling.textContent]))"""
LABEL = """path => document.querySelector(`[data-path="${CSS.escape(path)}"]`)
  .closest(".field, fieldset").querySelector(".title-text").textContent"""
POINTER = re.compile(r"(^|\s)/\w")  # a JSON pointer written out


def beside(page: Any, path: str) -> str:
    found = page.evaluate(BESIDE, path)
    assert found is not None, f"no field {path}"
    return str(found)


def item(page: Any, action_id: str, part: str) -> str:
    return str(page.inner_text(f'#actions li[data-action-id="{action_id}"] .{part}'))


class Shots:
    """Screenshots of the states a person sees, in the test's tmp_path."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.paths: list[Path] = []

    def take(self, page: Any, name: str) -> None:
        path = self.folder / f"inbox-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        self.paths.append(path)

    def keep(self) -> None:
        assert all(shot.stat().st_size > 10_000 for shot in self.paths)
        keep = os.environ.get("BLADE_TEST_ARTIFACTS")  # pytest's tmp folders rotate: a copy
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            for shot in self.paths:
                shutil.copy(shot, Path(keep) / shot.name)
        print("screenshots:", *self.paths)


class Backdated(SQLiteStore):
    """A store that files the actions of some orders as suspended a while ago (seconds, by
    order id): the list's ages and its age filter, without waiting for them."""

    ago: dict[str, float]

    def suspend(
        self, call: CallRecord, action: ActionRecord, event: Event, *, claim: Claim | None = None
    ) -> Event:
        payload = action.payload
        order = payload.get("order_id") if isinstance(payload, dict) else None
        if isinstance(order, str) and order in self.ago:
            earlier = datetime.fromisoformat(action.suspended_at) - timedelta(
                seconds=self.ago[order]
            )
            action = dataclasses.replace(action, suspended_at=earlier.isoformat())
        return super().suspend(call, action, event, claim=claim)


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


def review_runtime(store: SQLiteStore, review: Any) -> Runtime:
    runtime, _ = runtime_of(store)

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
    return runtime


def test_the_inbox_lists_explains_problems_beside_fields_and_confirms_in_a_real_browser(
    tmp_path: Path, inbox_package: Any, browser: Any
) -> None:
    from blade_inbox.orders import review_order_v1 as review
    from playwright.sync_api import expect

    shots = Shots(tmp_path)
    runtime = review_runtime(SQLiteStore(tmp_path / "inbox.db"), review)
    app = create_app(runtime, authenticate=authenticate)
    alice = TOKENS["token-alice"].id
    with serving(app) as server, httpx.Client(base_url=server.url) as http:
        orders = [
            {"order_id": "ord_1", "total_minor": 4200},
            {"order_id": "ord_2", "total_minor": 99},
        ]
        made = [
            http.post("/v1/tools/review_order/calls?run_id=orders", json=o, headers=ALICE)
            for o in orders
        ]
        first, second = (m.json()["action"] for m in made)
        refund = http.post("/v1/tools/refund_payment/calls", json=REFUND, headers=ALICE).json()
        theirs = http.post(
            "/v1/tools/review_order/calls",
            json={"order_id": "ord_bob", "total_minor": 1},
            headers=BOB,
        ).json()["action"]
        mine = {first["action_id"], second["action_id"], refund["action"]["action_id"]}

        context = scripted(browser)
        page = context.new_page()
        other = context.new_page()
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        for each in (page, other):
            open_inbox(each, server.url, "token-alice")
            expect(each.locator("#actions li")).to_have_count(3)
        assert set(listed(page)) == mine and theirs["action_id"] not in listed(page)

        # each item says what it is about (its payload's fields), who asked, how long it waits
        for action, order in ((first, orders[0]), (second, orders[1])):
            summary = item(page, action["action_id"], "summary")
            assert order["order_id"] in summary and str(order["total_minor"]) in summary
            assert alice in item(page, action["action_id"], "who")
            assert "waiting" in item(page, action["action_id"], "age")
            assert page.is_hidden(f'#actions li[data-action-id="{action["action_id"]}"] .expiry')
        assert "ord_2" not in item(page, first["action_id"], "summary")
        refund_summary = item(page, refund["action"]["action_id"], "summary")
        assert str(REFUND["amount"]["amount_minor"]) in refund_summary  # type: ignore[index]
        shots.take(page, "list")

        # open one: its payload in words, and a form from its resume schema. The page in front
        # gets animation frames unthrottled, and a click waits for two of them.
        page.bring_to_front()
        page.click(f'#actions li[data-action-id="{first["action_id"]}"] button')
        page.wait_for_selector("#detail:not([hidden])")
        assert "ord_1" in page.inner_text("#detail-payload")
        assert "{" not in page.inner_text("#detail-payload")  # not JSON text
        assert alice in page.inner_text("#detail-facts")
        options = page.eval_on_selector_all(
            'select[data-path="/decision"] option', "els => els.map(e => e.textContent)"
        )
        assert options[1:] == ["approve", "reject", "escalate"]
        assert page.get_attribute('input[data-path="/notify"]', "type") == "checkbox"
        assert "Tell the customer." in page.inner_text('.field:has([data-path="/notify"])')
        team = page.eval_on_selector_all(
            'select[data-path="/reviewer/team"] option', "els => els.map(e => e.textContent)"
        )
        assert team[1:] == ["support", "finance"] and team[0] != "support"
        marked = set(
            page.eval_on_selector_all(
                ".required-mark",
                "els => els.map(e => e.parentElement.querySelector('.title-text')?.textContent)",
            )
        )
        paths = ("/decision", "/score", "/reviewer", "/reviewer/name", "/tags", "/note", "/notify")
        labels = {path: page.evaluate(LABEL, path) for path in paths}
        assert {labels[p] for p in ("/decision", "/score", "/reviewer", "/reviewer/name")} <= marked
        assert labels["/note"] not in marked and labels["/notify"] not in marked

        # nothing filled: nothing is sent, and each problem is beside its field, in words
        before = len(requests)
        page.click("#submit-button")
        expect(page.locator("#form-errors")).to_be_visible()
        for path in ("/decision", "/score", "/reviewer/name"):
            assert beside(page, path), path
            assert page.get_attribute(f'[data-path="{path}"]', "aria-invalid") == "true"
        for path in ("/note", "/notify", "/reviewer/team", "/escalation/to", "/escalation"):
            assert beside(page, path) == "", path
        assert not [u for u in requests[before:] if "/submit" in u]
        assert not POINTER.search(page.inner_text("#submit-form"))
        assert page.get_attribute("#form-errors", "role") == "alert"
        shots.take(page, "form-errors")

        # each fix clears its own message at once; a wrong value says what is wanted
        page.select_option('select[data-path="/decision"]', label="approve")
        assert beside(page, "/decision") == "" and beside(page, "/score")
        assert page.get_attribute('[data-path="/decision"]', "aria-invalid") is None
        page.fill('input[data-path="/score"]', "11")
        assert "10" in beside(page, "/score")  # its maximum
        page.fill('input[data-path="/score"]', "3")
        assert "2" in beside(page, "/score")  # its multiple
        typed: dict[str, Any] = {
            "decision": "approve",
            "score": 4,
            "reviewer": {"name": "Ann"},
            "tags": ["urgent", "gift"],
            "notify": True,
        }
        page.fill('input[data-path="/score"]', str(typed["score"]))
        page.fill('input[data-path="/reviewer/name"]', typed["reviewer"]["name"])
        assert beside(page, "/score") == "" and beside(page, "/reviewer/name") == ""
        expect(page.locator("#form-errors")).to_be_hidden()
        for index, tag in enumerate(["dropped", *typed["tags"]]):
            page.click('fieldset[data-path="/tags"] > button')
            page.fill(f'input[data-path="/tags/{index}"]', tag)
        page.click('fieldset[data-path="/tags"] .array-item > button')  # the first one's Remove
        assert page.input_value('input[data-path="/tags/0"]') == typed["tags"][0]  # renumbered
        page.check('input[data-path="/notify"]')
        # an optional object: partly filled, its required field is asked for; emptied, not
        page.fill('input[data-path="/escalation/why"]', "unsure")
        assert beside(page, "/escalation/to")
        page.fill('input[data-path="/escalation/why"]', "")
        assert beside(page, "/escalation/to") == ""
        # a rule only the server checks (a note when the customer is told): its refusal is shown
        # beside the field it names, in words, and the action still waits
        page.click("#submit-button")
        expect(page.locator('.field:has([data-path="/note"]) .field-error')).to_be_visible()
        assert beside(page, "/note") and not POINTER.search(beside(page, "/note"))
        assert beside(page, "/score") == ""
        assert runtime.store.action(first["action_id"]).state == "pending"  # type: ignore[union-attr]
        typed["note"] = "Checked twice."
        page.fill('input[data-path="/note"]', typed["note"])
        assert beside(page, "/note") == ""  # edited: the server's message goes
        expect(page.locator("#form-errors")).to_be_hidden()
        assert page.locator('#submit-form [aria-invalid="true"]').count() == 0
        shots.take(page, "errors-cleared")

        # valid: the server receives what was typed; the page confirms it, in the form's words
        page.click("#submit-button")
        page.wait_for_selector("#result:not([hidden])")
        record = runtime.store.action(first["action_id"])
        assert record is not None and record.state == "submitted"
        assert record.resume == typed
        sent = page.eval_on_selector("#confirmation-values > dl", PAIRS)
        assert sent[labels["/decision"]] == typed["decision"]
        assert sent[labels["/score"]] == str(typed["score"])
        assert sent[labels["/note"]] == typed["note"]
        assert all(tag in sent[labels["/tags"]] for tag in typed["tags"])
        assert typed["reviewer"]["name"] in page.inner_text("#confirmation-values")
        assert "approve" in page.inner_text("#result-body")  # what the tool returned
        call = runtime.store.call(first["call_id"])
        assert call is not None and call.state == "settled"
        for each in (page, other):
            expect(each.locator("#actions li")).to_have_count(2)
        shots.take(page, "confirmation")

        # the second page has one open that is resolved elsewhere (the API): it says so
        other.bring_to_front()
        other.click(f'#actions li[data-action-id="{second["action_id"]}"] button')
        other.wait_for_selector("#detail:not([hidden])")
        cancelled = http.post(f"/v1/actions/{second['action_id']}/cancel", json={}, headers=ALICE)
        assert cancelled.status_code == 200
        expect(other.locator("#detail-gone")).to_contain_text("cancelled")
        expect(other.locator("#actions li")).to_have_count(1)
        assert other.is_hidden("#submit-form")
        assert listed(other) == [refund["action"]["action_id"]]
        # bob's inbox (under the page's own CSP) shows only bob's action
        bobs = browser.new_page()
        console: list[str] = []
        bobs.on("console", lambda message: console.append(message.text))
        open_inbox(bobs, server.url, "token-bob")
        expect(bobs.locator("#actions li")).to_have_count(1)
        assert bobs.get_attribute("#actions li", "data-action-id") == theirs["action_id"]
        expect(bobs.locator("#actions li .who")).to_contain_text(TOKENS["token-bob"].id)
        bobs.click("#actions li button")
        expect(bobs.locator('select[data-path="/decision"]')).to_be_visible()
        bobs.click("#submit-button")
        expect(bobs.locator('.field:has([data-path="/decision"]) .field-error')).to_be_visible()
        assert not [m for m in console if "Content Security Policy" in m], console
        # no token: the page says the API refused it, and lists nothing
        anonymous = browser.new_page()
        anonymous.goto(f"{server.url}/inbox")
        expect(anonymous.locator("#status")).to_contain_text("UNAUTHENTICATED")
        expect(anonymous.locator("#actions li")).to_have_count(0)
        # everything the page loaded came from this server
        assert all(u.startswith(server.url) for u in requests), requests
    shots.keep()


def test_a_permission_request_offers_its_input_and_leaves_it_out_unless_changed(
    tmp_path: Path, inbox_package: Any, browser: Any
) -> None:
    """A permission request's answer has an optional ``input`` object whose fields are required
    (issue 29.10's case): the form shows the input as it would run; approved as it is, no
    ``input`` is sent; changed, the whole input is sent and must be complete."""
    from playwright.sync_api import expect

    shots = Shots(tmp_path)

    def policy(request: PermissionRequest) -> Any:
        return Ask() if request.name == "refund_payment" else ALLOW

    runtime = Runtime(store=SQLiteStore(tmp_path / "asks.db"), permission=policy)
    Tools().register(runtime)
    app = create_app(runtime, authenticate=authenticate)
    with serving(app) as server, httpx.Client(base_url=server.url) as http:
        asks = [
            http.post("/v1/tools/refund_payment/calls", json=REFUND, headers=ALICE).json()["action"]
            for _ in range(2)
        ]
        assert all(a["point"] == "@permission" for a in asks)
        page = scripted(browser).new_page()
        open_inbox(page, server.url, "token-alice")
        expect(page.locator("#actions li")).to_have_count(2)
        first, second = (a["action_id"] for a in asks)
        summary = item(page, first, "summary")  # the tool's input, in words
        assert REFUND["payment_id"] in summary and "1250" in summary
        assert "refund_payment" in item(page, first, "name")

        page.click(f'#actions li[data-action-id="{first}"] button')
        expect(page.locator('fieldset[data-path="/input"]')).to_be_visible()
        assert page.input_value('[data-path="/input/payment_id"]') == REFUND["payment_id"]
        assert page.input_value('[data-path="/input/reason"]') == REFUND["reason"]
        page.select_option('select[data-path="/decision"]', label="approve")
        decision = page.evaluate(LABEL, "/decision")
        # changed: the input is sent, so what it needs is asked for, beside each field
        page.fill('[data-path="/input/payment_id"]', "")
        page.fill('[data-path="/input/reason"]', "x" * 501)
        page.click("#submit-button")
        expect(page.locator("#form-errors")).to_be_visible()
        assert beside(page, "/input/payment_id")
        assert "500" in beside(page, "/input/reason")
        assert beside(page, "/decision") == "" and beside(page, "/message") == ""
        assert not POINTER.search(page.inner_text("#submit-form"))
        shots.take(page, "permission-changed")
        # as it was again: nothing to fix, and no input is sent
        page.fill('[data-path="/input/payment_id"]', REFUND["payment_id"])  # type: ignore[arg-type]
        page.fill('[data-path="/input/reason"]', REFUND["reason"])  # type: ignore[arg-type]
        assert page.locator('#submit-form [aria-invalid="true"]').count() == 0
        expect(page.locator("#form-errors")).to_be_hidden()
        page.click("#submit-button")
        page.wait_for_selector("#result:not([hidden])")
        record = runtime.store.action(first)
        assert record is not None and record.state == "submitted"
        # the answer's "always allow" box, left unticked, is sent as false: no standing grant
        assert record.resume == {"decision": "approve", "always": False}
        assert runtime.store.grants() == []
        assert page.eval_on_selector("#confirmation-values > dl", PAIRS)[decision] == "approve"
        # approved: the tool ran and now waits for its own approval, which the page offers
        expect(page.locator("#result-status button")).to_contain_text("approval")
        expect(page.locator("#actions li")).to_have_count(2)
        page.click("#result-status button")
        expect(page.locator('[data-path="/approver"]')).to_be_visible()

        # the second, approved with a changed reason: the whole input is sent, as shown
        page.click(f'#actions li[data-action-id="{second}"] button')
        expect(page.locator('fieldset[data-path="/input"]')).to_be_visible()
        page.select_option('select[data-path="/decision"]', label="approve")
        page.fill('[data-path="/input/reason"]', "arrived broken")
        page.click("#submit-button")
        page.wait_for_selector("#result:not([hidden])")
        record = runtime.store.action(second)
        assert record is not None
        assert record.resume == {
            "decision": "approve",
            "always": False,
            "input": {**REFUND, "reason": "arrived broken"},
        }
        assert "arrived broken" in page.inner_text("#confirmation-values")
    shots.keep()


def test_the_list_filters_by_tool_and_by_age(
    tmp_path: Path, inbox_package: Any, browser: Any
) -> None:
    from blade_inbox.orders import review_order_v1 as review
    from playwright.sync_api import expect

    shots = Shots(tmp_path)
    store = Backdated(tmp_path / "ages.db")
    store.ago = {"ord_old": 2 * 3600 + 120}  # waiting over two hours
    runtime = review_runtime(store, review)
    app = create_app(runtime, authenticate=authenticate)
    with serving(app) as server, httpx.Client(base_url=server.url) as http:

        def ask(order: str) -> str:
            body = {"order_id": order, "total_minor": 10}
            made = http.post("/v1/tools/review_order/calls", json=body, headers=ALICE)
            return str(made.json()["action"]["action_id"])

        old, new = ask("ord_old"), ask("ord_new")
        refund = http.post("/v1/tools/refund_payment/calls", json=REFUND, headers=ALICE)
        refunding = refund.json()["action"]["action_id"]
        page = scripted(browser).new_page()
        open_inbox(page, server.url, "token-alice")
        expect(page.locator("#actions li")).to_have_count(3)
        assert "2 h" in item(page, old, "age") and " h" not in item(page, new, "age")

        tools = page.eval_on_selector_all("#filter-tool option", "els => els.map(e => e.value)")
        assert {"review_order", "refund_payment"} <= set(tools)
        page.select_option("#filter-tool", "refund_payment")
        expect(page.locator("#actions li")).to_have_count(1)
        assert listed(page) == [refunding]
        assert page.inner_text("#filter-count") == "1 waiting match these filters"
        shots.take(page, "filtered-by-tool")
        page.wait_for_timeout(1200)  # a refresh keeps the filter
        assert listed(page) == [refunding]

        page.select_option("#filter-tool", "")
        page.select_option("#filter-age", "gt:3600")
        expect(page.locator("#actions li")).to_have_count(1)
        assert listed(page) == [old]
        shots.take(page, "filtered-by-age")
        page.select_option("#filter-age", "lt:900")
        expect(page.locator("#actions li")).to_have_count(2)
        assert set(listed(page)) == {new, refunding}
        page.select_option("#filter-tool", "review_order")
        expect(page.locator("#actions li")).to_have_count(1)
        assert listed(page) == [new]
        # nothing matches: the list says so, rather than that nothing waits
        page.select_option("#filter-age", "gt:86400")
        expect(page.locator("#actions li")).to_have_count(0)
        expect(page.locator("#empty")).to_be_visible()
        assert page.inner_text("#empty") != "Nothing waits for you."
    shots.keep()


def test_an_inbox_left_open_on_ten_thousand_actions_asks_one_page_at_a_time(
    tmp_path: Path, inbox_package: Any, browser: Any
) -> None:
    """Issue 39: 10,000 actions wait. The inbox lists a page of them and more on demand, never
    has two requests in flight (the server takes longer to answer than the poll interval) and
    asks less often while nothing changes; the server filters by tool."""
    from blade_inbox.orders import review_order_v1 as review
    from playwright.sync_api import expect
    from records import a_call, an_action, ev

    store = SQLiteStore(tmp_path / "many.db")
    for n in range(10_000):  # Alice's, written straight to the store (a year's backlog)
        call = a_call(tenant="acme", run_id="backlog", spec_id=review.SPEC.id)
        call.name, call.principal, call.state = "review_order", "alice", "suspended"
        action = an_action(call)
        action.principal, action.point = "alice", "review"
        action.payload = {"order_id": f"ord_{n:05}", "total_minor": n}
        store.suspend(call, action, ev(call, "suspended"))
    runtime = review_runtime(store, review)
    inner = create_app(runtime, authenticate=authenticate)
    seen: dict[str, Any] = {"now": 0, "most": 0, "lists": []}

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        listing = scope["type"] == "http" and scope["path"] == "/v1/actions"
        if not listing:
            return await inner(scope, receive, send)
        seen["now"] += 1
        seen["most"] = max(seen["most"], seen["now"])
        seen["lists"].append((time.monotonic(), scope["query_string"].decode()))
        try:
            await asyncio.sleep(1.5)  # longer than the poll interval: a poll must wait for it
            await inner(scope, receive, send)
        finally:
            seen["now"] -= 1

    with serving(slow) as server:
        page = scripted(browser).new_page()
        open_inbox(page, server.url, "token-alice")
        expect(page.locator("#actions li")).to_have_count(50, timeout=20_000)
        assert page.inner_text("#status").startswith("50+ waiting")
        page.click("#more")
        expect(page.locator("#actions li")).to_have_count(100, timeout=20_000)
        page.wait_for_timeout(6000)  # left open
        page.select_option("#filter-tool", "refund_payment")
        expect(page.locator("#empty")).to_be_visible(timeout=20_000)
        deadline = time.monotonic() + 15
        while not any("tool=refund_payment" in query for _, query in seen["lists"]):
            assert time.monotonic() < deadline, seen["lists"]
            page.wait_for_timeout(100)
    assert seen["most"] == 1  # never two requests at once
    queries = [query for _, query in seen["lists"]]
    assert all("limit=50" in query for query in queries)
    assert len(queries) < 20  # a page at a time, backing off: not one listing a second


def test_an_expiring_action_says_so_and_a_deep_link_opens_one(
    tmp_path: Path, inbox_package: Any, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blade_inbox.orders import hold_seat_v1 as hold
    from playwright.sync_api import expect

    shots = Shots(tmp_path)
    runtime, _ = runtime_of(SQLiteStore(tmp_path / "expiry.db"))

    async def hold_impl(ctx: Any) -> Any:
        ctx.suspend("confirm", hold.HoldSeatConfirmSuspend(seat=ctx.input.seat))

    runtime.register(hold.SPEC, hold_impl)
    app = create_app(runtime, authenticate=authenticate)
    with serving(app) as server, httpx.Client(base_url=server.url) as http:
        held = http.post("/v1/tools/hold_seat/calls", json={"seat": "12A"}, headers=ALICE)
        action = held.json()["action"]
        page = scripted(browser).new_page()
        open_inbox(page, server.url, "token-alice")
        expect(page.locator("#actions li")).to_have_count(1)
        expect(page.locator("#actions li .expiry")).to_contain_text("expires in")
        assert "soon" in (page.get_attribute("#actions li .expiry", "class") or "")
        assert "12A" in item(page, action["action_id"], "summary")
        page.click("#actions li button")
        expect(page.locator('input[data-path="/ok"]')).to_have_attribute("type", "checkbox")
        expect(page.locator("#detail-facts")).to_contain_text("in ")
        shots.take(page, "expiring")
        time.sleep(max(0.0, action["expires_at"] - time.time()) + 0.1)
        server.run(runtime.recover())  # a worker's sweep settles it as TIMEOUT
        expect(page.locator("#actions li")).to_have_count(0)
        expect(page.locator("#detail-gone")).to_contain_text("expired")
        expect(page.locator("#empty")).to_be_visible()
        record = runtime.store.action(action["action_id"])
        assert record is not None and record.state == "expired"

        # a deep link (as an MCP elicitation gives) opens its action once signed in; a token
        # with "+" is taken as typed
        monkeypatch.setitem(TOKENS, "a+b/c=", TOKENS["token-alice"])
        second = http.post("/v1/tools/hold_seat/calls", json={"seat": "14C"}, headers=ALICE)
        linked = second.json()["action"]["action_id"]
        deep = browser.new_page()
        open_inbox(deep, server.url, "a+b/c=", action=linked)
        expect(deep.locator("#detail-title")).to_contain_text("hold_seat")
        expect(deep.locator("#detail-payload")).to_contain_text("14C")
        assert deep.url.endswith(f"/inbox#action={linked}")
        gone = browser.new_page()
        open_inbox(gone, server.url, "token-bob", action=linked)
        expect(gone.locator("#status")).to_contain_text("is not pending for you")
        expect(gone.locator("#detail")).to_be_hidden()
        # a link carrying a token (someone else's) signs nobody in: it is dropped, and said
        lured = browser.new_page()
        lured.goto(f"{server.url}/inbox#token=token-bob&action={linked}")
        expect(lured.locator("#sign-in-note")).to_contain_text("does not take tokens from links")
        assert lured.url.endswith(f"/inbox#action={linked}")
        assert lured.evaluate("sessionStorage.length") == 0
        expect(lured.locator("#actions li")).to_have_count(0)
    shots.keep()


AXE = Path(__file__).parents[2] / "fixtures" / "axe-core" / "axe.min.js"
AXE_RUN = """async () => {
  const found = await axe.run(document, {runOnly: {type: "tag", values: ["wcag2a", "wcag2aa",
    "wcag21a", "wcag21aa"]}});
  return found.violations.map(
    (v) => v.id + ": " + v.nodes.map((n) => n.target.join(" ")).join(", "));
}"""
WIDEST = "() => Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
WIDER = """width => [...document.querySelectorAll("body *")]
  .filter((n) => n.getBoundingClientRect().right > width)
  .map((n) => n.tagName + "#" + n.id + "." + n.className + " " + n.getBoundingClientRect().right)
  .slice(0, 8)"""
# Visible controls smaller than 44 x 44 px (a checkbox counts by the row that holds its label).
SMALL = """() => [...document.querySelectorAll("button, input, select, textarea, summary, a")]
  .filter((n) => n.offsetParent !== null)
  .map((n) => [n, n.type === "checkbox" ? n.closest(".check-row") : n])
  .filter(([n, box]) => { const r = box.getBoundingClientRect();
    return r.height < 44 || (n.tagName !== "A" && r.width < 44); })
  .map(([n]) => n.id || n.textContent.trim() || n.outerHTML.slice(0, 60))"""


def axe(page: Any) -> list[str]:
    page.add_script_tag(path=str(AXE))
    return list(page.evaluate(AXE_RUN))


def required_in_tree(page: Any) -> dict[str, bool]:
    """The accessibility tree's ``required`` of each form control, by its data-path (what a
    screen reader announces, read from Chromium itself)."""
    return tree_property(page, "required", True)


def invalid_in_tree(page: Any) -> dict[str, bool]:
    return tree_property(page, "invalid", "true")


def tree_property(page: Any, name: str, wanted: Any) -> dict[str, bool]:
    session = page.context.new_cdp_session(page)
    root = session.send("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
    paths = page.eval_on_selector_all(
        "#submit-form [data-path]:is(input, select, textarea)",
        "els => els.map((e) => e.dataset.path)",
    )
    found = {}
    for path in paths:
        selector = f'#submit-form [data-path="{path}"]:is(input, select, textarea)'
        node = session.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        tree = session.send(
            "Accessibility.getPartialAXTree", {"nodeId": node, "fetchRelatives": False}
        )["nodes"]
        found[path] = any(
            p["name"] == name and p["value"].get("value") == wanted
            for p in tree[0].get("properties", [])
        )
    session.detach()
    return found


@pytest.mark.parametrize("width", [375, 1280])
def test_the_inbox_as_govuk_would_have_it_axe_focus_required_cancel_and_a_small_screen(
    width: int, tmp_path: Path, inbox_package: Any, browser: Any
) -> None:
    """Issue 50.8, in Chromium at a phone's width and a desktop's: axe-core finds no WCAG 2.1
    A/AA violation in the list, an open form and its error state; the accessibility tree
    announces the required fields (and only those); focus goes where attention goes; the error
    summary sits at the top with links; cancelling asks first; nothing is wider than the
    screen, even with a long call id shown; every control is a 44 px touch target."""
    from blade_inbox.orders import review_order_v1 as review
    from playwright.sync_api import expect

    shots = Shots(tmp_path)
    runtime = review_runtime(SQLiteStore(tmp_path / "a11y.db"), review)
    app = create_app(runtime, authenticate=authenticate)
    long_key = "call-" + "x" * 190  # an unbreakable id, as Technical details shows it
    with serving(app) as server, httpx.Client(base_url=server.url) as http:
        made = http.post(
            "/v1/tools/review_order/calls",
            json={"order_id": "ord_1", "total_minor": 4200},
            headers={**ALICE, "Idempotency-Key": long_key},
        ).json()["action"]
        second = http.post(
            "/v1/tools/review_order/calls",
            json={"order_id": "ord_2", "total_minor": 10},
            headers=ALICE,
        ).json()["action"]
        context = browser.new_context(bypass_csp=True, viewport={"width": width, "height": 800})
        page = context.new_page()
        open_inbox(page, server.url, "token-alice")
        expect(page.locator("#actions li")).to_have_count(2)
        assert axe(page) == []
        shots.take(page, f"{width}-list")
        assert page.evaluate(WIDEST) <= width, page.evaluate(WIDER, width)

        page.click(f'#actions li[data-action-id="{made["action_id"]}"] button')
        expect(page.locator("#submit-form")).to_be_visible()
        assert page.evaluate("document.activeElement.id") == "detail-title"
        shown = page.eval_on_selector_all(
            "#form-fields fieldset.root > :is(.field, fieldset)",
            "els => els.map((e) => e.matches('fieldset') ? e.dataset.path"
            " : e.querySelector('[data-path]').dataset.path)",
        )
        listed = REVIEW["suspend"]["review"]["resumeSchema"]["properties"]  # type: ignore[index]
        assert shown == [f"/{key}" for key in listed]  # as the spec lists them, not sorted
        page.click("details.technical summary")
        expect(page.locator("#detail-ids")).to_contain_text(long_key[:40])
        assert page.evaluate(WIDEST) <= width, "a long id widens the page"
        required = required_in_tree(page)
        assert not any(invalid_in_tree(page).values())  # nothing is said wrong before a try
        assert required["/score"] and required["/reviewer/name"], required
        # Chromium's tree lists no "required" of a <select> (a combobox): its attribute says it
        assert page.get_attribute('[data-path="/decision"]', "aria-required") == "true"
        assert not required["/note"] and not required["/notify"]
        assert not required["/escalation/to"]  # required only once its optional group is used
        assert page.evaluate(SMALL) == []
        assert axe(page) == []
        shots.take(page, f"{width}-form")

        # refused in the browser: the summary, at the top, takes focus; its links lead on
        page.click("#submit-button")
        expect(page.locator("#form-errors")).to_be_visible()
        assert page.evaluate("document.activeElement.id") == "form-errors"
        order = page.evaluate(
            "() => document.getElementById('form-errors').compareDocumentPosition("
            "document.getElementById('form-fields')) & Node.DOCUMENT_POSITION_FOLLOWING"
        )
        assert order, "the summary is above the fields"
        links = page.eval_on_selector_all("#form-errors a", "els => els.map(e => e.textContent)")
        assert "Select decision" in links and "Enter score" in links, links
        assert beside(page, "/score") == "Enter score"
        page.click("#form-errors a >> text=Enter score")
        assert page.evaluate("document.activeElement.dataset.path") == "/score"
        page.fill('input[data-path="/score"]', "12")
        assert beside(page, "/score") == "Score must be at most 10"
        assert axe(page) == []
        assert page.evaluate(WIDEST) <= width
        shots.take(page, f"{width}-errors")

        # an array row removed: focus goes to the row now in its place
        # (moved on with Tab: Chromium scrolls back to a number field's caret when a click
        # takes the focus from it, and the click then lands where the page has moved)
        page.keyboard.press("Tab")
        for index, tag in enumerate(["a", "b"]):
            page.click('fieldset[data-path="/tags"] > button')
            page.fill(f'input[data-path="/tags/{index}"]', tag)
        page.click('fieldset[data-path="/tags"] .array-item > button')
        assert page.evaluate("document.activeElement.dataset.path") == "/tags/0"
        assert page.input_value('input[data-path="/tags/0"]') == "b"

        # cancelling asks first; "No" keeps the action, and focus where it was
        page.click("#cancel-button")
        expect(page.locator("#cancel-confirm")).to_be_visible()
        assert page.evaluate("document.activeElement.id") == "cancel-confirm-title"
        assert page.evaluate(SMALL) == []
        shots.take(page, f"{width}-cancel")
        page.click("#cancel-no")
        assert page.evaluate("document.activeElement.id") == "cancel-button"
        assert runtime.store.action(made["action_id"]).state == "pending"  # type: ignore[union-attr]
        page.click("#cancel-button")
        page.click("#cancel-yes")
        expect(page.locator("#result")).to_be_visible()
        assert runtime.store.action(made["action_id"]).state == "cancelled"  # type: ignore[union-attr]
        # after an answer: its heading has focus, the next waiting action one Tab away
        assert page.evaluate("document.activeElement.id") == "result-title"
        expect(page.locator("#next-action")).to_contain_text("review_order")
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.id") == "next-action"
        page.keyboard.press("Enter")
        expect(page.locator("#detail-title")).to_be_focused()
        assert page.evaluate("() => document.querySelector('#detail-ids dd').textContent") == (
            second["action_id"]
        )
        shots.take(page, f"{width}-next")
    shots.keep()


def test_the_inbox_says_which_agent_asks_and_in_which_thread(
    tmp_path: Path, example_package: Any, browser: Any
) -> None:
    """Seed 002's executing agent and an action's origin thread, as a person sees them: the
    list says who asked through which agent; the detail names the agent and the thread."""
    from playwright.sync_api import expect

    runtime, _ = runtime_of(SQLiteStore(tmp_path / "agents.db"))
    app = create_app(runtime, authenticate=authenticate)
    with serving(app) as server, httpx.Client(base_url=server.url) as http:
        placed = {"agent_id": "billing-agent", "thread_id": "thread-7"}
        named = http.post(
            "/v1/tools/refund_payment/calls", params=placed, json=REFUND, headers=ALICE
        )
        plain = http.post("/v1/tools/refund_payment/calls", json=REFUND, headers=ALICE)
        via, direct = (r.json()["action"]["action_id"] for r in (named, plain))
        page = scripted(browser).new_page()
        open_inbox(page, server.url, "token-alice")
        expect(page.locator("#actions li")).to_have_count(2)
        assert item(page, via, "who") == "asked by alice via billing-agent"
        assert item(page, direct, "who") == "asked by alice"
        page.click(f'#actions li[data-action-id="{via}"] button')
        facts = page.locator("#detail-facts")
        expect(facts).to_contain_text("billing-agent")
        expect(facts).to_contain_text("thread-7")
        page.click(f'#actions li[data-action-id="{direct}"] button')
        expect(facts).not_to_contain_text("billing-agent")
        expect(facts).not_to_contain_text("Thread")
