"""The dashboard in a real browser (headless chromium): sign in, the fleet, tasks live over
SSE, dead letters, approvals, and what a viewer may not do. One demo hub for the module."""

from __future__ import annotations

import re
from collections.abc import Callable

from playwright.sync_api import Dialog, Page, expect

from tests.browser.chromium import sign_in
from tests.browser.demo import DEMO_IDS, FLAKY, FLAKY_METHOD, SLOW, DemoHub
from tests.support.waiting import wait_until


def test_sign_in_with_a_wrong_key_shows_why_and_stays_signed_out(page: Page, demo: DemoHub) -> None:
    page.goto("/ui")
    expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    page.fill("#api_key", "rk_000000000000_not-a-real-secret-at-all")
    page.click("main button[type=submit]")
    expect(page.get_by_test_id("login-error")).to_be_visible()
    expect(page.get_by_test_id("identity")).to_have_count(0)
    page.goto("/ui")  # still signed out: back to the form
    expect(page).to_have_url(re.compile(r"/ui/login"))

    page.fill("#api_key", demo.caller.secret)  # a real key, but not one for the dashboard
    page.click("main button[type=submit]")
    expect(page.get_by_test_id("login-error")).to_contain_text("caller key cannot sign in")


def test_sign_in_and_out(page: Page, demo: DemoHub) -> None:
    sign_in(page, demo.admin.secret)
    expect(page.get_by_test_id("identity")).to_contain_text(f"key {demo.admin.key_id}, admin")
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/ui/login"))
    page.goto("/ui/tasks")
    expect(page).to_have_url(re.compile(r"/ui/login\?next=%2Fui%2Ftasks"))


def test_fleet_shows_the_demo_agents_and_leads_to_an_instance(page: Page, demo: DemoHub) -> None:
    sign_in(page, demo.viewer.secret)
    table = page.get_by_test_id("fleet-table")
    for agent_id in (*DEMO_IDS, SLOW, FLAKY):
        row = table.locator(f"[data-testid=instance-row][data-agent='{agent_id}']")
        expect(row).to_have_count(1)
        expect(row.locator(".pill.online")).to_have_text("online")  # its status pill
    sales = table.locator("[data-testid=instance-row][data-agent='sales-agent-01']")
    expect(sales).to_contain_text("orders.cancel")  # its capabilities are listed
    instance_id = sales.get_attribute("data-instance")
    sales.get_by_role("link", name=str(instance_id)).click()
    expect(page).to_have_url(re.compile(f"/ui/instances/{instance_id}$"))
    expect(page.get_by_test_id("instance-status")).to_have_text("online")
    expect(page.get_by_test_id("instance-facts")).to_contain_text("sales-agent-01")

    page.goto("/ui?capability=text.summarize")  # the fleet's own filter narrows it
    expect(table.locator("[data-testid=instance-row]")).to_have_count(1)
    expect(table.locator("[data-testid=instance-row]")).to_have_attribute(
        "data-agent", "summarizer-01"
    )


def test_filtering_tasks_narrows_the_list(page: Page, demo: DemoHub) -> None:
    ok = demo.submit(capability="sales.fetch", method="sales.fetch", payload={"region": "east"})
    bad = demo.submit(capability="sales.fetch", method="sales.fetch", payload={"region": "south"})
    summary = demo.submit(
        capability="text.summarize", method="text.summarize", payload={"text": "a b c"}
    )
    demo.wait_status(ok, "success")
    demo.wait_status(bad, "failed")
    demo.wait_status(summary, "success")
    sign_in(page, demo.viewer.secret, "/ui/tasks")
    rows = page.get_by_test_id("task-table").locator("[data-testid=task-row]")
    for task_id in (ok, bad, summary):
        expect(rows.and_(page.locator(f"[data-task='{task_id}']"))).to_have_count(1)

    filters = page.get_by_test_id("task-filters")
    filters.locator("select[name=status]").select_option("failed")
    filters.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"status=failed"))
    expect(rows.and_(page.locator(f"[data-task='{bad}']"))).to_have_count(1)
    expect(rows.and_(page.locator(f"[data-task='{ok}']"))).to_have_count(0)
    for status in rows.locator(".pill").all_inner_texts():
        assert status == "failed"

    filters.locator("select[name=status]").select_option("")
    filters.locator("input[name=agent_id]").fill("summarizer-01")
    filters.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"agent_id=summarizer-01"))
    expect(rows.and_(page.locator(f"[data-task='{summary}']"))).to_have_count(1)
    expect(rows.and_(page.locator(f"[data-task='{ok}']"))).to_have_count(0)
    assert set(rows.locator("td:nth-child(5)").all_inner_texts()) == {"summarizer-01"}

    filters.locator("input[name=agent_id]").fill("nobody-here")
    filters.get_by_role("button", name="Filter").click()
    expect(page.get_by_test_id("tasks-empty")).to_be_visible()


