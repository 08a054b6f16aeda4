"""The dashboard's operations pages -- DAG runs, dead letters, approvals, alerts -- through
real processes (api, worker, beat, counting agents with their own keys) on SQLite and
PostgreSQL, with ``REACH_SECURITY__REQUIRE_AUTH=true``.

Each page shows real data: a DAG run the stack ran (its graph drawn, a parked node
``awaiting_approval``, the live part polling until the run ends), dead letters of an
agent that fails its first deliveries, tasks parked for approval, an agent's instance
that went away. Every action goes through the UI's POST with the session's CSRF token,
and its effect is counted at the agent: a replayed task is delivered again, an approved
one exactly once, a rejected one never. A viewer may not act, a POST without the token is
refused, every refusal is a message on the page, and none of them changes the store.

A browser is played by a `requests.Session` (cookies kept, redirects not followed); the
real-browser checks are tests/browser's.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import MetaData, select, update

from reach.core.security.auth import Scope
from reach.hub.storage import create_engine_for
from tests.support.counting_agent import CountingAgentProcess
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.trust_agents import Key, api, make_key
from tests.support.waiting import wait_until

STACK_SETTINGS = {
    "REACH_SECURITY__REQUIRE_AUTH": "true",
    "REACH_APPROVAL__TIMEOUT_S": "600",
    "REACH_ROUTER__MAX_RETRY": "1",
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "1",
    "REACH_ROUTER__BREAKER_MIN_VOLUME": "0",  # the flaky agent's failures must not open it
}
DANGER = "ui-danger"  # orders.cancel, require_approval
FLAKY = "ui-flaky"  # work.do, fails the first two deliveries of every task
WORKER = "ui-dag"  # work.do
GONE = "ui-gone"  # started, then killed: its instance's alerts
SCRIPT = "<script>alert('owned')</script>"
TOKEN = re.compile(r'name="csrf_token" value="([0-9a-f]*)"')
WATCHED = [
    "approvals",
    "dag_node_runs",
    "dag_runs",
    "dead_letters",
    "outbox",
    "task_events",
    "tasks",
]


@dataclass(frozen=True)
class Keys:
    admin: Key
    viewer: Key
    approver: Key
    other_approver: Key
    caller: Key


@dataclass
class Agents:
    danger: CountingAgentProcess
    flaky: CountingAgentProcess
    worker: CountingAgentProcess


class Browser:
    """A cookie-keeping client of the dashboard that never follows redirects."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http = requests.Session()

    def get(self, path: str) -> requests.Response:
        return self.http.get(self.base + path, allow_redirects=False, timeout=30)

    def post(
        self, path: str, data: dict[str, Any] | list[tuple[str, str]], *, csrf: bool = True
    ) -> requests.Response:
        """POST a form; with ``csrf``, this session's token is added (read from a page)."""
        fields = list(data.items()) if isinstance(data, dict) else list(data)
        if csrf:
            fields.append(("csrf_token", self.csrf("/ui/approvals")))
        return self.http.post(self.base + path, data=fields, allow_redirects=False, timeout=60)

    def csrf(self, path: str = "/ui/login") -> str:
        r = self.get(path)
        found = TOKEN.search(r.text)
        assert found and found.group(1), r.text
        return found.group(1)

    def login(self, key: Key) -> Browser:
        token = self.csrf()
        r = self.http.post(
            self.base + "/ui/login",
            data={"api_key": key.secret, "csrf_token": token, "next": "/ui"},
            allow_redirects=False,
            timeout=30,
        )
        assert r.status_code == 303, r.text
        return self


@pytest.fixture(scope="module")
def keys(shared_stack: Stack, shared_store_url: str) -> Keys:
    return Keys(
        admin=make_key(shared_store_url, Scope.ADMIN),
        viewer=make_key(shared_store_url, Scope.VIEWER),
        approver=make_key(shared_store_url, Scope.APPROVER),
        other_approver=make_key(shared_store_url, Scope.APPROVER),
        caller=make_key(shared_store_url, Scope.CALLER),
    )


