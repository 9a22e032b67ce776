"""The approval inbox in a real browser, for the tests that open it: the system's headless
Chromium (Debian's package, never a downloaded one) driven by Playwright."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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


def listed(page: Any) -> list[str]:
    return list(page.eval_on_selector_all("#actions li", "els => els.map(e => e.dataset.actionId)"))


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


def open_inbox(page: Any, url: str, token: str, action: str | None = None) -> None:
    """The inbox as a person opens it: the page (a deep link to ``action``), then the token
    pasted into its sign-in form (it takes none from a link)."""
    from playwright.sync_api import expect

    page.goto(f"{url}/inbox" + (f"#action={action}" if action else ""))
    expect(page.locator("#sign-in")).to_be_visible()
    page.fill("#token-input", token)
    page.click("#sign-in-button")
    expect(page.locator("#sign-in")).to_be_hidden()


def scripted(browser: Any) -> Any:
    """A page whose scripts may be evaluated: Playwright's waits evaluate script text, which
    the inbox's CSP forbids, so these pages bypass it (a page made otherwise runs under it)."""
    return browser.new_context(bypass_csp=True, viewport={"width": 1280, "height": 900})