def test_a_task_page_follows_the_task_live_to_its_result(page: Page, demo: DemoHub) -> None:
    gate = demo.home / "gate-live"  # the agent holds the task after its first step until it exists
    task_id = demo.submit(
        agent_id=SLOW,
        method="work.do",
        payload={"steps": 3, "interval": 0.2, "gate_after": 1, "gate": str(gate)},
    )
    demo.wait_status(task_id, "executing")
    sign_in(page, demo.viewer.secret, f"/ui/tasks/{task_id}")
    status = page.get_by_test_id("task-status")
    expect(status).to_have_text("executing")
    expect(page.get_by_test_id("task-live")).to_be_visible()
    expect(page.get_by_test_id("task-progress")).to_contain_text("step 1")
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    gate.touch()
    expect(status).to_have_text("success")
    expect(page.get_by_test_id("task-result")).to_contain_text(f'"by": "{SLOW}"')
    expect(page.get_by_test_id("task-live")).to_have_count(0)
    assert page.evaluate("window.__sameDocument") is True  # followed live, never reloaded


def answer(asked: list[str], *, accept: bool) -> Callable[[Dialog], None]:
    """A handler for the page's confirm dialog: notes its question, accepts or dismisses."""

    def handle(dialog: Dialog) -> None:
        asked.append(dialog.message)
        if accept:
            dialog.accept()
        else:
            dialog.dismiss()

    return handle


def _dead_letter(demo: DemoHub, **payload: object) -> tuple[str, int]:
    """A task of the flaky agent, dead-lettered after its two failed attempts."""
    task_id = demo.submit(agent_id=FLAKY, method=FLAKY_METHOD, payload=payload)
    entry = wait_until(lambda: demo.dead_letter_of(task_id), 30, what=f"{task_id} dead-lettered")
    return task_id, int(entry["id"])


def test_replaying_a_dead_letter_asks_first_then_the_task_is_delivered(
    page: Page, demo: DemoHub
) -> None:
    task_id, dead_id = _dead_letter(demo, report="q1")
    sign_in(page, demo.admin.secret, "/ui/dead-letters")
    row = page.locator(f"[data-testid=dead-letter-row][data-dead-letter='{dead_id}']")
    expect(row).to_contain_text(task_id)
    expect(row).to_contain_text("1 retries exhausted")
    row.get_by_role("link", name=str(dead_id), exact=True).click()
    expect(page.get_by_test_id("replayed-at")).to_have_text("not yet")

    asked: list[str] = []
    page.once("dialog", answer(asked, accept=False))
    page.get_by_test_id("replay-one").click()  # cancelled: nothing is replayed
    expect(page.get_by_test_id("replay-one")).to_be_visible()
    assert asked == [f"Replay dead letter {dead_id}? Its task is delivered again."]
    assert (demo.dead_letter_of(task_id) or {}).get("replayed_at", "gone") is None

    page.once("dialog", answer(asked, accept=True))
    page.get_by_test_id("replay-one").click()
    outcome = page.locator(f"[data-testid=replay-outcome][data-dead-letter='{dead_id}']")
    expect(outcome).to_have_attribute("data-outcome", "replayed")
    expect(page.get_by_test_id("replayed-at")).not_to_have_text("not yet")
    expect(page.get_by_test_id("replay-one")).to_have_count(0)  # once only
    assert len(asked) == 2

    # the third delivery; a loaded CI box once took over 20 s to finish it (the hub's
    # timing, not the page's): wait for it through the API, whose timeout names the events
    demo.wait_status(task_id, "success", timeout=90)
    outcome.get_by_role("link", name=task_id).click()  # the task, delivered a third time
    expect(page).to_have_url(re.compile(f"/ui/tasks/{task_id}$"))
    expect(page.get_by_test_id("task-status")).to_have_text("success")
    expect(page.get_by_test_id("attempt-row")).to_have_count(3)