def _agent(
    stack: Stack, store_url: str, directory: Path, agent_id: str, method: str, *flags: str
) -> CountingAgentProcess:
    key = make_key(store_url, Scope.AGENT, agent_id)
    env = {k: v for k, v in stack.env.items() if not k.startswith("REACH_")}
    env["REACH_API_KEY"] = key.secret
    return CountingAgentProcess(
        stack.url, directory / f"{agent_id}.journal", free_port(),
        "--agent-id", agent_id, "--method", method, *flags, env=env,
    )  # fmt: skip


def _online(stack: Stack, admin: Key, agent_id: str) -> bool:
    r = api(stack, "GET", f"/api/v1/agents/{agent_id}", admin)
    return r.ok and any(i["status"] == "online" for i in r.json()["instances"])


@pytest.fixture(scope="module")
def agents(
    shared_stack: Stack, shared_store_url: str, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Agents]:
    directory = tmp_path_factory.mktemp("ui-ops-agents")
    started = Agents(
        danger=_agent(
            shared_stack, shared_store_url, directory, DANGER, "orders.cancel", "--require-approval"
        ),
        flaky=_agent(
            shared_stack, shared_store_url, directory, FLAKY, "work.do", "--fail-first", "2"
        ),
        worker=_agent(shared_stack, shared_store_url, directory, WORKER, "work.do"),
    )
    try:
        for agent_id in (DANGER, FLAKY, WORKER):
            wait_until(
                lambda a=agent_id: _online(shared_stack, keys.admin, a),
                30,
                what=f"{agent_id} online",
            )
        yield started
    finally:
        for agent in (started.danger, started.flaky, started.worker):
            agent.stop()


def _store(stack: Stack) -> dict[str, list[tuple[Any, ...]]]:
    """The rows an action on these pages could change (audit_log left out: a refused
    request is audited)."""
    engine = create_engine_for(stack.env["REACH_DATABASE_URL"])
    try:
        meta = MetaData()
        meta.reflect(engine, only=WATCHED)
        with engine.connect() as conn:
            return {
                name: sorted((tuple(r) for r in conn.execute(select(t))), key=repr)
                for name, t in sorted(meta.tables.items())
            }
    finally:
        engine.dispose()


def _submit(stack: Stack, key: Key, agent_id: str, method: str, payload: Any) -> str:
    body = {"agent_id": agent_id, "method": method, "payload": payload}
    r = api(stack, "POST", "/v1/tasks", key, body)
    assert r.status_code == 201, r.text
    return str(r.json()["task_id"])


def _task(stack: Stack, keys: Keys, task_id: str) -> dict[str, Any]:
    r = api(stack, "GET", f"/v1/tasks/{task_id}", keys.admin)
    assert r.ok, r.text
    return dict(r.json())


def _settled(stack: Stack, keys: Keys, task_id: str, status: str) -> None:
    wait_until(
        lambda: _task(stack, keys, task_id)["status"] == status, 40, what=f"{task_id} {status}"
    )


def _approval_of(stack: Stack, keys: Keys, task_id: str) -> str:
    def found() -> str | None:
        r = api(stack, "GET", "/api/v1/approvals?all=true&limit=500", keys.admin)
        ids = [a["approval_id"] for a in r.json()["approvals"] if a["task_id"] == task_id]
        return ids[0] if ids else None

    return str(wait_until(found, 20, what=f"approval of {task_id}"))


def _testids(page: str, testid: str) -> list[str]:
    """The text of every element carrying ``data-testid="<testid>"`` (tags stripped)."""
    pattern = rf'data-testid="{testid}"[^>]*>(.*?)</'
    return [
        html.unescape(re.sub(r"<[^>]+>", "", m)).strip() for m in re.findall(pattern, page, re.S)
    ]


def _error_of(page: str) -> str:
    found = _testids(page, "page-error") or _testids(page, "error-detail")
    assert found, page
    return found[0]


# -- DAG runs ---------------------------------------------------------------------------


