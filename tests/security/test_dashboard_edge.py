"""The dashboard's and the API description's edge (issue 37, items 14 and 20), against a
real ``reach api`` process with authentication on.

- Every dashboard answer carries a Content-Security-Policy that allows scripts, styles and
  connections from the hub only (no inline script or style, no eval, no framing); the
  templates keep to it (htmx from /ui/static still works: tests/browser).
- ``/openapi.json`` takes a key once auth is on; ``/docs`` and ``/redoc`` (scripts from a
  CDN, on the dashboard's origin) are not served then.
- docker-compose.yml serves the admin API and the dashboard on the admin port (published on
  the host's loopback only), never on the public port: the same split as a real
  ``reach api`` with ``server.admin_port``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from reach.core.security.auth import Scope
from reach.hub.api.signin import COOKIE
from reach.hub.api.ui.pages import TEMPLATES
from tests.security.edge_hub import EdgeHub, assert_problem, csrf_of, edge_hub
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
SQLITE_ONLY = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


@pytest.fixture
def hub(store_url: str, tmp_path: Path) -> Iterator[EdgeHub]:
    with edge_hub(store_url, tmp_path) as running:
        yield running


def _csp(answer: requests.Response) -> dict[str, list[str]]:
    header = answer.headers.get("content-security-policy")
    assert header, f"{answer.url}: no Content-Security-Policy ({dict(answer.headers)})"
    policy: dict[str, list[str]] = {}
    for directive in header.split(";"):
        name, *values = directive.split()
        policy[name] = values
    return policy


@SQLITE_ONLY
def test_every_dashboard_answer_carries_a_strict_content_security_policy(hub: EdgeHub) -> None:
    admin = {"Authorization": f"Bearer {hub.admin.secret}"}
    answers = [
        requests.get(f"{hub.url}/ui/login", timeout=10),  # the sign-in page
        requests.get(f"{hub.url}/ui", timeout=10, allow_redirects=False),  # to the sign-in
        requests.get(f"{hub.url}/ui", headers=admin, timeout=10),  # the fleet page
        requests.get(f"{hub.url}/ui/tasks/nope", headers=admin, timeout=10),  # the 404 page
        requests.get(f"{hub.url}/ui/static/htmx.min.js", timeout=10),
        requests.get(f"{hub.url}/ui", headers={"Authorization": "Bearer x"}, timeout=10),
    ]
    assert [a.status_code for a in answers] == [200, 303, 200, 404, 200, 401]
    for answer in answers:
        policy = _csp(answer)
        assert policy["default-src"] == ["'none'"], policy
        for directive in ("script-src", "style-src", "connect-src", "form-action"):
            assert policy[directive] == ["'self'"], (directive, policy)
        assert policy["frame-ancestors"] == ["'none'"], policy
        assert answer.headers["x-content-type-options"] == "nosniff"
    # the API itself is not a page: no dashboard policy on a JSON answer
    assert "content-security-policy" not in requests.get(f"{hub.url}/healthz", timeout=10).headers


def test_the_templates_keep_to_the_policy() -> None:
    """No inline script, event handler, style attribute or style element: the policy
    would block each (and the page would silently lose it)."""
    for template in sorted(TEMPLATES.glob("*.html")):
        text = template.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), template.name
        assert not re.search(r"<style\b", text), template.name
        assert not re.search(r"\sstyle=", text), template.name
        assert not re.search(r"\son[a-z]+=", text), template.name
        assert not re.search(r"\shx-on[:-]", text), template.name
        assert "javascript:" not in text and "js:" not in text, template.name


@SQLITE_ONLY
def test_the_api_description_takes_a_key_and_the_cdn_pages_are_not_served(hub: EdgeHub) -> None:
    assert_problem(requests.get(f"{hub.url}/openapi.json", timeout=10), 401, "unauthenticated")
    caller = hub.key(Scope.CALLER)
    described = requests.get(
        f"{hub.url}/openapi.json", headers={"Authorization": f"Bearer {caller.secret}"}, timeout=10
    )
    assert described.status_code == 200 and described.json()["openapi"].startswith("3.")
    admin = {"Authorization": f"Bearer {hub.admin.secret}"}
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert_problem(requests.get(f"{hub.url}{path}", timeout=10), 401, "unauthenticated")
        assert_problem(
            requests.get(f"{hub.url}{path}", headers=admin, timeout=10), 404, "not-found"
        )
    # what stays open
    assert requests.get(f"{hub.url}/healthz", timeout=10).status_code == 200
    assert requests.get(f"{hub.url}/.well-known/jwks.json", timeout=10).status_code == 200


def test_compose_serves_the_admin_api_on_the_loopback_admin_port_only() -> None:
    api = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["api"]
    env = api.get("environment") or {}
    assert env.get("REACH_SERVER__ADMIN_PORT") == "8801", "the admin API must leave port 8800"
    ports = [str(p) for p in api["ports"]]
    assert "8800:8800" in ports
    admin = [p for p in ports if p.endswith(":8801")]
    assert admin == ["127.0.0.1:8801:8801"], ports  # published on the host's loopback only


@SQLITE_ONLY
def test_with_an_admin_port_the_public_port_serves_no_admin_api_or_dashboard(
    store_url: str, tmp_path: Path
) -> None:
    admin_port = free_port()
    with edge_hub(store_url, tmp_path, REACH_SERVER__ADMIN_PORT=str(admin_port)) as hub:
        key = {"Authorization": f"Bearer {hub.admin.secret}"}
        admin_url = f"http://127.0.0.1:{admin_port}"
        for path in ("/api/v1/agents", "/metrics", "/ui/login"):
            public = requests.get(f"{hub.url}{path}", headers=key, timeout=10)
            assert public.status_code == 404, (path, public.status_code)
            assert requests.get(f"{admin_url}{path}", headers=key, timeout=10).status_code == 200
        # agents and callers use the public port
        assert requests.get(f"{hub.url}/v1/tasks/nope", headers=key, timeout=10).status_code == 404


def sign_in(hub: EdgeHub, secret: str, client: int = 1) -> tuple[requests.Session, str]:
    """Sign in through the form as a browser does; the session and its cookie's value."""
    browser = hub.client(client)
    form = browser.get(f"{hub.url}/ui/login", timeout=10)
    fields = {"api_key": secret, "next": "/ui", "csrf_token": csrf_of(form.text)}
    signed_in = browser.post(f"{hub.url}/ui/login", data=fields, allow_redirects=False, timeout=10)
    assert signed_in.status_code == 303, signed_in.text[:500]
    return browser, signed_in.cookies[COOKIE]