def test_replaying_many_dead_letters_at_once(page: Page, demo: DemoHub) -> None:
    first, first_id = _dead_letter(demo, report="q2")
    second, second_id = _dead_letter(demo, report="q3")
    sign_in(page, demo.admin.secret, "/ui/dead-letters")
    for dead_id in (first_id, second_id):
        page.get_by_label(f"select dead letter {dead_id}", exact=True).check()
    page.once("dialog", answer([], accept=True))
    page.get_by_test_id("replay-selected").click()
    expect(page.get_by_test_id("replay-outcomes")).to_contain_text("2 replayed, 0 refused.")
    for dead_id in (first_id, second_id):
        expect(
            page.locator(f"[data-testid=replay-outcome][data-dead-letter='{dead_id}']")
        ).to_have_attribute("data-outcome", "replayed")
    for task_id in (first, second):
        assert demo.wait_status(task_id, "success")["status"] == "success"


def test_a_viewer_sees_dead_letters_but_cannot_replay_them(page: Page, demo: DemoHub) -> None:
    task_id, dead_id = _dead_letter(demo, report="q4")
    sign_in(page, demo.viewer.secret, f"/ui/dead-letters/{dead_id}")
    expect(page.get_by_test_id("dead-letter-facts")).to_contain_text(task_id)
    expect(page.get_by_test_id("replay-one")).to_have_count(0)
    page.goto("/ui/dead-letters")
    expect(
        page.locator(f"[data-testid=dead-letter-row][data-dead-letter='{dead_id}']")
    ).to_be_visible()
    expect(page.get_by_test_id("replay-selected")).to_have_count(0)
    expect(page.locator("input[name=ids]")).to_have_count(0)

    # the form is not there, and posting it anyway (with this session's CSRF token) is refused
    token = page.locator("input[name=csrf_token]").first.get_attribute("value")
    refused = page.request.post(
        f"/ui/dead-letters/{dead_id}/replay", form={"csrf_token": str(token), "confirmed": "1"}
    )
    assert refused.status == 403
    assert "viewer key may not do this" in refused.text()
    assert (demo.dead_letter_of(task_id) or {}).get("replayed_at", "gone") is None


def _parked(demo: DemoHub, order_id: str) -> tuple[str, str]:
    """An ``orders.cancel`` of the demo's sales agent, parked for a human: (task, approval)."""
    task_id = demo.submit(
        capability="orders.cancel", method="orders.cancel", payload={"order_id": order_id}
    )
    demo.wait_status(task_id, "awaiting_approval")
    approval = wait_until(lambda: demo.approval_of(task_id), 30, what=f"{task_id} approval")
    return task_id, str(approval["approval_id"])