def _dag(name: str) -> dict[str, Any]:
    def node(node_id: str, deps: list[str], **extra: Any) -> dict[str, Any]:
        return {
            "id": node_id, "agent_id": WORKER, "method": "work.do", "dependencies": deps,
            "payload": {"node": node_id}, **extra,
        }  # fmt: skip

    return {
        "name": name,
        "nodes": [
            node("fetch", []),
            node("cancel", ["fetch"], agent_id=DANGER, method="orders.cancel"),
            node("report", ["cancel"]),
            node("on_failure", ["cancel"], condition='cancel.status == "failed"'),
        ],
    }


def test_a_dag_run_page_draws_the_graph_and_follows_the_run_live(
    shared_stack: Stack, keys: Keys, agents: Agents
) -> None:
    name = f"<b>orders & {SCRIPT}</b>"
    r = api(shared_stack, "POST", "/api/v1/dag-runs", keys.caller, {"dag": _dag(name)})
    assert r.status_code == 201, r.text
    run_id = r.json()["run_id"]
    cancel_task = f"{run_id}.cancel"

    def parked() -> bool:
        r = api(shared_stack, "GET", f"/v1/tasks/{cancel_task}", keys.admin)
        return r.ok and r.json()["status"] == "awaiting_approval"

    wait_until(parked, 40, what="the cancel node parked")
    viewer = Browser(shared_stack.url).login(keys.viewer)

    listing = viewer.get("/ui/dag-runs")
    assert listing.status_code == 200
    assert f'data-run="{run_id}"' in listing.text
    assert SCRIPT not in listing.text and "<b>orders" not in listing.text  # escaped
    assert "&lt;b&gt;orders &amp; &lt;script&gt;alert(" in listing.text
    only_failed = viewer.get("/ui/dag-runs?status=failed")
    assert f'data-run="{run_id}"' not in only_failed.text
    bad = viewer.get("/ui/dag-runs?status=bogus")
    assert "unknown status" in _error_of(bad.text)

    page = viewer.get(f"/ui/dag-runs/{run_id}")
    assert page.status_code == 200, page.text
    assert SCRIPT not in page.text
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="dag-graph"' in page.text
    states = dict(re.findall(r'data-node="(\w+)" data-state="(\w+)"', page.text))
    assert states == {
        "fetch": "success", "cancel": "awaiting_approval", "report": "pending",
        "on_failure": "pending",
    }  # fmt: skip
    # the graph: a box per node coloured by its state, each dependency an arrow
    assert re.search(
        r'data-node="cancel" data-state="awaiting_approval">.*?fill="#fef3c7"', page.text
    )
    edges = set(re.findall(r'data-from="(\w+)" data-to="(\w+)"', page.text))
    assert edges == {("fetch", "cancel"), ("cancel", "report"), ("cancel", "on_failure")}
    assert f'href="/ui/tasks/{run_id}.fetch"' in page.text  # a node with a task links to it
    live = f'hx-get="/ui/dag-runs/{run_id}/live" hx-trigger="every 1s"'
    assert live in page.text

    fragment = viewer.get(f"/ui/dag-runs/{run_id}/live")
    assert fragment.status_code == 200
    assert fragment.text.lstrip().startswith('<section id="dag-run-live"')
    assert live in fragment.text and "<html" not in fragment.text

    approver = Browser(shared_stack.url).login(keys.approver)
    approval_id = _approval_of(shared_stack, keys, cancel_task)
    done = approver.post(f"/ui/approvals/{approval_id}/approve", {"back": "detail"})
    assert done.status_code == 200, done.text

    def finished() -> str | None:
        text = viewer.get(f"/ui/dag-runs/{run_id}/live").text
        return text if 'data-status="success"' in text else None

    final = str(wait_until(finished, 40, interval=0.5, what=f"run {run_id} over"))
    assert "hx-trigger" not in final  # the run ended: the fragment stops polling
    states = dict(re.findall(r'data-node="(\w+)" data-state="(\w+)"', final))
    assert states == {
        "fetch": "success", "cancel": "success", "report": "success", "on_failure": "skipped",
    }  # fmt: skip
    assert agents.danger.counts().deliveries[cancel_task] == 1

    assert viewer.get("/ui/dag-runs/dag-nope").status_code == 404
    signed_out = Browser(shared_stack.url).get(f"/ui/dag-runs/{run_id}")
    assert signed_out.status_code == 303
    assert signed_out.headers["location"].startswith("/ui/login")


