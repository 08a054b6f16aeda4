"""Debian's chromium driven by Playwright: how to launch it, and signing in as a person does.

``scripts/test`` installs the ``chromium`` package (``/usr/bin/chromium``); Playwright's own
browser download (``playwright install``) is never used.
"""

from __future__ import annotations

import os
from urllib.parse import quote

from playwright.sync_api import Browser, BrowserType, Page, ViewportSize

CHROMIUM = os.environ.get("REACH_TEST_CHROMIUM", "/usr/bin/chromium")
# headless, as root in CI (no sandbox), no GPU; /dev/shm may be small in a container
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
VIEWPORT: ViewportSize = {"width": 1280, "height": 860}


class ChromiumMissing(RuntimeError):
    """/usr/bin/chromium is not installed."""


def launch(chromium: BrowserType) -> Browser:
    """Debian's chromium, headless."""
    if not os.access(CHROMIUM, os.X_OK):
        raise ChromiumMissing(
            f"{CHROMIUM} is missing: apt-get install chromium (scripts/test does)"
        )
    return chromium.launch(executable_path=CHROMIUM, args=ARGS)


def sign_in(page: Page, secret: str, next_path: str = "/ui") -> None:
    """Sign in through the form, as a person would; ends on ``next_path``."""
    page.goto(f"/ui/login?next={quote(next_path, safe='')}")
    page.fill("#api_key", secret)
    page.click("main form[action='/ui/login'] button[type=submit]")
    page.wait_for_url(
        lambda url: url.split("://", 1)[-1].split("/", 1)[-1] == next_path.lstrip("/")
    )
