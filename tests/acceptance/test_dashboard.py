"""The web dashboard (``/ui``): sign-in, sessions, CSRF, the Fleet and Tasks pages and the
live task section, through real processes (api, worker, beat, SDK agents with their own
keys) on SQLite and PostgreSQL, with ``REACH_SECURITY__REQUIRE_AUTH=true``.

A browser is played by a `requests.Session` (cookies kept, redirects not followed, so
every status and header is asserted); the real-browser checks (htmx swaps, the SSE
extension) are tests/browser's.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from reach.core.security.auth import Scope
from reach.hub.security import apikeys
from reach.hub.storage import create_engine_for, session_factory
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, Stack, hub_env, wait_http_ok
from tests.support.trust_agents import Key, TrustAgent, api, make_key, online
from tests.support.waiting import wait_until

STACK_SETTINGS = {
    "REACH_SECURITY__REQUIRE_AUTH": "true",
    "REACH_APPROVAL__CAPABILITIES": '["gated.*"]',
    "REACH_APPROVAL__TIMEOUT_S": "600",
}
EU, US = "ui-eu", "ui-us"
SCRIPT = "<script>alert('owned')</script>"
TOKEN = re.compile(r'name="csrf_token" value="([0-9a-f]*)"|"x-csrf-token": "([0-9a-f]*)"')


@dataclass(frozen=True)
class Keys:
    admin: Key
    viewer: Key
    approver: Key
    caller: Key
    eu: Key
    us: Key


@dataclass(frozen=True)
class Tasks:
    eu: list[str]  # eu.do, succeeded, newest last
    us: str  # us.do, succeeded
    script: str  # eu.do with a <script> payload


class Browser:
    """A cookie-keeping client of the dashboard that never follows redirects."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http = requests.Session()

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.http.get(self.base + path, allow_redirects=False, timeout=30, **kw)

    def post(self, path: str, data: dict[str, str]) -> requests.Response:
        return self.http.post(self.base + path, data=data, allow_redirects=False, timeout=30)

    def csrf(self, path: str = "/ui/login") -> str:
        r = self.get(path)
        assert r.status_code == 200, r.text
        found = TOKEN.search(r.text)  # a form's field, or the header htmx requests carry
        token = found and (found.group(1) or found.group(2))
        assert token, r.text
        return token

    def login(self, secret: str, next_: str = "/ui") -> requests.Response:
        token = self.csrf()
        return self.post("/ui/login", {"api_key": secret, "csrf_token": token, "next": next_})


@pytest.fixture(scope="module")
def keys(shared_stack: Stack, shared_store_url: str) -> Keys:
    return Keys(
        admin=make_key(shared_store_url, Scope.ADMIN),
        viewer=make_key(shared_store_url, Scope.VIEWER),
        approver=make_key(shared_store_url, Scope.APPROVER),
        caller=make_key(shared_store_url, Scope.CALLER),
        eu=make_key(shared_store_url, Scope.AGENT, EU),
        us=make_key(shared_store_url, Scope.AGENT, US),
    )


@pytest.fixture(scope="module")
def agents(
    shared_stack: Stack, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[TrustAgent]]:
    directory = tmp_path_factory.mktemp("ui-agents")
    started = [
        TrustAgent(shared_stack.url, EU, keys.eu, directory, ["eu"], ["eu.do"]),
        TrustAgent(shared_stack.url, US, keys.us, directory, ["us"], ["us.do", "gated.do"]),
    ]
    try:
        for agent in started:
            wait_until(
                lambda a=agent: (
                    a.proc.poll() is not None or online(shared_stack, keys.admin, a.agent_id)
                ),
                timeout=30,
                what=f"{agent.agent_id} online",
            )
            assert agent.proc.poll() is None, agent.output()
        yield started
    finally:
        for agent in started:
            agent.stop()