# -- dead letters -----------------------------------------------------------------------


def _dead_letters(stack: Stack, keys: Keys, tasks: list[str]) -> list[int]:
    def found() -> list[int] | None:
        rows = api(stack, "GET", "/api/v1/dead-letters?include_replayed=true", keys.admin)
        by_task = {d["task_id"]: d["id"] for d in rows.json()["dead_letters"]}
        return [by_task[t] for t in tasks] if all(t in by_task for t in tasks) else None

    return list(wait_until(found, 60, what="dead letters"))


def test_dead_letters_are_listed_and_replayed_one_or_many_through_the_ui(
    shared_stack: Stack, keys: Keys, agents: Agents
) -> None:
    tasks = [
        _submit(shared_stack, keys.caller, FLAKY, "work.do", {"n": n, "note": SCRIPT})
        for n in range(3)
    ]
    first, second, third = _dead_letters(shared_stack, keys, tasks)
    for task_id in tasks:
        _settled(shared_stack, keys, task_id, "dead")
    assert all(agents.flaky.counts().deliveries[t] == 2 for t in tasks)  # 1 + max_retry

    viewer = Browser(shared_stack.url).login(keys.viewer)
    page = viewer.get("/ui/dead-letters")
    assert page.status_code == 200
    for dead_id in (first, second, third):
        assert f'data-dead-letter="{dead_id}"' in page.text
    assert 'name="ids"' not in page.text and "replay-selected" not in page.text  # no buttons
    detail = viewer.get(f"/ui/dead-letters/{first}")
    assert detail.status_code == 200 and tasks[0] in detail.text
    assert SCRIPT not in detail.text and "&lt;script&gt;alert(" in detail.text
    assert "replay-one" not in detail.text

    admin = Browser(shared_stack.url).login(keys.admin)
    many = [("ids", str(first)), ("ids", str(second)), ("confirmed", "1")]
    before = _store(shared_stack)
    refused = viewer.post("/ui/dead-letters/replay", many)
    assert refused.status_code == 403  # a viewer, with its own valid token
    no_token = admin.post("/ui/dead-letters/replay", many, csrf=False)
    assert no_token.status_code == 403
    assert "did not come from this dashboard" in _error_of(no_token.text)
    wrong = admin.post("/ui/dead-letters/replay", [*many, ("csrf_token", "0" * 64)], csrf=False)
    assert wrong.status_code == 403
    unconfirmed = admin.post("/ui/dead-letters/replay", many[:2])
    assert unconfirmed.status_code == 200 and 'data-testid="confirm-replay"' in unconfirmed.text
    nothing = admin.post("/ui/dead-letters/replay", {"confirmed": "1"})
    assert nothing.status_code == 422 and "select at least one" in _error_of(nothing.text)
    time.sleep(0.5)
    assert _store(shared_stack) == before
    assert all(agents.flaky.counts().deliveries[t] == 2 for t in tasks)

    done = admin.post("/ui/dead-letters/replay", [*many, ("ids", "2000000000")])
    assert done.status_code == 200, done.text
    outcomes = dict(re.findall(r'data-dead-letter="(\d+)" data-outcome="(\w+)"', done.text))
    assert outcomes == {str(first): "replayed", str(second): "replayed", "2000000000": "refused"}
    assert "2 replayed, 1 refused" in done.text
    for task_id in tasks[:2]:
        _settled(shared_stack, keys, task_id, "success")
    wait_until(lambda: agents.flaky.counts().deliveries[tasks[1]] == 3, 10, what="redelivered")
    counts = agents.flaky.counts().deliveries
    assert [counts[t] for t in tasks] == [3, 3, 2]  # delivered again once each; not the third

    before = _store(shared_stack)
    again = admin.post(f"/ui/dead-letters/{first}/replay", {"confirmed": "1"})
    assert again.status_code == 409
    assert f"dead letter {first} was already replayed" in again.text
    assert _store(shared_stack) == before

    ask = admin.post(f"/ui/dead-letters/{third}/replay", {})
    assert 'data-testid="confirm-replay"' in ask.text  # the no-JavaScript confirmation
    one = admin.post(f"/ui/dead-letters/{third}/replay", {"confirmed": "1"})
    assert one.status_code == 200, one.text
    assert re.search(rf'data-dead-letter="{third}" data-outcome="replayed"', one.text)
    _settled(shared_stack, keys, tasks[2], "success")
    assert agents.flaky.counts().deliveries[tasks[2]] == 3
    waiting = admin.get("/ui/dead-letters").text
    assert not any(f'data-dead-letter="{d}"' in waiting for d in (first, second, third))
    assert f'data-dead-letter="{third}"' in admin.get("/ui/dead-letters?show=all").text
    events = api(shared_stack, "GET", f"/v1/tasks/{tasks[2]}/events", keys.admin).json()
    replayed = [e for e in events["events"] if e["kind"] == "replayed"]
    assert len(replayed) == 1
    assert admin.get("/ui/dead-letters/2000000000").status_code == 404


