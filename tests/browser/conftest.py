"""The browser tier: the dashboard driven in Debian's headless chromium with Playwright
(`tests.browser.chromium`). A module gets one demo hub (`tests.browser.demo`) and one
browser; each test gets a fresh context (its own cookies)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from tests.browser import chromium
from tests.browser.demo import DemoHub, demo_hub

EXPECT_TIMEOUT_MS = 20_000  # page content, not timings: generous for a loaded CI machine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoHub]:
    """The demo hub, once per module."""
    with demo_hub(tmp_path_factory.mktemp("demo-hub")) as hub:
        yield hub


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One browser process per module."""
    with sync_playwright() as p:
        try:
            b = chromium.launch(p.chromium)
        except chromium.ChromiumMissing as e:
            pytest.fail(str(e))
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def context(browser: Browser, demo: DemoHub) -> Iterator[BrowserContext]:
    """A fresh context per test (no cookies), relative URLs against the demo hub."""
    ctx = browser.new_context(base_url=demo.url, viewport=chromium.VIEWPORT)
    ctx.set_default_timeout(EXPECT_TIMEOUT_MS)
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()