def _submit(stack: Stack, key: Key, agent_id: str, method: str, payload: Any) -> dict[str, Any]:
    body = {"agent_id": agent_id, "method": method, "payload": payload}
    r = api(stack, "POST", "/v1/tasks?wait=30", key, body)
    assert r.status_code == 201, r.text
    return dict(r.json())


@pytest.fixture(scope="module")
def tasks(shared_stack: Stack, keys: Keys, agents: list[TrustAgent]) -> Tasks:
    eu = [_submit(shared_stack, keys.caller, EU, "eu.do", {"n": i}) for i in range(3)]
    us = _submit(shared_stack, keys.caller, US, "us.do", {"n": 9})
    script = _submit(shared_stack, keys.caller, EU, "eu.do", {"note": SCRIPT})
    for t in [*eu, us, script]:
        assert t["status"] == "success", t
    return Tasks([t["task_id"] for t in eu], us["task_id"], script["task_id"])


@pytest.fixture
def admin(shared_stack: Stack, keys: Keys) -> Browser:
    browser = Browser(shared_stack.url)
    assert browser.login(keys.admin.secret).status_code == 303
    return browser


def _cookie_header(r: requests.Response) -> str:
    found = [v for k, v in r.raw.headers.items() if k.lower() == "set-cookie"]
    assert len(found) == 1, found
    return str(found[0])


def _rows(page: str, testid: str, attr: str) -> list[str]:
    return re.findall(rf'data-testid="{testid}"[^>]*?data-{attr}="([^"]*)"', page)


# -- entry, static files ---------------------------------------------------------------


def test_root_redirects_to_the_dashboard_and_it_to_the_sign_in(shared_stack: Stack) -> None:
    browser = Browser(shared_stack.url)
    r = browser.get("/")
    assert (r.status_code, r.headers["location"]) == (307, "/ui")
    r = browser.get("/ui/tasks?status=failed")
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/login?next=%2Fui%2Ftasks%3Fstatus%3Dfailed"
    r = browser.get("/ui/login")
    assert r.status_code == 200 and 'name="api_key"' in r.text
    # no CDN: every script and stylesheet is the hub's own
    assert re.findall(r'(?:src|href)="(https?:)?//', r.text) == []
    assert '<script src="/ui/static/htmx.min.js">' in r.text


def test_static_files_are_served_and_hold_htmx_and_its_sse_extension(shared_stack: Stack) -> None:
    browser = Browser(shared_stack.url)
    r = browser.get("/ui/static/htmx.min.js")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    assert "htmx 2.0.11" in r.text.splitlines()[0] and "Zero-Clause BSD" in r.text[:300]
    assert "var htmx=function()" in r.text
    r = browser.get("/ui/static/sse.min.js")
    assert r.status_code == 200 and 'htmx.defineExtension("sse"' in r.text
    r = browser.get("/ui/static/reach.css")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/css")
    assert browser.get("/ui/static/nope.js").status_code == 404
    assert browser.get("/ui/static/..%2Fsignin.py").status_code == 404


# -- sign-in ----------------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["admin", "viewer"])
def test_an_admin_or_viewer_key_signs_in_with_a_strict_http_only_cookie(
    shared_stack: Stack, keys: Keys, agents: list[TrustAgent], scope: str
) -> None:
    key: Key = getattr(keys, scope)
    browser = Browser(shared_stack.url)
    r = browser.login(key.secret, next_="/ui/tasks")
    assert (r.status_code, r.headers["location"]) == (303, "/ui/tasks")
    cookie = _cookie_header(r)
    assert cookie.startswith("reach_ui=")
    flags = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/ui"} <= flags
    assert "secure" not in flags  # plain http on loopback; https adds it
    assert key.secret not in cookie
    page = browser.get("/ui").text
    assert f"(key {key.key_id}, {scope})" in page
    assert key.secret not in page
    # the session is the cookie's, not the key's: no Authorization header was sent
    assert "Authorization" not in browser.http.headers