# -- approvals --------------------------------------------------------------------------


def test_approve_and_reject_through_the_ui_deliver_once_or_never(
    shared_stack: Stack, keys: Keys, agents: Agents
) -> None:
    approved_task = _submit(shared_stack, keys.caller, DANGER, "orders.cancel", {"order": 1})
    rejected_task = _submit(shared_stack, keys.caller, DANGER, "orders.cancel", {"order": 2})
    to_approve = _approval_of(shared_stack, keys, approved_task)
    to_reject = _approval_of(shared_stack, keys, rejected_task)

    viewer = Browser(shared_stack.url).login(keys.viewer)
    approver = Browser(shared_stack.url).login(keys.approver)
    listing = viewer.get("/ui/approvals")
    assert listing.status_code == 200
    assert f'data-approval="{to_approve}" data-status="pending"' in listing.text
    assert 'data-testid="approve"' not in listing.text  # a viewer sees no decision buttons
    assert 'data-testid="approve"' in approver.get("/ui/approvals").text

    before = _store(shared_stack)
    assert viewer.post(f"/ui/approvals/{to_approve}/approve", {}).status_code == 403
    no_token = approver.post(f"/ui/approvals/{to_approve}/approve", {}, csrf=False)
    assert no_token.status_code == 403
    blank = approver.post(f"/ui/approvals/{to_reject}/reject", {"reason": "   "})
    assert blank.status_code == 422
    assert "needs a reason" in _error_of(blank.text)
    time.sleep(1.0)
    assert _store(shared_stack) == before
    assert agents.danger.counts().deliveries[approved_task] == 0

    done = approver.post(
        f"/ui/approvals/{to_approve}/approve", {"name": "Ann", "back": "list", "status": "pending"}
    )
    assert done.status_code == 200, done.text
    assert "Approved" in _testids(done.text, "page-message")[0]
    assert f'data-approval="{to_approve}"' not in done.text  # no longer pending
    _settled(shared_stack, keys, approved_task, "success")
    wait_until(lambda: agents.danger.counts().deliveries[approved_task] == 1, 10, what="delivered")
    detail = viewer.get(f"/ui/approvals/{to_approve}").text
    assert _testids(detail, "approval-status") == ["approved"]
    assert _testids(detail, "decided-by") == [f"{keys.approver.identity} (trust-test-approver)"]

    reason = f"not today {SCRIPT}"
    no = approver.post(f"/ui/approvals/{to_reject}/reject", {"reason": reason})
    assert no.status_code == 200, no.text
    assert SCRIPT not in no.text and _testids(no.text, "decision-reason") == [reason]
    _settled(shared_stack, keys, rejected_task, "failed")
    assert _task(shared_stack, keys, rejected_task)["error"]["kind"] == "approval_rejected"

    before = _store(shared_stack)
    other = Browser(shared_stack.url).login(keys.other_approver)
    twice = other.post(f"/ui/approvals/{to_approve}/approve", {})
    assert twice.status_code == 409
    assert "was already approved" in _error_of(twice.text)
    late = other.post(f"/ui/approvals/{to_reject}/reject", {"reason": "me too"})
    assert late.status_code == 409 and "already rejected" in _error_of(late.text)
    time.sleep(1.0)
    assert _store(shared_stack) == before
    counts = agents.danger.counts().deliveries
    assert (counts[approved_task], counts[rejected_task]) == (1, 0)
    assert approver.get("/ui/approvals/ap-nope").status_code == 404