def test_approving_a_parked_task_delivers_it(page: Page, demo: DemoHub) -> None:
    task_id, approval_id = _parked(demo, "A-7")
    sign_in(page, demo.admin.secret, "/ui/approvals")
    row = page.locator(f"[data-testid=approval-row][data-approval='{approval_id}']")
    expect(row).to_have_attribute("data-status", "pending")
    expect(row).to_contain_text(task_id)
    expect(row).to_contain_text("orders.cancel")
    # the form names who decides: the signed-in key, not a name one could type
    expect(row.get_by_test_id("decider")).to_have_text("as ops-admin")
    row.get_by_test_id("approve").click()
    expect(page.get_by_test_id("page-message")).to_have_text(
        f"Approved: task {task_id} is delivered now."
    )
    assert demo.wait_status(task_id, "success")["result"] == {
        "order_id": "A-7",
        "status": "cancelled",
    }
    page.goto(f"/ui/approvals/{approval_id}")
    expect(page.get_by_test_id("approval-status")).to_have_text("approved")
    # the decision names the deciding key's own name, whatever the form said (issue 37)
    expect(page.get_by_test_id("decided-by")).to_contain_text(f"key:{demo.admin.key_id} (")
    expect(page.get_by_test_id("approval-actions")).to_have_count(0)
    page.get_by_role("link", name=task_id).click()
    expect(page.get_by_test_id("task-status")).to_have_text("success")
    expect(page.get_by_test_id("task-result")).to_contain_text('"status": "cancelled"')


def test_rejecting_needs_a_reason_and_the_task_is_never_delivered(
    page: Page, demo: DemoHub
) -> None:
    task_id, approval_id = _parked(demo, "A-8")
    sign_in(page, demo.admin.secret, f"/ui/approvals/{approval_id}")
    page.get_by_test_id("reject").click()  # no reason: the browser keeps the form
    expect(page.get_by_test_id("approval-status")).to_have_text("pending")
    page.get_by_label("reason for rejecting").fill("not during the sale")
    page.get_by_test_id("reject").click()
    expect(page.get_by_test_id("approval-status")).to_have_text("rejected")
    expect(page.get_by_test_id("decision-reason")).to_have_text("not during the sale")
    task = demo.task(task_id)  # failed with who and why; its agent was never called
    assert task["status"] == "failed" and task["error"]["kind"] == "approval_rejected"
    page.get_by_role("link", name=task_id).click()
    expect(page.get_by_test_id("task-status")).to_have_text("failed")
    expect(page.get_by_test_id("task-error")).to_contain_text("not during the sale")


def test_a_viewer_sees_approvals_without_the_buttons(page: Page, demo: DemoHub) -> None:
    task_id, approval_id = _parked(demo, "A-9")
    sign_in(page, demo.viewer.secret, "/ui/approvals")
    row = page.locator(f"[data-testid=approval-row][data-approval='{approval_id}']")
    expect(row).to_contain_text(task_id)
    expect(page.get_by_test_id("approval-actions")).to_have_count(0)
    token = page.locator("input[name=csrf_token]").first.get_attribute("value")
    refused = page.request.post(
        f"/ui/approvals/{approval_id}/approve", form={"csrf_token": str(token)}
    )
    assert refused.status == 403
    assert demo.task(task_id)["status"] == "awaiting_approval"


def test_pages_run_htmx_within_their_content_security_policy(page: Page, demo: DemoHub) -> None:
    """The policy (reach.hub.api.ui.pages.CSP) blocks nothing a page uses: htmx and its SSE
    extension load from /ui/static, and no page trips a violation (issue 37, item 20)."""
    violations: list[str] = []
    page.on(
        "console",
        lambda msg: violations.append(msg.text) if "Content Security Policy" in msg.text else None,
    )
    sign_in(page, demo.admin.secret)
    instance = page.locator("[data-testid=instance-row]").first.get_attribute("data-instance")
    lists = ("/ui", "/ui/tasks", "/ui/dag-runs", "/ui/dead-letters", "/ui/approvals", "/ui/alerts")
    for path in (*lists, f"/ui/instances/{instance}"):
        page.goto(path)
        assert page.evaluate("typeof htmx === 'object' && htmx.config.allowEval === false"), path
        assert page.evaluate("htmx.config.includeIndicatorStyles === false"), path
    assert violations == []