@pytest.mark.parametrize(
    ("which", "message"),
    [
        ("caller", "a caller key cannot sign in to the dashboard"),
        ("eu", "an agent key cannot sign in to the dashboard"),
        ("garbage", "malformed API key"),
        ("wrong", "invalid API key"),
    ],
)
def test_a_key_that_may_not_sign_in_is_refused_with_a_clear_message(
    shared_stack: Stack, keys: Keys, which: str, message: str
) -> None:
    secrets = {
        "caller": keys.caller.secret,
        "eu": keys.eu.secret,
        "garbage": "not-a-key",
        "wrong": keys.admin.secret[:-4] + "AAAA",
    }
    browser = Browser(shared_stack.url)
    r = browser.login(secrets[which])
    assert r.status_code == 401
    assert message in html.unescape(r.text)
    assert secrets[which] not in r.text
    assert browser.get("/ui").status_code == 303  # still not signed in


def test_a_revoked_keys_session_is_signed_out_at_once(
    shared_stack: Stack, shared_store_url: str
) -> None:
    key = make_key(shared_store_url, Scope.VIEWER)
    browser = Browser(shared_stack.url)
    assert browser.login(key.secret).status_code == 303
    assert browser.get("/ui").status_code == 200
    engine = create_engine_for(shared_store_url)
    try:
        with session_factory(engine).begin() as session:
            apikeys.revoke_key(session, key.key_id, time.time())
    finally:
        engine.dispose()
    r = browser.get("/ui")
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")
    assert browser.get("/ui/tasks").status_code == 303


def test_a_forged_or_edited_cookie_is_not_a_session(shared_stack: Stack, keys: Keys) -> None:
    browser = Browser(shared_stack.url)
    r = browser.login(keys.viewer.secret)
    value = _cookie_header(r).split(";")[0].split("=", 1)[1]
    payload, mac = value.split(".")
    admin_payload = payload  # same payload, mac of another: refused
    for forged in (f"{admin_payload}.{mac[:-2]}AA", f"{payload}x.{mac}", "garbage"):
        other = Browser(shared_stack.url)
        other.http.cookies.set("reach_ui", forged, path="/ui")
        assert other.get("/ui").status_code == 303, forged


def test_an_approver_signs_in_but_may_not_read_the_fleet(shared_stack: Stack, keys: Keys) -> None:
    browser = Browser(shared_stack.url)
    r = browser.login(keys.approver.secret)
    assert (r.status_code, r.headers["location"]) == (303, "/ui/approvals")
    for path in ("/ui", "/ui/tasks"):
        r = browser.get(path)
        assert r.status_code == 403, path
        assert "an approver key may not do this" in html.unescape(r.text)


# -- CSRF ---------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, "", "0" * 64])
def test_a_post_without_this_sessions_csrf_token_is_refused_and_changes_nothing(
    shared_stack: Stack, admin: Browser, token: str | None
) -> None:
    data = {} if token is None else {"csrf_token": token}
    r = admin.post("/ui/logout", data)
    assert r.status_code == 403
    assert "did not come from this dashboard" in r.text
    assert admin.get("/ui").status_code == 200  # still signed in
    # the sign-in form too: no session from a cross-site POST
    other = Browser(shared_stack.url)
    r = other.post("/ui/login", {"api_key": "x", **data})
    assert r.status_code == 403
    assert other.get("/ui").status_code == 303  # not signed in


def test_a_token_of_another_session_is_refused(shared_stack: Stack, keys: Keys) -> None:
    mine, theirs = Browser(shared_stack.url), Browser(shared_stack.url)
    assert mine.login(keys.admin.secret).status_code == 303
    assert theirs.login(keys.admin.secret).status_code == 303
    their_token = theirs.csrf("/ui")
    assert mine.post("/ui/logout", {"csrf_token": their_token}).status_code == 403
    assert mine.get("/ui").status_code == 200