def test_self_approval_and_expiry_are_refused_on_the_page(
    shared_stack: Stack, keys: Keys, agents: Agents
) -> None:
    own = _submit(shared_stack, keys.admin, DANGER, "orders.cancel", {"order": "own"})
    own_approval = _approval_of(shared_stack, keys, own)
    admin = Browser(shared_stack.url).login(keys.admin)
    before = _store(shared_stack)
    refused = admin.post(f"/ui/approvals/{own_approval}/approve", {})
    assert refused.status_code == 403
    assert "may not decide it" in _error_of(refused.text)
    assert _store(shared_stack) == before
    assert agents.danger.counts().deliveries[own] == 0

    stale = _submit(shared_stack, keys.caller, DANGER, "orders.cancel", {"order": "stale"})
    stale_approval = _approval_of(shared_stack, keys, stale)
    engine = create_engine_for(shared_stack.env["REACH_DATABASE_URL"])
    try:
        meta = MetaData()
        meta.reflect(engine, only=["approvals"])
        approvals = meta.tables["approvals"]
        with engine.begin() as conn:  # its time ran out (the beat may expire it any moment)
            conn.execute(
                update(approvals)
                .where(approvals.c.approval_id == stale_approval)
                .values(expires_at=time.time() - 1)
            )
    finally:
        engine.dispose()
    approver = Browser(shared_stack.url).login(keys.approver)
    late = approver.post(f"/ui/approvals/{stale_approval}/approve", {})
    assert late.status_code == 410
    assert "expired" in _error_of(late.text)
    _settled(shared_stack, keys, stale, "failed")
    time.sleep(0.5)
    assert agents.danger.counts().deliveries[stale] == 0

    # someone else may approve the admin's own request
    fine = approver.post(f"/ui/approvals/{own_approval}/approve", {})
    assert fine.status_code == 200, fine.text
    _settled(shared_stack, keys, own, "success")
    assert agents.danger.counts().deliveries[own] == 1


# -- alerts -----------------------------------------------------------------------------


def test_the_alerts_page_shows_an_instance_that_went_away(
    shared_stack: Stack, shared_store_url: str, keys: Keys, tmp_path: Path
) -> None:
    gone = _agent(shared_stack, shared_store_url, tmp_path, GONE, "work.do")
    try:
        wait_until(lambda: _online(shared_stack, keys.admin, GONE), 30, what=f"{GONE} online")
    finally:
        gone.kill()

    def alerted() -> list[dict[str, Any]]:
        r = api(shared_stack, "GET", "/api/v1/alerts?kind=offline&kind=unreachable", keys.admin)
        return [a for a in r.json()["items"] if a["agent_id"] == GONE]

    found = wait_until(alerted, 40, what=f"an alert for {GONE}")
    viewer = Browser(shared_stack.url).login(keys.viewer)
    page = viewer.get("/ui/alerts")
    assert page.status_code == 200
    summaries = _testids(page.text, "alert-summary")
    assert any(s == found[0]["summary"] for s in summaries), summaries
    kind = found[0]["kind"]
    only = viewer.get(f"/ui/alerts?kind={kind}").text
    kinds = set(re.findall(r'data-testid="alert-row" data-kind="(\w+)"', only))
    assert kinds == {kind}
    bad = viewer.get("/ui/alerts?kind=bogus")
    assert "unknown kind" in _error_of(bad.text)
    assert 'data-testid="no-alerts"' in viewer.get("/ui/alerts?kind=backpressure").text
    approver = Browser(shared_stack.url).login(keys.approver)
    assert approver.get("/ui/alerts").status_code == 403  # alerts are the fleet's