@SQLITE_ONLY
def test_signing_out_ends_the_session_for_every_copy_of_its_cookie(hub: EdgeHub) -> None:
    browser, cookie = sign_in(hub, hub.admin.secret)
    page = browser.get(f"{hub.url}/ui", timeout=10)
    assert page.status_code == 200 and hub.admin.key_id in page.text
    stolen = {"Cookie": f"{COOKIE}={cookie}"}  # a copy taken while the session was live
    assert requests.get(f"{hub.url}/ui", headers=stolen, timeout=10).status_code == 200

    out = browser.post(
        f"{hub.url}/ui/logout", data={"csrf_token": csrf_of(page.text)}, allow_redirects=False
    )
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"

    after = requests.get(f"{hub.url}/ui", headers=stolen, allow_redirects=False, timeout=10)
    assert after.status_code == 303 and after.headers["location"].startswith("/ui/login")
    # a refused cookie cannot post either: the form's session is gone with it
    replay = requests.post(
        f"{hub.url}/ui/logout",
        headers=stolen,
        data={"csrf_token": csrf_of(page.text)},
        allow_redirects=False,
        timeout=10,
    )
    assert replay.status_code == 403
    # signing in again gives a new session, which works
    _, fresh = sign_in(hub, hub.admin.secret)
    assert fresh != cookie
    again = {"Cookie": f"{COOKIE}={fresh}"}
    assert requests.get(f"{hub.url}/ui", headers=again, timeout=10).status_code == 200