def test_sign_out_with_the_token_ends_the_session(admin: Browser) -> None:
    token = admin.csrf("/ui")
    r = admin.post("/ui/logout", {"csrf_token": token})
    assert (r.status_code, r.headers["location"]) == (303, "/ui/login")
    assert "Max-Age=0" in _cookie_header(r) or "expires=" in _cookie_header(r).lower()
    assert admin.get("/ui").status_code == 303


# -- Fleet ----------------------------------------------------------------------------------


def test_the_fleet_lists_agents_registered_by_real_agents_and_filters_narrow_it(
    admin: Browser, agents: list[TrustAgent]
) -> None:
    page = admin.get("/ui").text
    assert {EU, US} <= set(_rows(page, "instance-row", "agent"))
    row = re.search(rf'data-agent="{EU}".*?</tr>', page, re.S)
    assert row is not None
    assert "online" in row.group(0) and "closed" in row.group(0)  # status, breaker
    assert "L2" in page  # trust level
    assert set(_rows(admin.get("/ui?tag=eu").text, "instance-row", "agent")) == {EU}
    assert set(_rows(admin.get("/ui?capability=us.do").text, "instance-row", "agent")) == {US}
    assert _rows(admin.get("/ui?tag=eu&capability=us.do").text, "instance-row", "agent") == []
    offline = admin.get("/ui?status=offline").text
    assert EU not in _rows(offline, "instance-row", "agent")
    bad = admin.get("/ui?status=bogus")
    assert bad.status_code == 200 and "unknown status" in html.unescape(bad.text)


def test_the_instance_page_shows_its_events_and_a_probe_chart(
    shared_stack: Stack, keys: Keys, admin: Browser, agents: list[TrustAgent]
) -> None:
    instance = api(shared_stack, "GET", f"/api/v1/agents/{EU}", keys.admin).json()["instances"]
    instance_id = next(i["instance_id"] for i in instance if i["status"] == "online")

    def probed() -> str | None:
        page = admin.get(f"/ui/instances/{instance_id}").text
        return page if 'data-testid="probe-chart"' in page else None

    page = wait_until(probed, timeout=20, what="a probe on the instance page")
    assert 'data-testid="instance-status">online' in page
    assert re.search(r'<path class="rtt" d="M[\d.]+ [\d.]+', page), page
    assert re.search(r'<path class="score" d="M[\d.]+ [\d.]+', page), page
    assert admin.get("/ui/instances/no-such-instance").status_code == 404


def test_an_instance_that_dies_shows_its_transition_and_failed_probes(
    shared_stack: Stack, keys: Keys, admin: Browser, tmp_path: Path
) -> None:
    gone_key = make_key(shared_stack.env["REACH_DATABASE_URL"], Scope.AGENT, "ui-gone")
    agent = TrustAgent(shared_stack.url, "ui-gone", gone_key, tmp_path, ["gone"], ["gone.do"])
    try:
        wait_until(lambda: online(shared_stack, keys.admin, "ui-gone"), 30, what="ui-gone online")
        found = api(shared_stack, "GET", "/api/v1/agents/ui-gone", keys.admin).json()
        instance_id = found["instances"][0]["instance_id"]
    finally:
        agent.proc.kill()  # no deregistration: the hub finds out by itself
        agent.proc.wait()

    def transitioned() -> str | None:
        page = admin.get(f"/ui/instances/{instance_id}").text
        failed = 'class="fail"' in page and 'data-testid="instance-event"' in page
        return page if failed else None

    page = wait_until(transitioned, timeout=30, what="a status event and a failed probe")
    events = re.findall(r'data-testid="instance-event"><td>[^<]*</td><td>([^<]*)</td>', page)
    assert "status" in events
    assert re.search(r'<path class="fail" d="M[\d.]+ [\d.]+ h0.01', page), page


# -- Tasks ------------------------------------------------------------------------------------


