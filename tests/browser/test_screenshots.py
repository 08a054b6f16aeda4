"""The README's screenshots match the dashboard's pages: every page has one, the README
shows or links each, and none is left for a page that no longer exists (pixels are not
compared: ``scripts/screenshots`` renews them)."""

from __future__ import annotations

import re

from tests.browser.screenshots import OUT, PAGES, urls
from tests.support.paths import REPO

PNG = b"\x89PNG\r\n\x1a\n"


def test_every_page_has_a_screenshot_and_the_readme_shows_it() -> None:
    readme = (REPO / "README.md").read_text()
    for name in PAGES:
        shot = OUT / f"{name}.png"
        assert shot.is_file(), f"{shot} is missing: run scripts/screenshots"
        assert shot.read_bytes().startswith(PNG), f"{shot} is not a PNG"
        assert f"docs/screenshots/{name}.png" in readme, f"the README does not show {name}.png"
    assert sorted(p.stem for p in OUT.glob("*.png")) == sorted(PAGES)


def test_every_page_in_the_dashboards_menu_has_a_screenshot() -> None:
    base = (REPO / "reach" / "hub" / "api" / "ui" / "templates" / "base.html").read_text()
    menu = set(re.findall(r'"(/ui[^"]*)"', base.split("<nav>", 1)[1].split("</nav>", 1)[0]))
    assert menu, "no menu found in base.html"
    shown = set(urls({"instance": "i", "task": "t", "run": "r"}).values())
    assert menu <= shown, f"pages without a screenshot: {sorted(menu - shown)}"