def test_the_task_list_filters_and_pages(admin: Browser, keys: Keys, tasks: Tasks) -> None:
    by_agent = _rows(admin.get(f"/ui/tasks?agent_id={EU}").text, "task-row", "task")
    assert set(tasks.eu) | {tasks.script} <= set(by_agent) and tasks.us not in by_agent
    by_cap = _rows(admin.get("/ui/tasks?capability=us.do").text, "task-row", "task")
    assert tasks.us in by_cap and not set(tasks.eu) & set(by_cap)
    caller = f"key:{keys.caller.key_id}"
    mine = _rows(admin.get(f"/ui/tasks?caller={caller}&status=success").text, "task-row", "task")
    assert set(tasks.eu) | {tasks.us, tasks.script} <= set(mine)
    assert _rows(admin.get("/ui/tasks?status=dead&capability=us.do").text, "task-row", "task") == []
    assert (
        _rows(admin.get("/ui/tasks?since=2000-01-01&until=2000-01-02").text, "task-row", "task")
        == []
    )
    # two per page, newest first, following "next page" until the last
    seen: list[str] = []
    path: str | None = f"/ui/tasks?agent_id={EU}&capability=eu.do&limit=2"
    while path is not None:
        page = admin.get(path).text
        rows = _rows(page, "task-row", "task")
        assert len(rows) <= 2
        seen += rows
        found = re.search(r'href="([^"]+)" data-testid="next-page"', page)
        path = html.unescape(found.group(1)) if found else None
    eu_tasks = [t for t in seen if t in set(tasks.eu)]
    assert eu_tasks == list(reversed(tasks.eu))  # newest first, none twice, none missing
    assert len(seen) == len(set(seen))
    bad = admin.get("/ui/tasks?cursor=forged&limit=2")
    assert bad.status_code == 200 and 'data-testid="tasks-error"' in bad.text
    assert "unknown" in admin.get("/ui/tasks?status=bogus").text


def test_the_task_page_shows_payload_result_attempts_and_audit(
    admin: Browser, keys: Keys, tasks: Tasks
) -> None:
    page = admin.get(f"/ui/tasks/{tasks.eu[0]}").text
    assert 'data-testid="task-status">success' in page
    assert 'data-testid="task-live"' not in page and "sse-connect" not in page  # terminal
    payload = re.search(r'data-testid="task-payload">(.*?)</pre>', page, re.S)
    assert payload and json.loads(html.unescape(payload.group(1))) == {"n": 0}
    result = re.search(r'data-testid="task-result">(.*?)</pre>', page, re.S)
    assert result and json.loads(html.unescape(result.group(1))) == {"by": EU, "method": "eu.do"}
    assert page.count('data-testid="attempt-row"') == 1
    assert 'data-testid="audit-event"' in page
    assert f"key:{keys.caller.key_id}" in page  # the submitter, in the trail
    assert admin.get("/ui/tasks/no-such-task").status_code == 404


def test_a_payload_with_a_script_is_shown_escaped(admin: Browser, tasks: Tasks) -> None:
    page = admin.get(f"/ui/tasks/{tasks.script}").text
    assert SCRIPT not in page and "alert('owned')" not in page
    assert "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;" in page
    listing = admin.get(f"/ui/tasks?agent_id={EU}").text
    assert SCRIPT not in listing


def _sse(r: requests.Response) -> Iterator[tuple[str, str]]:
    """(event, data) of each server-sent event of a streamed response."""
    event, data = "message", list[str]()
    for line in r.iter_lines(decode_unicode=True):
        if line == "":
            if data:
                yield event, "\n".join(data)
            elif event != "message":
                yield event, ""
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


def test_the_live_section_follows_a_running_task_to_its_end(
    shared_stack: Stack, keys: Keys, admin: Browser, agents: list[TrustAgent]
) -> None:
    body = {"agent_id": US, "method": "gated.do", "payload": {"live": True}}
    r = api(shared_stack, "POST", "/v1/tasks", keys.caller, body)
    assert r.status_code == 201 and r.json()["status"] == "awaiting_approval", r.text
    task_id = r.json()["task_id"]
    page = admin.get(f"/ui/tasks/{task_id}").text
    assert f'sse-connect="/ui/tasks/{task_id}/live"' in page and 'sse-close="done"' in page
    with admin.http.get(f"{admin.base}/ui/tasks/{task_id}/live", stream=True, timeout=60) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = _sse(stream)
        kind, first = next(events)
        assert kind == "update" and 'data-testid="task-status">awaiting_approval' in first
        approvals = api(shared_stack, "GET", "/api/v1/approvals?all=true&limit=500", keys.admin)
        approval = next(a for a in approvals.json()["approvals"] if a["task_id"] == task_id)
        decided = api(
            shared_stack,
            "POST",
            f"/api/v1/approvals/{approval['approval_id']}/approve",
            keys.approver,
            {"name": "Ann"},
        )
        assert decided.status_code == 200, decided.text
        updates = []
        for kind, data in events:
            if kind == "done":
                break
            assert kind == "update"
            updates.append(data)
    assert updates, "no update after the approval"
    final = updates[-1]
    assert 'data-testid="task-status">success' in final
    assert 'data-testid="task-live"' not in final
    assert 'data-testid="task-result"' in final


def test_the_live_endpoint_of_a_finished_task_sends_its_state_and_done(
    admin: Browser, tasks: Tasks
) -> None:
    with admin.http.get(f"{admin.base}/ui/tasks/{tasks.us}/live", stream=True, timeout=30) as r:
        events = list(_sse(r))
    assert [k for k, _ in events] == ["update", "done"]
    assert 'data-testid="task-status">success' in events[0][1]


def test_the_live_endpoint_needs_a_session(shared_stack: Stack, tasks: Tasks) -> None:
    r = Browser(shared_stack.url).get(f"/ui/tasks/{tasks.us}/live")
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")


def test_no_cookie_or_csrf_token_reaches_the_log(shared_stack: Stack, keys: Keys) -> None:
    browser = Browser(shared_stack.url)
    r = browser.login(keys.admin.secret)
    cookie = _cookie_header(r).split(";")[0].split("=", 1)[1]
    token = browser.csrf("/ui")
    assert browser.post("/ui/logout", {"csrf_token": "0" * 64}).status_code == 403
    log = (shared_stack.home / "api.log").read_text(errors="replace")
    for secret in (cookie, cookie.split(".")[1], token, keys.admin.secret):
        assert secret not in log


# -- an open hub ------------------------------------------------------------------------------


@pytest.fixture
def open_hub(tmp_path: Path) -> Iterator[str]:
    """``reach api`` on loopback without authentication (the ``reach up`` demo), SQLite."""
    store = f"sqlite:///{tmp_path / 'open.db'}"
    env = hub_env(store, tmp_path)
    migrate = HubProcess(["db", "upgrade"], env, tmp_path / "db.log")
    assert migrate.proc.wait(60) == 0, migrate.output()
    migrate.stop()
    port = free_port()
    proc = HubProcess(["api", "--port", str(port)], env, tmp_path / "api.log")
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def test_an_open_hub_shows_the_dashboard_without_sign_in_and_says_so(open_hub: str) -> None:
    browser = Browser(open_hub)
    r = browser.get("/ui")
    assert r.status_code == 200
    assert 'data-testid="open-hub"' in r.text and "anonymous (open hub)" in r.text
    assert browser.get("/ui/tasks").status_code == 200
    # its forms are CSRF-protected all the same
    assert browser.post("/ui/logout", {"csrf_token": "0" * 64}).status_code == 403
    assert browser.post("/ui/logout", {"csrf_token": browser.csrf("/ui")}).status_code == 303
